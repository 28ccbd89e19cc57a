"""Tables stage of the hetmem study: raw/ -> tables/ (docs/architecture.md, "Stages").

raw/ (tasks/hetmem.py): traces.csv (per app: tracing cost, footprint, simulated bounds; failed apps
with their error), validation.csv (app x sampling period x placement), policies.csv (app x
capacity x policy). tables/: tracing, validation, errors (mean/max |error| per app and period),
speed (one estimate vs one reference run), policies (with the gap to the all-fast bound).
The reference is a SIMULATION (column `reference` = "simulated"); every figure and claim says so.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hpcdl.platform.results import read_table, write_table
from hpcdl.platform.stages import read_or_empty, started_at


def tracing_table(traces: pd.DataFrame) -> pd.DataFrame:
    out = traces.copy()
    if "traced_compute_s" in out:
        out["tracing_cost_compute"] = out["traced_compute_s"] / out["untraced_compute_s"]
        out["tracing_cost_process"] = out["traced_wall_s"] / out["untraced_wall_s"]
    return out


def error_table(val: pd.DataFrame) -> pd.DataFrame:
    if val.empty:
        return pd.DataFrame(
            columns=["app", "sample_every", "mean_abs_error", "max_abs_error", "placements", "reference"]
        )
    val = val.assign(abs_error=val["error"].abs())
    per_app = (
        val.groupby(["app", "sample_every"], sort=False)
        .agg(
            mean_abs_error=("abs_error", "mean"),
            max_abs_error=("abs_error", "max"),
            placements=("abs_error", "size"),
        )
        .reset_index()
    )
    overall = (
        val.groupby("sample_every")
        .agg(
            mean_abs_error=("abs_error", "mean"),
            max_abs_error=("abs_error", "max"),
            placements=("abs_error", "size"),
        )
        .reset_index()
        .assign(app="all")
    )
    return pd.concat([per_app, overall[per_app.columns]], ignore_index=True).assign(reference="simulated")


def speed_table(val: pd.DataFrame, every_n: int) -> pd.DataFrame:
    if val.empty:
        return pd.DataFrame(columns=["app", "estimate_s", "reference_s", "speedup", "reference"])
    v = (
        val[val["sample_every"].eq(every_n)]
        .groupby("app", sort=False)
        .agg(estimate_s=("estimate_s", "first"), reference_s=("reference_s", "first"))
        .reset_index()
    )
    return v.assign(speedup=v["reference_s"] / v["estimate_s"], reference="simulated")


def policy_table(pol: pd.DataFrame) -> pd.DataFrame:
    if pol.empty:
        return pol
    return pol.assign(
        gap_to_all_fast=pol["ref_runtime_s"] / pol["all_fast_runtime_s"] - 1.0,
        est_gap_to_all_fast=pol["est_runtime_s"] / pol["all_fast_runtime_s"] - 1.0,
    )


def write(cfg: dict, study_dir: Path) -> None:
    study_dir = Path(study_dir)
    raw = study_dir / "raw"
    # traces.csv always has a row per app (failed ones too): its absence is an error, not "no data"
    traces = read_table(raw / "traces.csv")
    val, pol = read_or_empty(raw / "validation.csv"), read_or_empty(raw / "policies.csv")
    started = started_at(study_dir, "traces")
    tables = study_dir / "tables"
    write_table(tracing_table(traces), tables / "tracing.csv", cfg, started)
    write_table(val, tables / "validation.csv", cfg, started)
    write_table(error_table(val), tables / "errors.csv", cfg, started)
    write_table(speed_table(val, cfg["hetmem"]["sample_every"]), tables / "speed.csv", cfg, started)
    write_table(policy_table(pol), tables / "policies.csv", cfg, started)
