"""Tables stage of the memory-offload study: raw/ -> tables/ (docs/architecture.md, "Stages").

tradeoff.csv (per strategy and depth: measured and accounted peak memory, the fast tier's bytes per
parameter, step-time split, bytes moved, hidden fraction, and the ratios to `none` at the same depth and
precision: memory (measured, and the registry's), slowdown, bit-identical weights and, where they are not,
how far apart in units in the last place (tolerance.py)), capacity.csv
(largest depth and parameters under the budget per strategy, and the ratio to `none`), tiers.csv
(both tiers' write and read bandwidth, measured by every sweep point after its run: is the slow tier
slower? tiers.py) and failures.csv (every failed point).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import StudyDir, failures_table, ok_rows, read_or_empty, write_table
from hpcdl.studies.offload import tiers, tolerance

ORDER = ["none", "optimizer", "activations", "both", "save_on_cpu", "zero_offload"]


def _deviation(r, b) -> float:
    """How far a row's final weights are from none's, in units in the last place (rms over the sample)."""
    a, ref = (tolerance.parse_sample(x.get("weights_sample")) for x in (r, b))
    if not a or len(a) != len(ref):
        return np.nan
    return tolerance.deviation(a, ref, str(r.get("precision", "fp32")))


def tradeoff(steps: pd.DataFrame) -> pd.DataFrame:
    ok = ok_rows(steps)
    if ok.empty:
        return pd.DataFrame(columns=["strategy", "depth", "memory_ratio", "slowdown", "bit_identical"])
    if "precision" not in ok:  # tables from before offload.precision: every run was fp32
        ok = ok.assign(precision="fp32")
    base = ok[ok["strategy"] == "none"].set_index(["depth", "precision"])
    rows = []
    for _, r in ok.iterrows():
        key = (r["depth"], r["precision"])
        b = base.loc[key] if key in base.index else None
        rows.append(
            {
                **r.to_dict(),
                # measured (CUDA allocator peak; CPU anonymous RSS above the run's start), and the registry's
                "memory_ratio": r["peak_fast_bytes"] / b["peak_fast_bytes"] if b is not None else np.nan,
                "registry_ratio": r["peak_accounted_bytes"] / b["peak_accounted_bytes"]
                if b is not None
                else np.nan,
                "rss_ratio": r["peak_extra_rss_bytes"] / b["peak_extra_rss_bytes"]
                if b is not None
                else np.nan,
                "slowdown": r["step_s"] / b["step_s"] if b is not None else np.nan,
                "bit_identical": (r["weights_sha256"] == b["weights_sha256"]) if b is not None else None,
                "weights_deviation_ulps": _deviation(r, b) if b is not None else np.nan,
            }
        )
    out = pd.DataFrame(rows)
    out["order"] = out["strategy"].map({s: i for i, s in enumerate(ORDER)})
    return out.sort_values(["depth", "order"]).drop(columns="order").reset_index(drop=True)


def capacity(raw: pd.DataFrame) -> pd.DataFrame:
    ok = ok_rows(raw)
    if ok.empty:
        return pd.DataFrame(columns=["strategy", "max_depth", "max_params", "capacity_ratio"])
    base = ok[ok["strategy"] == "none"]
    none_params = float(base["max_params"].iloc[0]) if len(base) else np.nan
    ok["capacity_ratio"] = ok["max_params"] / none_params if none_params and none_params > 0 else np.nan
    return ok.reset_index(drop=True)


FAILURE_KEYS = ("strategy", "depth", "width", "budget_mb")


def write(cfg: dict, study_dir: Path) -> None:
    started = time.time()
    run = StudyDir(study_dir)
    raw = {k: read_or_empty(run.raw_table(k)) for k in ("steps", "capacity")}
    write_table(tradeoff(raw["steps"]), run.table("tradeoff"), cfg, started)
    write_table(capacity(raw["capacity"]), run.table("capacity"), cfg, started)
    write_table(tiers.table(ok_rows(raw["steps"])), run.table("tiers"), cfg, started)
    write_table(failures_table(raw, FAILURE_KEYS), run.table("failures"), cfg, started)
