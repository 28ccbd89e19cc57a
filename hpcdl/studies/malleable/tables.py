"""Tables stage of the malleability study: raw/ -> tables/*.csv (each change's lag and latency, the
quota phases' iteration times, the policies' makespans, utilisation over time, change costs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import StudyDir, read_or_empty, write_table

PHASE_SKIP = 2  # iterations at the start of a quota phase left out of its median
UTIL_BIN_S = 0.25  # width of the utilisation-over-time bins


def raw(study_dir: Path, name: str) -> pd.DataFrame:
    """raw/<name>.csv, or an empty table."""
    return read_or_empty(StudyDir(study_dir).raw_table(name))


def table(study_dir: Path, name: str) -> pd.DataFrame:
    """tables/<name>.csv, or an empty table."""
    return read_or_empty(StudyDir(study_dir).table(name))


def response_table(changes: pd.DataFrame, series: pd.DataFrame) -> pd.DataFrame:
    if changes.empty:
        return pd.DataFrame(columns=["variant", "direction", "outcome", "lag_iters", "latency_s"])
    d = changes[changes["experiment"] == "response"].copy()
    if d.empty:
        return d
    d["direction"] = np.where(
        d["target_threads"] < d["old_threads"].fillna(d["target_threads"]), "down", "up"
    )
    d["latency_over_iter"] = d["latency_s"] / d["inprogress_iter_s"]
    return d.reset_index(drop=True)


def _repeat(df: pd.DataFrame) -> pd.Series:
    """The repeat of each row (0 for tables written before repeats existed)."""
    return df["repeat"].fillna(0).astype(int) if "repeat" in df else pd.Series(0, index=df.index)


def oversub_table(series: pd.DataFrame, cfg: dict) -> pd.DataFrame:
    """Median iteration time per repeat, mode and quota phase; keep / follow of the same repeat."""
    cols = ["repeat", "mode", "phase", "quota_cores", "threads", "iter_s", "oversubscribed",
            "keep_over_follow"]
    if series.empty:
        return pd.DataFrame(columns=cols)
    d = series[series["experiment"] == "oversub"].assign(repeat=lambda x: _repeat(x))
    block = cfg["malleable"]["oversub"]
    quotas, phase = block["quotas"], block["phase_iterations"]
    rows = []
    for (rep, mode), g in d.groupby(["repeat", "variant"]):
        for i, q in enumerate(quotas):
            ph = g[(g["iteration"] >= i * phase + PHASE_SKIP) & (g["iteration"] < (i + 1) * phase)]
            if ph.empty:
                continue
            threads = int(ph["threads_run"].mode().iloc[0])
            rows.append(
                {
                    "repeat": int(rep),
                    "mode": mode,
                    "phase": i,
                    "quota_cores": float(q),
                    "threads": threads,
                    "iter_s": float(ph["iter_s"].median()),
                    # more runnable threads than the quota's whole cores (one thread on half a core is not)
                    "oversubscribed": threads > max(1.0, q) + 1e-9,
                }
            )
    out = pd.DataFrame(rows, columns=cols[:-1])
    if out.empty:
        return pd.DataFrame(columns=cols)
    piv = out.pivot_table(index=["repeat", "phase"], columns="mode", values="iter_s")
    ratio = (piv["keep"] / piv["follow"]) if {"keep", "follow"} <= set(piv.columns) else None
    out["keep_over_follow"] = (
        [ratio.get((r, ph), np.nan) for r, ph in zip(out["repeat"], out["phase"], strict=True)]
        if ratio is not None else np.nan
    )
    return out


def policies_table(points: pd.DataFrame, series: pd.DataFrame, cores: int,
                   disturbed_load_cores: float | None = None) -> pd.DataFrame:
    """One row per policy and repeat; the ratios are to the rigid run of the same repeat.
    `other_load_cores`: what other processes took while that policy's wave ran (NaN in raw tables from
    before it was recorded); `disturbed`: above malleable.disturbed_load_cores, whose repeat the policy
    claim leaves out."""
    cols = [
        "policy",
        "repeat",
        "status",
        "enforcement",
        "makespan_s",
        "mean_turnaround_s",
        "mean_wait_s",
        "utilisation_frac",
        "jobs_ok",
        "jobs_failed",
        "makespan_over_rigid",
        "turnaround_over_rigid",
        "other_load_cores",
        "disturbed",
    ]
    if points.empty:
        return pd.DataFrame(columns=cols)
    d = points[points["experiment"] == "cosched"].assign(repeat=lambda x: _repeat(x))
    s = series[series["experiment"] == "cosched"].assign(repeat=lambda x: _repeat(x)) if not series.empty \
        else series
    rows = []
    for r in d.itertuples():
        row = {"policy": r.variant, "repeat": r.repeat, "status": r.status,
               "enforcement": getattr(r, "enforcement", "")}
        if r.status == "ok":
            mine = s[(s["variant"] == r.variant) & (s["repeat"] == r.repeat)] if not s.empty else s
            cpu = mine["cpu_s"].sum() if not mine.empty else 0.0
            row.update(
                makespan_s=r.makespan_s,
                mean_turnaround_s=r.mean_turnaround_s,
                mean_wait_s=r.mean_wait_s,
                utilisation_frac=cpu / (cores * r.makespan_s) if r.makespan_s else np.nan,
                jobs_ok=r.jobs_ok,
                jobs_failed=r.jobs_failed,
                other_load_cores=getattr(r, "other_load_cores", np.nan),
            )
        rows.append(row)
    out = pd.DataFrame(rows, columns=cols)
    rigid = out[(out["policy"] == "rigid") & (out["status"] == "ok")].set_index("repeat")
    for col, ratio in (("makespan_s", "makespan_over_rigid"), ("mean_turnaround_s", "turnaround_over_rigid")):
        base = out["repeat"].map(rigid[col].astype(float)) if not rigid.empty else np.nan
        out[ratio] = out[col].astype(float) / base
    limit = np.inf if disturbed_load_cores is None else disturbed_load_cores
    out["disturbed"] = pd.to_numeric(out["other_load_cores"], errors="coerce").gt(limit)
    return out


def utilisation_table(
    series: pd.DataFrame, decisions: pd.DataFrame, jobs: pd.DataFrame, cores: int
) -> pd.DataFrame:
    """Busy cores (each iteration's CPU time spread over its wall interval) and allocated cores per bin,
    per policy and repeat."""
    cols = ["policy", "repeat", "t_s", "busy_cores", "allocated_cores", "utilisation_frac"]
    rows = []
    s = series[series["experiment"] == "cosched"].assign(repeat=lambda x: _repeat(x)) if not series.empty \
        else series
    for (policy, rep), g in s.groupby(["variant", "repeat"]) if not s.empty else []:
        end = float((g["start_s"] + g["iter_s"]).max())
        edges = np.arange(0.0, end + UTIL_BIN_S, UTIL_BIN_S)
        busy = np.zeros(len(edges) - 1)
        for a, w, c in zip(g["start_s"], g["iter_s"], g["cpu_s"], strict=True):
            lo, hi = a, a + w
            overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0, None)
            busy += c * overlap / max(w, 1e-9)
        busy /= UTIL_BIN_S
        alloc = _allocated(decisions, jobs, policy, int(rep), edges[:-1] + UTIL_BIN_S / 2)
        for t, b, al in zip(edges[:-1], busy, alloc, strict=True):
            rows.append(
                {
                    "policy": policy,
                    "repeat": int(rep),
                    "t_s": t,
                    "busy_cores": b,
                    "allocated_cores": al,
                    "utilisation_frac": b / cores,
                }
            )
    return pd.DataFrame(rows, columns=cols)


def _allocated(decisions: pd.DataFrame, jobs: pd.DataFrame, policy: str, rep: int,
               times: np.ndarray) -> np.ndarray:
    """Sum over jobs of the share each held at each time (shares change at decisions, end at finish)."""
    out = np.zeros(len(times))
    if decisions.empty:
        return out
    d = decisions[(decisions["experiment"] == "cosched") & (decisions["variant"] == policy)]
    d = d[_repeat(d) == rep]
    j = jobs[(jobs["experiment"] == "cosched") & (jobs["variant"] == policy)] if not jobs.empty else jobs
    j = j[_repeat(j) == rep] if not j.empty else j
    finished = {str(r.job): r.finished_s for r in j.itertuples()}
    for job, g in d.groupby(d["job"].astype(str)):
        g = g.sort_values("time_s")
        starts = list(g["time_s"]) + [finished.get(job, np.inf)]
        for (t0, t1), share in zip(zip(starts[:-1], starts[1:], strict=True), g["cores"], strict=True):
            out += np.where((times >= t0) & (times < t1), share, 0.0)
    return out


def change_cost_table(changes: pd.DataFrame) -> pd.DataFrame:
    if changes.empty:
        return pd.DataFrame(columns=["experiment", "variant", "source", "change_cost_ratio"])
    d = changes[changes["outcome"] == "applied"].copy()
    d["change_cost_ratio"] = d["first_iter_s"] / d["steady_iter_s"]
    return d.reset_index(drop=True)


def write(cfg: dict, study_dir: Path) -> None:
    """response.csv (each requested change: lag, latency, iteration times around it), oversub.csv
    (median iteration time per repeat, mode and quota phase; keep / follow of the same repeat),
    policies.csv (makespan, mean turnaround, mean wait, utilisation per policy and repeat, ratios to
    the rigid run of the same repeat), jobs.csv, utilisation.csv (busy and allocated cores over time
    per policy and repeat), change_cost.csv (first iteration after a change /
    steady iteration, every applied change) and series.csv (every iteration)."""
    cores = cfg["malleable"]["cores"]
    points, series, changes = raw(study_dir, "points"), raw(study_dir, "series"), raw(study_dir, "changes")
    decisions, jobs = raw(study_dir, "decisions"), raw(study_dir, "jobs")
    started = pd.Timestamp.now().timestamp()
    run = StudyDir(study_dir)
    out = {
        "response": response_table(changes, series),
        "oversub": oversub_table(series, cfg),
        "policies": policies_table(points, series, cores, cfg["malleable"].get("disturbed_load_cores")),
        "jobs": jobs,
        "utilisation": utilisation_table(series, decisions, jobs, cores),
        "change_cost": change_cost_table(changes),
        "series": series,
    }
    for name, df in out.items():
        write_table(df, run.table(name), cfg, started)
