"""Claims stage of the hetmem study: tables/ -> the three claims (estimate error, estimate speed,
placement near the all-fast bound), each against the SIMULATED reference, with the block's thresholds
(`error_ceiling`, `speedup_floor`, `bound_tolerance`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform.claims import claim, every, not_measured
from hpcdl.platform.stages import failed_because, read_or_empty

CLAIMS = ("estimate_error_le_5pct", "estimate_100x_faster", "placement_near_all_fast")


def _failed_apps(study_dir: Path, cfg: dict, measured: set[str]) -> dict[str, str]:
    """Configured apps without results, and why (their error's last line, or absent)."""
    traces = read_or_empty(study_dir / "tables" / "tracing.csv")
    out = {}
    for app in (a["name"] for a in cfg["hetmem"]["apps"]):
        if app in measured:
            continue
        row = traces[traces["app"].eq(app)] if "app" in traces else pd.DataFrame()
        if not row.empty and row["status"].iloc[0] == "failed":
            out[app] = failed_because(f"app {app}", row["error"].iloc[0])
        else:
            out[app] = f"app {app} has no result"
    return out


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    study_dir = Path(study_dir)
    block = cfg["hetmem"]
    tables = study_dir / "tables"
    val, speed, pol = (
        read_or_empty(tables / "validation.csv"),
        read_or_empty(tables / "speed.csv"),
        read_or_empty(tables / "policies.csv"),
    )
    n = block["sample_every"]
    v = val[val["sample_every"].eq(n)] if not val.empty else val
    missing_val = _failed_apps(study_dir, cfg, set(v["app"]) if not v.empty else set())
    return [
        _claim_error(block, v, missing_val),
        _claim_speed(
            block, speed, _failed_apps(study_dir, cfg, set(speed["app"]) if not speed.empty else set())
        ),
        _claim_bound(block, pol, _failed_apps(study_dir, cfg, set(pol["app"]) if not pol.empty else set())),
    ]


def _claim_error(block: dict, v: pd.DataFrame, missing: dict[str, str]) -> dict:
    ceiling = block["error_ceiling"]
    stmt = (
        f"differential-tracing estimate within {100 * ceiling:g} % mean |error| of the SIMULATED two-tier "
        f"reference over all validation placements of every app (N={block['sample_every']}; "
        "seed: 4.4 % on hardware)"
    )
    per_app = (
        {a: round(float(g["error"].abs().mean()), 5) for a, g in v.groupby("app", sort=False)}
        if not v.empty
        else {}
    )
    mean = float(v["error"].abs().mean()) if not v.empty else None
    measured = {
        "mean_abs_error": mean,
        "max_abs_error": float(v["error"].abs().max()) if not v.empty else None,
        "per_app_mean_abs_error": per_app,
        "placements": int(len(v)),
        "threshold": ceiling,
        "reference": "simulated",
    }
    if missing or mean is None or not np.isfinite(mean):
        return not_measured(
            "estimate_error_le_5pct", stmt, list(missing.values()) or ["no validation rows"], **measured
        )
    return claim("estimate_error_le_5pct", stmt, mean <= ceiling, **measured)


def _claim_speed(block: dict, speed: pd.DataFrame, missing: dict[str, str]) -> dict:
    floor = block["speedup_floor"]
    stmt = (
        f"one estimate at least {floor:g}x faster than one SIMULATED reference run "
        "(cache simulation of the trace + the placement's timing), for every app"
    )
    holds = {r.app: bool(r.speedup >= floor) for r in speed.itertuples()} if not speed.empty else {}
    ratios = {r.app: round(float(r.speedup), 1) for r in speed.itertuples()} if not speed.empty else {}
    return every(
        "estimate_100x_faster", stmt, holds, missing, speedup=ratios, threshold=floor, reference="simulated"
    )


def _claim_bound(block: dict, pol: pd.DataFrame, missing: dict[str, str]) -> dict:
    tol = block["bound_tolerance"]
    cap = max(block["agent"]["capacities"])
    stmt = (
        f"the greedy or the learned (PPO) placement within {100 * tol:g} % of the all-fast bound at the "
        f"largest capacity tried ({cap:g} of the footprint), SIMULATED runtimes, for every app"
    )
    holds, gaps = {}, {}
    if not pol.empty:
        at = pol[np.isclose(pol["capacity"], cap) & pol["policy"].isin(["greedy", "ppo"])]
        for app, g in at.groupby("app", sort=False):
            best = float(g["gap_to_all_fast"].min())
            gaps[app] = {
                p: round(float(x), 4) for p, x in zip(g["policy"], g["gap_to_all_fast"], strict=True)
            }
            holds[app] = best <= tol
        for app in set(pol["app"]) - set(holds):
            missing[app] = f"app {app} has no greedy/ppo row at capacity {cap:g}"
    return every(
        "placement_near_all_fast",
        stmt,
        holds,
        missing,
        gap_to_all_fast=gaps,
        capacity=cap,
        tolerance=tol,
        reference="simulated",
    )
