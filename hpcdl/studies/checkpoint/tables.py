"""Tables stage of the checkpoint-cost study: raw/ -> tables/ (docs/architecture.md, "Stages").

io_cost.csv (median per device, format, mode, ranks, size), resume.csv, overhead.csv (throughput and
overhead vs interval), young_daly.csv (optimal interval per mode and MTBF) and failures.csv (every
failed point, any kind). Every table names the device its rows were measured on (`device`); raw
tables from before the study had a CUDA path were all measured on the CPU and read as such.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from hpcdl.platform import StudyDir, failures_table, ok_rows, read_table, write_table
from hpcdl.studies.checkpoint.instruments import CEILINGS
from hpcdl.studies.checkpoint.training import young_daly_interval_s

MiB = 2**20
MEDIAN_COLS = ["state_bytes", "file_bytes", "blocking_s", "durable_s", "commit_s", "load_s", "verify_s",
               "write_bw_bytes_per_s", "ceiling_s", "ceiling_bw_bytes_per_s", "bw_over_ceiling",
               "ceiling_spread", "save_peak_extra_rss_bytes", "load_peak_extra_rss_bytes"]
# the phases (saver.SaveTiming) and the ceiling's parts, absent from raw tables older than them
PHASE_COLS = ["d2h_s", "snapshot_s", "persist_s", "storage_ceiling_s", "d2h_ceiling_s"]
KEYS = ["device", "format", "mode", "process_group", "ranks", "n_params"]
DEVICE_NAMES = {"cpu": "the CPU", "cuda": "the GPU (CUDA)"}


def with_device(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with its `device` column; rows from before the CUDA path (no column) were on the CPU."""
    if "device" in df:
        return df
    return df.assign(device="cpu") if not df.empty else df.assign(device=pd.Series(dtype=str))


def run_device(df: pd.DataFrame, study_dir: Path | None = None) -> str:
    """The device one run's table was measured on: its rows' `device`, else the run's provenance
    (a run whose points all failed), else the CPU (tables from before the CUDA path)."""
    if "device" in df and df["device"].notna().any():
        return " / ".join(sorted(set(df["device"].dropna().astype(str))))
    recorded = StudyDir(study_dir).device().get("device") if study_dir is not None else None
    return recorded if recorded in DEVICE_NAMES else "cpu"


def io_cost(raw: pd.DataFrame) -> pd.DataFrame:
    """Median over repeats per (format, mode, process group, ranks, size).

    `bw_over_ceiling` is the median of the paired ratios: each repeat's write bandwidth over the
    ceiling probed around that same save (the faster probe, compute.py), never over a ceiling pooled
    across formats and times, so the storage's drift between points cancels. `ceiling_spread` is the median
    disagreement of a repeat's two probes (the ceiling's own noise). Rows without a per-repeat
    ratio (DCP ranks points: one probe before the save) get write bandwidth / that repeat's probe.
    `ceiling` names the ceiling of the row's device (instruments.CEILINGS). An async row's
    `blocking_over_sync` is its blocking time over the sync save of the same device, format and size.
    """
    ok = with_device(ok_rows(raw))
    keys = KEYS
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "repeats", *MEDIAN_COLS, *PHASE_COLS, "ceiling", "placement",
                                     "sync_blocking_s", "blocking_over_sync", "roundtrip_ok"])
    ok["roundtrip_ok"] = ok["roundtrip_ok"].astype(str).str.lower() == "true"
    for col in ("bw_over_ceiling", "ceiling_spread", *PHASE_COLS):
        if col not in ok:
            ok[col] = float("nan")
    for col in ("ceiling", "placement"):
        ok[col] = ok[col].fillna("").astype(str) if col in ok else ""
    # a sync row from before the `ceiling` column was divided by the CPU's storage ceiling
    ok.loc[(ok["ceiling"] == "") & (ok["mode"] == "sync") & (ok["device"] == "cpu"), "ceiling"] = \
        CEILINGS["cpu"]
    ok["bw_over_ceiling"] = ok["bw_over_ceiling"].fillna(ok["write_bw_bytes_per_s"]
                                                         / ok["ceiling_bw_bytes_per_s"])
    g = ok.groupby(keys, sort=True)
    out = g[MEDIAN_COLS + PHASE_COLS].median()
    out["ceiling"] = g["ceiling"].first()
    out["placement"] = g["placement"].first()
    out["repeats"] = g.size()
    out["roundtrip_ok"] = g["roundtrip_ok"].all()
    out = out.reset_index()
    sync = out[out["mode"] == "sync"].set_index([k for k in keys if k != "mode"])["blocking_s"]
    paired = out.set_index([k for k in keys if k != "mode"]).index
    out["sync_blocking_s"] = [sync.get(i, float("nan")) if m == "async" else float("nan")
                              for i, m in zip(paired, out["mode"], strict=True)]
    out["blocking_over_sync"] = out["blocking_s"] / out["sync_blocking_s"]
    return out


