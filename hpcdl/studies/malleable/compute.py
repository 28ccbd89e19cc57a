"""One point: run it in a driver (hpcdl.studies.malleable.driver) and turn what it logged into tidy rows.

A change's numbers, measured across the requesting process and the job:
    lag_iters     iterations that started after the request but still ran with the old thread
                  count (0: the change took effect at the first boundary, within one iteration)
    latency_s     request -> applied (the rest of the iteration in progress, plus the boundary)
    first_iter_s  the first iteration with the new count; steady_iter_s: the median of the
                  following ones in the same phase (their ratio: the cost of a change)
"""

from __future__ import annotations

import statistics

from hpcdl.studies.malleable import driver
from hpcdl.studies.malleable.sweep import labels

STEADY_SKIP = 2  # iterations after a change left out of the steady median
STEADY_MAX = 6  # iterations in the steady median at most


def _series_rows(lab: dict, series: list[dict]) -> list[dict]:
    return [
        {
            **lab,
            "job": str(s["job"]),
            "iteration": int(s["iteration"]),
            "start_s": s["start"],
            "iter_s": s["iter_s"],
            "cpu_s": s["cpu_s"],
            "threads_run": int(s["threads"]),
            "quota_cores_seen": s["quota_cores"],
        }
        for s in series
    ]


def change_rows(lab: dict, result: dict) -> list[dict]:
    """Each request matched with the change it caused (or marked superseded / not applied)."""
    by_job: dict[str, list[dict]] = {}
    for s in result["series"]:
        by_job.setdefault(str(s["job"]), []).append(s)
    rows = []
    reqs = sorted(result["requests"], key=lambda r: r["time"])
    for i, req in enumerate(reqs):
        job = str(req["job"])
        series = sorted(by_job.get(job, []), key=lambda s: s["iteration"])
        applied = [a for a in result["applied"] if str(a["job"]) == job and a["applied"] >= req["time"]]
        applied = min(applied, key=lambda a: a["applied"], default=None)
        later = [r for r in reqs[i + 1 :] if str(r["job"]) == job]
        row = {
            **lab,
            "job": job,
            "source": req["source"],
            "target_threads": int(req["target"]),
            "requested_s": req["time"],
        }
        if applied is not None and later and later[0]["time"] < applied["applied"]:
            rows.append({**row, "outcome": "superseded"})
            continue
        if applied is None or int(applied["threads"]) != int(req["target"]):
            rows.append({**row, "outcome": "not applied"})
            continue
        k = int(applied["iteration"])
        nxt = min(
            [
                int(a["iteration"])
                for a in result["applied"]
                if str(a["job"]) == job and int(a["iteration"]) > k
            ]
            or [10**9]
        )
        after = [
            s["iter_s"]
            for s in series
            if k + STEADY_SKIP <= s["iteration"] < min(nxt, k + STEADY_SKIP + STEADY_MAX)
        ]
        first = next((s["iter_s"] for s in series if s["iteration"] == k), None)
        before = next((s["iter_s"] for s in series if s["iteration"] == k - 1), None)
        rows.append(
            {
                **row,
                "outcome": "applied",
                "applied_iteration": k,
                "old_threads": int(applied["old"]),
                "lag_iters": sum(1 for s in series if s["start"] > req["time"] and s["iteration"] < k),
                "latency_s": applied["applied"] - req["time"],
                "inprogress_iter_s": before,
                "first_iter_s": first,
                "steady_iter_s": statistics.median(after) if after else None,
                "set_call_s": applied["set_call_s"],
            }
        )
    return rows


def _cosched_summary(jobs: list[dict]) -> dict:
    ok = [j for j in jobs if j["status"] == "ok"]
    ends = [j["finished_s"] for j in jobs if j["finished_s"] is not None]
    return {
        "makespan_s": max(ends) - min(j["arrival_s"] for j in jobs) if ends else None,
        "mean_turnaround_s": statistics.fmean(j["turnaround_s"] for j in ok) if ok else None,
        "mean_wait_s": statistics.fmean(j["wait_s"] for j in ok) if ok else None,
        "jobs_ok": len(ok),
        "jobs_failed": len(jobs) - len(ok),
    }


def _enforcement(point: dict, res: dict) -> str:
    """What changed the job's cores: thread-only response methods never touch a quota."""
    if point["experiment"] == "response" and point["method"] != "quota":
        return "threads"
    return res["enforcement"]


def run(point: dict, period_us: int) -> dict:
    """{table: rows} of one point: points (1 row per variant run), series, changes, decisions, jobs."""
    res = driver.run_point(point, period_us, point["timeout_s"])
    out = {t: [] for t in COLUMNS}
    if "skipped" in res:
        for lab in labels(point):
            out["points"].append({**lab, "status": "skipped", "error": "", "enforcement": "none",
                                  "reason": f"skipped: {res['skipped']}"})
        return out
    for lab, one in zip(labels(point), res["runs"], strict=True):
        assert one["variant"] == lab["variant"], (one["variant"], lab)
        row = {
            **lab,
            "status": "ok",
            "error": "",
            "enforcement": _enforcement(point, res),
            "reason": res["cgroup_reason"],
            "point_wall_s": res["wall_s"],
            "warnings": len(one.get("warnings", [])),
        }
        jobs = [{**lab, **j} for j in one.get("jobs", [])]
        if jobs:
            row.update(_cosched_summary(one["jobs"]), other_load_cores=one.get("other_load_cores"))
        out["points"].append(row)
        out["series"] += _series_rows(lab, one["series"])
        out["changes"] += change_rows(lab, one)
        out["decisions"] += [{**lab, **d} for d in one.get("decisions", [])]
        out["jobs"] += jobs
    return out


COLUMNS = {
    "points": [
        "experiment",
        "variant",
        "repeat",
        "status",
        "error",
        "enforcement",
        "reason",
        "point_wall_s",
        "warnings",
        "makespan_s",
        "mean_turnaround_s",
        "mean_wait_s",
        "jobs_ok",
        "jobs_failed",
        "other_load_cores",
    ],
    "series": [
        "experiment",
        "variant",
        "repeat",
        "job",
        "iteration",
        "start_s",
        "iter_s",
        "cpu_s",
        "threads_run",
        "quota_cores_seen",
    ],
    "changes": [
        "experiment",
        "variant",
        "repeat",
        "job",
        "source",
        "target_threads",
        "requested_s",
        "outcome",
        "applied_iteration",
        "old_threads",
        "lag_iters",
        "latency_s",
        "inprogress_iter_s",
        "first_iter_s",
        "steady_iter_s",
        "set_call_s",
    ],
    "decisions": [
        "experiment",
        "variant",
        "repeat",
        "event_index",
        "time_s",
        "event",
        "event_job",
        "job",
        "cores",
        "threads",
        "decide_s",
        "apply_s",
        "admitted",
    ],
    "jobs": [
        "experiment",
        "variant",
        "repeat",
        "job",
        "arrival_s",
        "iterations",
        "request_cores",
        "admitted_s",
        "finished_s",
        "wait_s",
        "turnaround_s",
        "status",
        "error",
        "iterations_done",
    ],
}


def frame(table: str, rows: list[dict]):
    """A raw table with its columns even when no point produced a row (an empty CSV has a header)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    for c in COLUMNS[table]:
        if c not in df:
            df[c] = pd.Series(dtype=object)
    return df[COLUMNS[table] + [c for c in df.columns if c not in COLUMNS[table]]]
