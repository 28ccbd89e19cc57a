"""Claims stage of the malleability study: a change takes effect within one iteration, following a
cut quota beats keeping the threads, malleable policies beat rigid (tables/ -> claims)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform.claims import every, not_measured
from hpcdl.platform.stages import last_error_line
from hpcdl.studies.malleable.tables import raw, table

CLAIMS = ("change_within_one_iteration", "follow_quota_faster", "malleable_beats_rigid")
MALLEABLE = ("equal", "proportional")


def _status(points: pd.DataFrame, experiment: str, variant: str) -> tuple[str, str]:
    if points.empty:
        return "missing", "no points table"
    d = points[(points["experiment"] == experiment) & (points["variant"] == variant)]
    if d.empty:
        return "missing", f"{experiment} point {variant} is not in the table"
    r = d.iloc[0]
    if r["status"] == "ok":
        return "ok", ""
    text = r.get("reason") if r["status"] == "skipped" else r.get("error") or ""
    why = last_error_line(text) if str(text).strip() else "no reason"
    return str(r["status"]), f"{experiment} point {variant} {r['status']}: {why}"


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    study_dir = Path(study_dir)
    points = raw(study_dir, "points")
    return [
        _claim_change(cfg, points, table(study_dir, "response")),
        _claim_oversub(cfg, points, table(study_dir, "oversub")),
        _claim_policies(cfg, table(study_dir, "policies"), points),
    ]


def _claim_change(cfg, points, resp) -> dict:
    statement = (
        "a thread-count change requested by API, signal or quota takes effect within one iteration "
        "(at the first iteration boundary after the request: no iteration starts with the old count)"
    )
    holds, missing, lags, lat = {}, {}, {}, {}
    for method in cfg["malleable"]["response"]["methods"]:
        status, why = _status(points, "response", method)
        d = resp[resp["variant"] == method] if not resp.empty else resp
        if status != "ok" or d.empty:
            missing[method] = why or f"response point {method} logged no change"
            continue
        applied = d[d["outcome"] == "applied"]
        lags[method] = [int(x) for x in applied["lag_iters"]]
        lat[method] = [round(float(x), 2) for x in applied["latency_over_iter"].dropna()]
        holds[method] = len(applied) == len(d) and all(x == 0 for x in lags[method])
    return every(
        "change_within_one_iteration",
        statement,
        holds,
        missing,
        lag_iters=lags,
        latency_over_inprogress_iteration=lat,
        threshold="lag_iters == 0 for every change",
    )


def _claim_oversub(cfg, points, over) -> dict:
    statement = (
        "under a cut CPU quota, a job that follows the quota with its thread count runs an iteration "
        "faster than one that keeps its threads (oversubscribed)"
    )
    block = cfg["malleable"]
    holds, missing, ratios = {}, {}, {}
    for mode in ("keep", "follow"):
        status, why = _status(points, "oversub", mode)
        if status != "ok":
            missing[mode] = why
    cut = [q for q in block["oversub"]["quotas"] if q < block["cores"]]
    if not missing:
        for q in cut:
            d = over[np.isclose(over["quota_cores"].astype(float), q)] if not over.empty else over
            k, f = d[d["mode"] == "keep"], d[d["mode"] == "follow"]
            if k.empty or f.empty:
                missing[f"quota {q}"] = "no iterations in this phase"
                continue
            if int(k["threads"].iloc[0]) == int(f["threads"].iloc[0]):
                missing[f"quota {q}"] = "following this quota does not change the thread count"
                continue
            ratios[f"quota {q}"] = round(float(k["iter_s"].iloc[0] / f["iter_s"].iloc[0]), 3)
            holds[f"quota {q}"] = ratios[f"quota {q}"] > 1.0
    if not cut and not missing:
        return not_measured("follow_quota_faster", statement, "no quota below malleable.cores is configured")
    return every(
        "follow_quota_faster",
        statement,
        holds,
        missing,
        keep_over_follow_iter_time=ratios,
        threshold="keep / follow iteration time > 1 at every cut quota",
    )


def _claim_policies(cfg, pol, points) -> dict:
    statement = (
        "on the same workload, every malleable policy's makespan and mean turnaround are both below "
        "the rigid policy's"
    )
    names = list(cfg["malleable"]["cosched"]["policies"])
    malleable = [p for p in names if p in MALLEABLE]
    if "rigid" not in names or not malleable:
        return not_measured(
            "malleable_beats_rigid",
            statement,
            "malleable.cosched.policies must hold rigid and at least one malleable policy",
        )
    holds, missing, ratios = {}, {}, {}

    def usable(policy):
        status, why = _status(points, "cosched", policy)
        if status != "ok":
            return None, why
        r = pol[pol["policy"] == policy] if not pol.empty else pol
        if r.empty:
            return None, f"policy {policy} is not in the policies table"
        r = r.iloc[0]
        if r["jobs_failed"] > 0:
            return (
                None,
                f"policy {policy}: {int(r['jobs_failed'])} job(s) failed, the runs are not comparable",
            )
        return r, ""

    rigid, why = usable("rigid")
    for p in malleable:
        r, why_p = usable(p)
        if rigid is None or r is None:
            missing[p] = why if rigid is None else why_p
            continue
        ms, ta = (
            float(r["makespan_s"] / rigid["makespan_s"]),
            float(r["mean_turnaround_s"] / rigid["mean_turnaround_s"]),
        )
        ratios[p] = {"makespan_over_rigid": round(ms, 3), "turnaround_over_rigid": round(ta, 3)}
        holds[p] = ms < 1.0 and ta < 1.0
    return every(
        "malleable_beats_rigid",
        statement,
        holds,
        missing,
        ratios=ratios,
        threshold="both ratios < 1",
        enforcement=_enforcement(points),
    )


def _enforcement(points: pd.DataFrame) -> str:
    if points.empty or "enforcement" not in points:
        return "unknown"
    d = points[(points["experiment"] == "cosched") & (points["status"] == "ok")]
    vals = sorted(set(d["enforcement"].dropna().astype(str)))
    return ", ".join(vals) if vals else "unknown"