def async_repeats(raw: pd.DataFrame) -> pd.DataFrame:
    """Per single-process format, size and repeat: the async save's blocking time (its snapshot copy
    the median of the repeat's snapshot passes) over the sync save's of the same repeat, the
    run-to-run spread the async claim's interval is taken over."""
    cols = ["device", "format", "n_params", "repeat", "async_blocking_s", "sync_blocking_s",
            "blocking_over_sync"]
    ok = ok_rows(raw)
    if ok.empty or "repeat" not in ok:
        return pd.DataFrame(columns=cols)
    ok = with_device(ok[~ok["process_group"].astype(bool)])
    keys = ["device", "format", "n_params", "repeat"]
    # an async repeat's snapshot copy as the median of its passes (compute._typical_blocking); a raw
    # table from before `blocking_typical_s` keeps the save's own
    typical = (ok["blocking_typical_s"].fillna(ok["blocking_s"]) if "blocking_typical_s" in ok
               else ok["blocking_s"])
    ok = ok.assign(claim_blocking_s=typical)
    by_mode = {m: ok[ok["mode"] == m].groupby(keys)["claim_blocking_s"].median().rename(f"{m}_blocking_s")
               for m in ("async", "sync")}
    out = pd.concat(by_mode.values(), axis=1, join="inner").reset_index()
    out["blocking_over_sync"] = out["async_blocking_s"] / out["sync_blocking_s"]
    return out[cols]


def bandwidth_repeats(raw: pd.DataFrame) -> pd.DataFrame:
    """Per single-process format, size and sync repeat: the save's write bandwidth over the ceiling
    probed around it (compute.ceiling_pair), the spread the bandwidth claim's interval is taken over."""
    cols = ["device", "format", "n_params", "repeat", "bw_over_ceiling", "ceiling_spread"]
    ok = ok_rows(raw)
    if ok.empty or not {"repeat", "bw_over_ceiling", "ceiling_spread"} <= set(ok):  # ceiling_pair writes both
        return pd.DataFrame(columns=cols)
    ok = with_device(ok[~ok["process_group"].astype(bool) & (ok["mode"] == "sync")])
    return ok[cols].dropna(subset=["bw_over_ceiling"]).sort_values(cols[:4]).reset_index(drop=True)


def overhead_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Successful overhead runs; each carries its paired no-checkpoint baseline and its overhead
    as extra training time per unit of work (comparable with the C/T of the Young/Daly model)."""
    ok = ok_rows(raw)
    if ok.empty:
        return pd.DataFrame()
    out = with_device(ok.copy())
    out["interval_s"] = out["interval_steps"] / out["baseline_steps_per_s"]
    return out.sort_values(["mode", "interval_steps"]).reset_index(drop=True)


def young_daly_table(overhead: pd.DataFrame, mtbf_s: list[float]) -> pd.DataFrame:
    """C = mean stall per checkpoint at the longest interval (no back-to-back saves); T = sqrt(2 MTBF C)."""
    rows = []
    if overhead.empty:
        return pd.DataFrame(rows)
    for mode, d in overhead.groupby("mode"):
        last = d.sort_values("interval_steps").iloc[-1]
        cost = float(last["stall_mean_s"])
        base = float(last["baseline_steps_per_s"])
        for m in mtbf_s:
            t_opt = young_daly_interval_s(m, cost)
            rows.append({"device": run_device(d), "mode": mode, "mtbf_s": m, "cost_s": cost,
                         "interval_s": t_opt,
                         "interval_steps": t_opt * base,
                         "expected_waste_frac": (cost / t_opt + t_opt / (2 * m)) if t_opt > 0 else 0.0})
    return pd.DataFrame(rows)


FAILURE_KEYS = ("format", "mode", "ranks", "n_params", "interval_steps")


def _raws(run: StudyDir) -> dict[str, pd.DataFrame]:
    return {k: read_table(run.raw_table(k)) for k in ("io", "resume", "overhead")}


def write(cfg: dict, study_dir: Path) -> None:
    started = time.time()
    run = StudyDir(study_dir)
    raws = _raws(run)
    write_table(io_cost(raws["io"]), run.table("io_cost"), cfg, started)
    write_table(async_repeats(raws["io"]), run.table("async_repeats"), cfg, started)
    write_table(bandwidth_repeats(raws["io"]), run.table("bandwidth_repeats"), cfg, started)
    write_table(with_device(raws["resume"]), run.table("resume"), cfg, started)
    ovh = overhead_table(raws["overhead"])
    write_table(ovh, run.table("overhead"), cfg, started)
    write_table(young_daly_table(ovh, cfg["checkpoint"]["overhead"]["mtbf_s"]), run.table("young_daly"),
                cfg, started)
    write_table(failures_table(raws, FAILURE_KEYS), run.table("failures"), cfg, started)


def single_process(io: pd.DataFrame) -> pd.DataFrame:
    """The format comparison: every format saved from one process without a process group."""
    return io[~io["process_group"].astype(bool)] if not io.empty else io
