"""The hidden-transfer claim (hidden_fraction): for each offload strategy at the largest size, the
share of its transfer time hidden behind compute, judged on the 95 % interval of its measured steps'
own fractions (hpcdl.platform's intervals): a value at the threshold straddles instead of passing by
a hair."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hpcdl.platform import CONFIDENCE, above, every, interval_for, why_point_missing
from hpcdl.studies.offload.verdicts.common import row

OFFLOADS = ["optimizer", "activations", "both"]


def _step_fractions(r: pd.Series) -> list[float] | None:
    """A point's measured steps' own hidden fractions (train.py), those with a transfer; None for a
    table from before they were recorded."""
    if "hidden_frac_steps" not in r.index:
        return None
    text = "" if pd.isna(r["hidden_frac_steps"]) else str(r["hidden_frac_steps"])
    return [v for v in (float(x) for x in text.split()) if np.isfinite(v)]


def finding(c: dict) -> str | None:
    """The strategies whose fraction missed the line, with their pooled fractions (None: none missed)."""
    m = c["measured"]
    missed = [s for s, held in m.get("holds", {}).items() if held is False]
    if not missed:
        return None
    return (", ".join(f"'{s}' hides {m['hidden_frac'][s]:g} of its transfer time" for s in missed)
            + f" (the claim: >= {m['threshold']:g} on its steps' interval)")


def claim_hidden(tr, block, fails) -> dict:
    cid = "hidden_fraction"
    least = block["claims"]["hidden_min"]
    statistic = block["claims"].get("hidden_statistic", "mean")
    trimmed = statistic == "trimmed_mean"
    offloads = [s for s in OFFLOADS if s in block["strategies"]]
    top = max(block["model"]["depths"])
    judged = ("the 20 % trimmed mean of its measured steps' hidden fractions (from 5 steps on), judged on "
              "Yuen's" if trimmed else "the mean of its measured steps' hidden fractions, judged on its")
    statement = (
        f">= {least:.0%} of transfer time hidden behind compute, for each of the offload strategies "
        f"{', '.join(offloads) or '(none configured)'} at the largest size ({top} layers): {judged} "
        f"{CONFIDENCE:.0%} interval (straddles where the interval crosses the line); the fraction pooled "
        "over the steps beside it"
    )
    holds, missing, fractions, intervals = {}, {}, {}, {}
    for s in offloads:
        r = row(tr, s, top)
        if r is None or not np.isfinite(r["hidden_frac"]):
            missing[s] = (
                why_point_missing(fails, "steps", strategy=s, depth=top) if r is None else "no transfer timed"
            )
            continue
        fractions[s] = round(float(r["hidden_frac"]), 4)
        steps = _step_fractions(r)
        if steps is None:
            missing[s] = ("tradeoff.csv predates the per-step hidden fractions (hidden_frac_steps): rerun "
                          "the study")
        elif len(steps) < 2:
            missing[s] = (f"{len(steps)} measured step(s) with a transfer; an interval needs 2 "
                          "(offload.steps - offload.warmup_steps)")
        else:
            iv = interval_for(statistic)(steps)
            intervals[s] = iv.evidence(keys=range(len(steps)))
            holds[s] = above(iv, least)
    tier = str(tr["tier"].iloc[0]) if not tr.empty else None
    return every(
        cid, statement, holds, missing, hidden_frac=fractions, hidden_frac_steps=intervals, depth=top,
        tier=tier, threshold=least
    )
