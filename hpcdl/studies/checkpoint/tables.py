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


TEXT_COLS = ["ceiling", "placement", "ceiling_source", "ceiling_error", "fio_direct_note"]


def _text(col: pd.Series) -> pd.Series:
    """A text column with "" for missing values (a CSV column of empty strings reads back as NaN floats)."""
    return col.astype(object).where(col.notna(), "").astype(str)


def io_cost(raw: pd.DataFrame) -> pd.DataFrame:
    """Median over repeats per (format, mode, process group, ranks, size).

    `bw_over_ceiling` is the median of the paired ratios: each repeat's write bandwidth over the
    ceiling of that same save's point (the faster of fio's runs before and after its saves,
    compute.py), never over a ceiling pooled across formats and times, so the storage's drift between
    points cancels. `ceiling_spread` is the median disagreement of the two moments (the ceiling's own
    noise). Rows without a per-repeat ratio (DCP ranks points: one own probe before the save) get write
    bandwidth / that repeat's probe. `ceiling` names the ceiling of the row's device
    (instruments.CEILINGS), `ceiling_source` what measured it (fio; "own probe" for DCP ranks), and
    `ceiling_error` why a point has none (fio missing or failed). An async row's `blocking_over_sync`
    is its blocking time (its save's own snapshot copy) over the sync save of the same device, format
    and size.
    """
    ok = with_device(ok_rows(raw))
    keys = KEYS
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "repeats", *MEDIAN_COLS, *PHASE_COLS, *TEXT_COLS,
                                     "sync_blocking_s", "blocking_over_sync", "roundtrip_ok"])
    ok["roundtrip_ok"] = ok["roundtrip_ok"].astype(str).str.lower() == "true"
    for col in ("bw_over_ceiling", "ceiling_spread", *PHASE_COLS):
        if col not in ok:
            ok[col] = float("nan")
    for col in TEXT_COLS:
        ok[col] = _text(ok[col]) if col in ok else ""
    # a sync row from before the `ceiling` column was divided by the CPU's storage ceiling
    ok.loc[(ok["ceiling"] == "") & (ok["mode"] == "sync") & (ok["device"] == "cpu"), "ceiling"] = \
        CEILINGS["cpu"]
    ok["bw_over_ceiling"] = ok["bw_over_ceiling"].fillna(ok["write_bw_bytes_per_s"]
                                                         / ok["ceiling_bw_bytes_per_s"])
    g = ok.groupby(keys, sort=True)
    out = g[MEDIAN_COLS + PHASE_COLS].median()
    for col in TEXT_COLS:  # the first non-empty value of the point's repeats
        out[col] = g[col].agg(lambda v: next((x for x in v if x), ""))
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
    """Per single-process format, size and repeat: the async save's blocking time (its own snapshot
    copy, the stall training waits for) over the sync save's of the same repeat, the run-to-run spread
    the async claim's interval is taken over. Context, not judged: `typical_async_blocking_s` and
    `typical_blocking_over_sync`, the same with the save's copy replaced by the median of the repeat's
    snapshot passes (compute._typical_blocking; the save's own where a raw table has none)."""
    cols = ["device", "format", "n_params", "repeat", "async_blocking_s", "sync_blocking_s",
            "blocking_over_sync", "typical_async_blocking_s", "typical_blocking_over_sync"]
    ok = ok_rows(raw)
    if ok.empty or "repeat" not in ok:
        return pd.DataFrame(columns=cols)
    ok = with_device(ok[~ok["process_group"].astype(bool)])
    keys = ["device", "format", "n_params", "repeat"]
    typical = (ok["blocking_typical_s"].fillna(ok["blocking_s"]) if "blocking_typical_s" in ok
               else ok["blocking_s"])
    ok = ok.assign(typical_blocking_s=typical)
    parts = [ok[ok["mode"] == m].groupby(keys)[col].median().rename(name)
             for m, col, name in (("async", "blocking_s", "async_blocking_s"),
                                  ("sync", "blocking_s", "sync_blocking_s"),
                                  ("async", "typical_blocking_s", "typical_async_blocking_s"))]
    out = pd.concat(parts, axis=1, join="inner").reset_index()
    out["blocking_over_sync"] = out["async_blocking_s"] / out["sync_blocking_s"]
    out["typical_blocking_over_sync"] = out["typical_async_blocking_s"] / out["sync_blocking_s"]
    return out[cols]


def bandwidth_repeats(raw: pd.DataFrame) -> pd.DataFrame:
    """Per single-process format, size and sync repeat: the save's write bandwidth over the run's
    ceiling at its size (`run_ceiling`), the point's own ceiling and ratio as context
    (`point_*`, compute.ceiling_pair), the point's spread, both bandwidths and, where the point has no
    ceiling, why (`ceiling_error`): the items the bandwidth claim judges one by one."""
    cols = ["device", "format", "n_params", "repeat", "bw_over_ceiling", "ceiling_spread",
            "write_bw_bytes_per_s", "ceiling_bw_bytes_per_s", "point_bw_over_ceiling",
            "point_ceiling_bw_bytes_per_s", "ceiling_error"]
    ok = ok_rows(raw)
    if ok.empty or not {"repeat", "bw_over_ceiling", "ceiling_spread"} <= set(ok):  # ceiling_pair writes both
        return pd.DataFrame(columns=cols)
    ok = with_device(ok[~ok["process_group"].astype(bool) & (ok["mode"] == "sync")])
    ok = ok.assign(**{c: float("nan") for c in ("write_bw_bytes_per_s", "ceiling_bw_bytes_per_s")
                      if c not in ok})
    ok["ceiling_error"] = _text(ok["ceiling_error"]) if "ceiling_error" in ok else ""
    ok = run_ceiling(ok)
    # a repeat without a ratio stays where its point says why (fio missing or failed)
    ok = ok[ok["bw_over_ceiling"].notna() | (ok["ceiling_error"] != "")]
    return ok[cols].sort_values(cols[:4]).reset_index(drop=True)


def run_ceiling(sync: pd.DataFrame) -> pd.DataFrame:
    """Each sync repeat's ratio to the run's storage ceiling at its size: the fastest fio moment of
    every single-process sync point of that device and size in this run (plus, on cuda, the repeat's
    own D2H probe). fio's moments disagreed by up to 37 % between the two probes of one point, and
    its per-point ceilings by 2256-3016 MB/s within one laptop run, while the saves held at
    2018-2062 MB/s across three runs (#59): a ceiling paired to one point's two probes then moved
    the verdict with fio's noise. The fastest moment of the run is what this storage has shown it
    can do at this size, and a higher ceiling can only lower a ratio. The point's own ratio stays as
    `point_bw_over_ceiling`. Rows from raw tables without the storage part keep the point's ratio."""
    out = sync.copy()
    out["point_bw_over_ceiling"] = out["bw_over_ceiling"]
    out["point_ceiling_bw_bytes_per_s"] = out["ceiling_bw_bytes_per_s"]
    if "storage_ceiling_s" not in out or out.empty:
        return out
    fastest = out.groupby(["device", "n_params"])["storage_ceiling_s"].transform("min")
    d2h = out["d2h_ceiling_s"].fillna(0.0) if "d2h_ceiling_s" in out else 0.0
    ceiling_s = (fastest + d2h).where(fastest.notna())
    pooled = out["state_bytes"] / ceiling_s
    out["ceiling_bw_bytes_per_s"] = pooled.fillna(out["ceiling_bw_bytes_per_s"])
    out["bw_over_ceiling"] = (out["write_bw_bytes_per_s"] / pooled).fillna(out["bw_over_ceiling"])
    return out


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
