"""Tables stage of the checkpoint-cost study: raw/ -> tables/ (docs/architecture.md, "Stages").

io_cost.csv (median per format, mode, ranks, size), resume.csv, overhead.csv (throughput and
overhead vs interval), young_daly.csv (optimal interval per mode and MTBF) and failures.csv (every
failed point, any kind).
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from hpcdl.platform.results import read_table, write_table
from hpcdl.platform.stages import failures_table, ok_rows
from hpcdl.studies.checkpoint.training import young_daly_interval_s

MiB = 2**20
MEDIAN_COLS = ["state_bytes", "file_bytes", "blocking_s", "durable_s", "commit_s", "load_s", "verify_s",
               "write_bw_bytes_per_s", "ceiling_s", "ceiling_bw_bytes_per_s", "bw_over_ceiling",
               "ceiling_spread", "save_peak_extra_rss_bytes", "load_peak_extra_rss_bytes"]


def io_cost(raw: pd.DataFrame) -> pd.DataFrame:
    """Median over repeats per (format, mode, process group, ranks, size).

    `bw_over_ceiling` is the median of the paired ratios: each repeat's write bandwidth over the
    ceiling probed around that same save (compute.py), never over a ceiling pooled across formats
    and times, so the storage's drift between points cancels. `ceiling_spread` is the median
    disagreement of a repeat's two probes (the ceiling's own noise). Rows without a per-repeat
    ratio (DCP ranks points: one probe before the save) get write bandwidth / that repeat's probe.
    """
    ok = ok_rows(raw)
    keys = ["format", "mode", "process_group", "ranks", "n_params"]
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "repeats", *MEDIAN_COLS, "roundtrip_ok"])
    ok["roundtrip_ok"] = ok["roundtrip_ok"].astype(str).str.lower() == "true"
    for col in ("bw_over_ceiling", "ceiling_spread"):
        if col not in ok:
            ok[col] = float("nan")
    ok["bw_over_ceiling"] = ok["bw_over_ceiling"].fillna(ok["write_bw_bytes_per_s"]
                                                         / ok["ceiling_bw_bytes_per_s"])
    g = ok.groupby(keys, sort=True)
    out = g[MEDIAN_COLS].median()
    out["repeats"] = g.size()
    out["roundtrip_ok"] = g["roundtrip_ok"].all()
    return out.reset_index()


def overhead_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Successful overhead runs; each carries its paired no-checkpoint baseline and its overhead
    as extra training time per unit of work (comparable with the C/T of the Young/Daly model)."""
    ok = ok_rows(raw)
    if ok.empty:
        return pd.DataFrame()
    out = ok.copy()
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
            rows.append({"mode": mode, "mtbf_s": m, "cost_s": cost, "interval_s": t_opt,
                         "interval_steps": t_opt * base,
                         "expected_waste_frac": (cost / t_opt + t_opt / (2 * m)) if t_opt > 0 else 0.0})
    return pd.DataFrame(rows)


FAILURE_KEYS = ("format", "mode", "ranks", "n_params", "interval_steps")


def _raws(study_dir: Path) -> dict[str, pd.DataFrame]:
    return {k: read_table(study_dir / "raw" / f"{k}.csv") for k in ("io", "resume", "overhead")}


def write(cfg: dict, study_dir: Path) -> None:
    started = time.time()
    study_dir = Path(study_dir)
    raws = _raws(study_dir)
    tables = study_dir / "tables"
    write_table(io_cost(raws["io"]), tables / "io_cost.csv", cfg, started)
    write_table(raws["resume"], tables / "resume.csv", cfg, started)
    ovh = overhead_table(raws["overhead"])
    write_table(ovh, tables / "overhead.csv", cfg, started)
    write_table(young_daly_table(ovh, cfg["checkpoint"]["overhead"]["mtbf_s"]), tables / "young_daly.csv",
                cfg, started)
    write_table(failures_table(raws, FAILURE_KEYS), tables / "failures.csv", cfg, started)


def single_process(io: pd.DataFrame) -> pd.DataFrame:
    """The format comparison: every format saved from one process without a process group."""
    return io[~io["process_group"].astype(bool)] if not io.empty else io
