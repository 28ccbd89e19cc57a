"""Tables stage of the hetmem study: raw/ -> tables/ (docs/architecture.md, "Stages").

raw/ (tasks/hetmem.py): traces.csv (per app: tracing cost, footprint, simulated bounds; failed apps
with their error), validation.csv (app x sampling period x placement), policies.csv (app x
capacity x policy). tables/: tracing, validation, errors (mean/max |error| per app and period),
speed (one estimate vs the app's kernel run on this machine, its compute phase without process
start-up, and vs one run of the simulated reference: the claim's two comparisons; the whole
process's wall time and its start-up share beside them), policies (with the gap to the all-fast
bound).
On the CPU the placements' reference is a SIMULATION (column `reference` = "simulated"); every
figure and claim says so, and only the speed table's comparison is against a real run (`reference` =
"native run"). On a GPU (hetmem.gpu) the reference is the HARDWARE (`reference` = gpu.HARDWARE: each
placement measured with its objects in GPU memory or in mapped pinned host memory) and the speed
table compares one estimate with one hardware run of a placement (`reference` = "hardware run").
Rows name their `device`; tables from before rows named it say "not recorded".
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hpcdl.platform import StudyDir, read_or_empty, read_table, started_at, write_table
from hpcdl.studies.hetmem.gpu import HARDWARE

NOT_RECORDED = "not recorded"


def on_hardware(table: pd.DataFrame) -> bool:
    """Whether a table's rows come from the CUDA path: its reference is the hardware, or (a table of
    failed apps only) its device is a GPU."""
    if "reference" in table and table["reference"].eq(HARDWARE).any():
        return True
    return "device" in table and table["device"].astype(str).str.startswith("cuda").any()


def with_device(table: pd.DataFrame) -> pd.DataFrame:
    return table if "device" in table or table.empty else table.assign(device=NOT_RECORDED)


def _one(table: pd.DataFrame, column: str, default: str) -> str:
    values = list(dict.fromkeys(table[column].dropna().astype(str))) if column in table else []
    return " / ".join(values) if values else default


def tracing_table(traces: pd.DataFrame) -> pd.DataFrame:
    out = traces.copy()
    if "traced_compute_s" in out:
        out["tracing_cost_compute"] = out["traced_compute_s"] / out["untraced_compute_s"]
        out["tracing_cost_process"] = out["traced_wall_s"] / out["untraced_wall_s"]
    return out


def error_table(val: pd.DataFrame) -> pd.DataFrame:
    if val.empty:
        return pd.DataFrame(
            columns=["app", "sample_every", "mean_abs_error", "max_abs_error", "placements", "reference",
                     "device"]
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
    return pd.concat([per_app, overall[per_app.columns]], ignore_index=True).assign(
        reference=_one(val, "reference", "simulated"), device=_one(val, "device", NOT_RECORDED))


SPEED_COLUMNS = ["app", "estimate_s", "native_run_s", "native_compute_s", "startup_share", "speedup",
                 "speedup_compute", "simulated_reference_s", "speedup_vs_simulated", "reference", "device"]


def speed_table(val: pd.DataFrame, every_n: int, traces: pd.DataFrame) -> pd.DataFrame:
    """One estimate (at the study's N) against one real run of the app: on the CPU the native kernel
    run untraced on this machine by the same task (traces' untraced_compute_s, the compute phase the
    binary times itself, what the claim compares; untraced_wall_s, the whole process, ~98 % start-up
    at laptop scale, kept beside it as `startup_share`) and one run of the simulated reference
    (cache simulation + timing of one placement, the paper's kind of comparator); on a GPU one
    hardware run of a placement (traces' native_compute_s: the step alone; native_run_s: placing the
    objects in their tiers and the step; nothing simulated)."""
    if val.empty:
        return pd.DataFrame(columns=SPEED_COLUMNS)
    if on_hardware(val):
        return _hardware_speed(val, traces)
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
        startup_share=1.0 - v["native_compute_s"] / v["native_run_s"],
        speedup=v["native_run_s"] / v["estimate_s"],
        speedup_compute=v["native_compute_s"] / v["estimate_s"],
        speedup_vs_simulated=v["simulated_reference_s"] / v["estimate_s"],
        reference="native run",
        device=_one(val, "device", NOT_RECORDED),
    )[SPEED_COLUMNS]


def _hardware_speed(val: pd.DataFrame, traces: pd.DataFrame) -> pd.DataFrame:
    v = val.groupby("app", sort=False).agg(estimate_s=("estimate_s", "first")).reset_index()
    native = pd.DataFrame(columns=["app", "native_run_s", "native_compute_s"])
    if "native_run_s" in traces:
        native = traces[["app", "native_run_s", "native_compute_s"]]
    v = v.merge(native, on="app", how="left")
    return v.assign(
        startup_share=1.0 - v["native_compute_s"] / v["native_run_s"],  # here: placing the objects
        speedup=v["native_run_s"] / v["estimate_s"],
        speedup_compute=v["native_compute_s"] / v["estimate_s"],
        simulated_reference_s=float("nan"),  # nothing is simulated on the GPU path
        speedup_vs_simulated=float("nan"),
        reference="hardware run",
        device=_one(val, "device", NOT_RECORDED),
    )[SPEED_COLUMNS]


def policy_table(pol: pd.DataFrame) -> pd.DataFrame:
    if pol.empty:
        return pol
    return with_device(pol).assign(
        gap_to_all_fast=pol["ref_runtime_s"] / pol["all_fast_runtime_s"] - 1.0,
        est_gap_to_all_fast=pol["est_runtime_s"] / pol["all_fast_runtime_s"] - 1.0,
    )


def write(cfg: dict, study_dir: Path) -> None:
    run = StudyDir(study_dir)
    # traces.csv always has a row per app (failed ones too): its absence is an error, not "no data"
    traces = read_table(run.raw_table("traces"))
    val, pol = read_or_empty(run.raw_table("validation")), read_or_empty(run.raw_table("policies"))
    started = started_at(study_dir, "traces")
    write_table(tracing_table(with_device(traces)), run.table("tracing"), cfg, started)
    write_table(with_device(val), run.table("validation"), cfg, started)
    write_table(error_table(val), run.table("errors"), cfg, started)
    speed = speed_table(val, cfg["hetmem"]["sample_every"], traces)
    write_table(speed, run.table("speed"), cfg, started)
    write_table(policy_table(pol), run.table("policies"), cfg, started)
