"""Tables stage of the hetmem study: raw/ -> tables/ (docs/architecture.md, "Stages").

raw/ (tasks/hetmem.py): traces.csv (per app: tracing cost, footprint, simulated bounds; failed apps
with their error), validation.csv (app x sampling period x placement), policies.csv (app x
capacity x policy). tables/: tracing, validation, errors (mean/max |error| per app and period),
speed (one estimate vs one real, native run of the app on this machine; the simulated reference's
cost beside it), policies (with the gap to the all-fast bound).
The placements' reference is a SIMULATION (column `reference` = "simulated"); every figure and claim
says so. Only the speed table's comparison is against a real run (`reference` = "native run").
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


SPEED_COLUMNS = ["app", "estimate_s", "native_run_s", "native_compute_s", "speedup", "speedup_compute",
                 "simulated_reference_s", "speedup_vs_simulated", "reference"]


def speed_table(val: pd.DataFrame, every_n: int, traces: pd.DataFrame) -> pd.DataFrame:
    """One estimate (at the study's N) against one real run of the app: the native kernel run once,
    untraced, on this machine by the same task (traces' untraced_wall_s, the whole process;
    untraced_compute_s, its compute phase). The simulated reference's cost is kept for context."""
    if val.empty:
        return pd.DataFrame(columns=SPEED_COLUMNS)
    v = (
        val[val["sample_every"].eq(every_n)]
        .groupby("app", sort=False)
        .agg(estimate_s=("estimate_s", "first"), simulated_reference_s=("reference_s", "first"))
        .reset_index()
    )
    native = pd.DataFrame(columns=["app", "native_run_s", "native_compute_s"])
    if "untraced_wall_s" in traces:
        native = traces[["app", "untraced_wall_s", "untraced_compute_s"]].rename(
            columns={"untraced_wall_s": "native_run_s", "untraced_compute_s": "native_compute_s"}
        )
    v = v.merge(native, on="app", how="left")
    return v.assign(
        speedup=v["native_run_s"] / v["estimate_s"],
        speedup_compute=v["native_compute_s"] / v["estimate_s"],
        speedup_vs_simulated=v["simulated_reference_s"] / v["estimate_s"],
        reference="native run",
    )[SPEED_COLUMNS]


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
    speed = speed_table(val, cfg["hetmem"]["sample_every"], traces)
    write_table(speed, tables / "speed.csv", cfg, started)
    write_table(policy_table(pol), tables / "policies.csv", cfg, started)
