"""The partitioned model's own claims: partitioned_exact (equal to the whole model in float64 on every
exactness layout) and loss_falls (training learns)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hpcdl.platform import claim, every, not_measured
from hpcdl.studies.spatial.claim_families.runs import run_missing


def claim_exact(block: dict, ex: pd.DataFrame) -> dict:
    tol = block["exactness"]["tolerance"]
    statement = (f"float64 partitioned model equals the whole model within {tol:g} relative (loss, input and "
                 "parameter gradients), on every configured exactness layout")
    cols = ["err_loss", "err_grad_input", "err_grad_params"]
    holds, missing, worst = {}, {}, {}
    for lay in block["exactness"]["layouts"]:
        name = "x".join(map(str, lay))
        rows = ex[ex["layout"].astype(str) == name] if "layout" in ex else ex[:0]
        if rows.empty or rows[cols].isna().any(axis=None):
            missing[name] = "no exactness result for this layout"
            continue
        worst[name] = float(rows[cols].max().max())
        holds[name] = worst[name] <= tol
    return every("partitioned_exact", statement, holds, missing, max_relative_error=worst, tolerance=tol)


def claim_loss(block: dict, loss: pd.DataFrame, raw: pd.DataFrame, runs: list[str]) -> dict:
    drop = block["claims"]["loss_drop"]
    train = next(r for r in runs if r.startswith("train"))
    tr = (loss[loss["run"] == train].sort_values("iteration")["loss"].to_numpy() if "run" in loss
          else np.empty(0))
    n = max(1, min(10, len(tr) // 3))
    statement = f"training learns: mean loss of the last {n} iterations < {drop} x the first {n}"
    if len(tr) < 2 or not np.isfinite(tr).all():
        why = run_missing(raw, train) if len(tr) == 0 else f"run {train} logged {len(tr)} finite losses"
        return not_measured("loss_falls", statement, why, threshold_ratio=drop)
    first, last = float(tr[:n].mean()), float(tr[-n:].mean())
    return claim("loss_falls", statement, last < drop * first, first_loss=first, last_loss=last,
                 threshold_ratio=drop, iterations=len(tr))
