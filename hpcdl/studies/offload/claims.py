"""Claims stage of the memory-offload study: tables/ -> the four claims (memory ratio, hidden transfer
fraction, bit-identical weights, capacity ratio), their thresholds from the config (`offload.claims`).

The memory claims are judged on the measured fast-tier peak of the same run (`peak_fast_bytes`: CUDA,
torch.cuda.max_memory_allocated; CPU, the anonymous RSS high-water mark above the run's start). The tensor
registry's peak (`peak_accounted_bytes`) is a cross-check in the evidence, flagged where the two ratios
are more than `cross_check_factor` apart. Both are judged only where the slow tier, measured in the same
run (tables/tiers.csv, tiers.py), is at least `slow_tier_min_slowdown` times slower than the fast tier in
both directions; elsewhere (files through the page cache are RAM) they are "not measured on this host".

The hidden fraction is judged per strategy on the 95 % interval of its measured steps' own fractions
(hpcdl.platform's intervals): a value at the threshold straddles instead of passing by a hair.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import (
    CONFIDENCE,
    FAILURE_COLUMNS,
    StudyDir,
    above,
    claim,
    deterministic,
    every,
    interval_for,
    measured_afresh,
    not_measured,
    read_or_empty,
    read_tables,
    unseeded,
    why_point_missing,
)
from hpcdl.studies.offload.sweep import CPU_ONLY_SKIPPED
from hpcdl.studies.offload.tiers import too_fast

CLAIMS = ("memory_ratio", "hidden_fraction", "weights_equal", "capacity_ratio")
# where each verdict is confirmed (hpcdl.platform.kit.confirmation): sizes come from the config, values
# from the seed, and no memory peak or timing depends on the values
CONFIRMATION = {
    "memory_ratio": unseeded("measured peaks of this run: tensor sizes, not the seeded values, decide them"),
    "hidden_fraction": measured_afresh("transfer and step times of this run"),
    "weights_equal": deterministic("each strategy's weights equal those of 'none' bit for bit, from one "
                                   "seed"),
    "capacity_ratio": unseeded("the largest depth whose measured peak fits the budget: tensor sizes, not the "
                               "seeded values, decide it"),
}
OFFLOADS = ["optimizer", "activations", "both"]
MEASURED_BY = {"ram>file": "anonymous RSS high-water mark",
               "gpu>pinned_host": "torch.cuda.max_memory_allocated"}  # as train.MEASURED_BY, by tier
UNKNOWN_MEASURE = "RSS high-water mark on CPU, allocator peak on CUDA"


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    # tiers: both tiers' bandwidths, measured in the same run: is the slow tier slower here?
    tr, cap, host = read_tables(study_dir, "tradeoff", "capacity", "tiers")
    fails = read_or_empty(StudyDir(study_dir).table("failures"), columns=FAILURE_COLUMNS)
    block = cfg["offload"]
    return [
        _on_this_host(_claim_memory(tr, block, fails), host, block),
        _claim_hidden(tr, block, fails),
        _claim_weights(tr, block, fails),
        _on_this_host(_claim_capacity(cap, tr, block, fails), host, block),
    ]


def _on_this_host(c: dict, host: pd.DataFrame, block: dict) -> dict:
    """A memory or capacity claim, not measured on this host where the slow tier, measured in the
    same run (tiers.csv), is not `slow_tier_min_slowdown` times slower than the fast tier in both
    directions: memory moved to the page cache is still RAM. The bandwidths join its evidence."""
    least = block["claims"]["slow_tier_min_slowdown"]
    why, evidence = too_fast(host, least)
    statement = (f"{c['statement']}, onto a slow tier measured >= {least:g}x slower than the fast tier in "
                 "this run")
    measured = {**c["measured"], **evidence}
    if why is None:
        return {**c, "statement": statement, "measured": measured}
    other = [c["reason"].removeprefix("not measured: ")] if c["status"] == "not_measured" else []
    return not_measured(c["id"], statement, [why, *other], **measured)


def _row(tr: pd.DataFrame, strategy: str, depth: int):
    if tr.empty:
        return None
    d = tr[(tr["strategy"] == strategy) & (tr["depth"] == depth)]
    return d.iloc[0] if len(d) else None


def _largest_both_ran(tr: pd.DataFrame, a: str, b: str) -> int | None:
    if tr.empty:
        return None
    depths = set(tr[tr["strategy"] == a]["depth"]) & set(tr[tr["strategy"] == b]["depth"])
    return int(max(depths)) if depths else None


def _tier(tr: pd.DataFrame, block: dict) -> str | None:
    """The tier the run measured (from its rows), else the one the config forces, else unknown."""
    if not tr.empty and "tier" in tr:
        return str(tr["tier"].iloc[0])
    return {"cpu": "ram>file", "cuda": "gpu>pinned_host"}.get(block["device"])


def _cross_check(measured: float, accounted: float, factor: float) -> str:
    """Whether the registry's ratio agrees with the measured one (evidence only, not the verdict)."""
    if not (accounted > 0 and measured > 0):
        return "no registry ratio to compare"
    apart = max(measured, accounted) / min(measured, accounted)
    if apart > factor:
        return (f"DISAGREE: measured ratio {measured:.3f} vs registry {accounted:.3f}, {apart:.2f}x apart "
                f"(> {factor:g}x): the registry does not account for what the process holds")
    return f"agree within {factor:g}x ({apart:.2f}x apart)"


def _lacking(block: dict, *strategies: str) -> str | None:
    """Why a claim comparing `strategies` cannot be measured: the config runs only some of them."""
    need = sorted(set(strategies) - set(block["strategies"]))
    return f"offload.strategies lacks {need}" if need else None


def _claim_memory(tr, block, fails) -> dict:
    cid = "memory_ratio"
    limit = block["claims"]["memory_max_ratio"]
    tier = _tier(tr, block)
    statement = (f"optimizer + activation offload ('both') cuts the measured peak fast-tier memory "
                 f"({MEASURED_BY.get(tier, UNKNOWN_MEASURE)}) to <= {limit:g} of 'none' at the largest size "
                 "both ran")
    if lacking := _lacking(block, "none", "both"):
        return not_measured(cid, statement, lacking, threshold=limit)
    depth = _largest_both_ran(tr, "none", "both")
    if depth is None:
        top = max(block["model"]["depths"])
        return not_measured(
            cid,
            statement,
            [
                why_point_missing(fails, "steps", strategy=s, depth=top)
                for s in ("none", "both")
                if _row(tr, s, top) is None
            ],
            threshold=limit,
        )
    r, n = _row(tr, "both", depth), _row(tr, "none", depth)
    if "peak_measured_by" not in tr:  # peak_fast_bytes was the registry's on CPU before
        return not_measured(cid, statement, "tradeoff.csv predates the measured peak (peak_measured_by): "
                            "rerun the study", threshold=limit)
    if not n["peak_fast_bytes"] > 0:
        return not_measured(cid, statement, f"'none' at {depth} layers has no measured peak", threshold=limit)
    ratio = float(r["peak_fast_bytes"] / n["peak_fast_bytes"])
    accounted = float(r["peak_accounted_bytes"] / n["peak_accounted_bytes"])
    return claim(
        cid,
        statement,
        ratio <= limit,
        depth=depth,
        memory_ratio=round(ratio, 4),
        measured_by=str(r["peak_measured_by"]),
        both_peak_fast_bytes=int(r["peak_fast_bytes"]),
        none_peak_fast_bytes=int(n["peak_fast_bytes"]),
        registry_ratio=round(accounted, 4),
        both_peak_accounted_bytes=int(r["peak_accounted_bytes"]),
        none_peak_accounted_bytes=int(n["peak_accounted_bytes"]),
        cross_check=_cross_check(ratio, accounted, block["claims"]["cross_check_factor"]),
        tier=str(r["tier"]),
        threshold=limit,
    )


def _step_fractions(r: pd.Series) -> list[float] | None:
    """A point's measured steps' own hidden fractions (train.py), those with a transfer; None for a
    table from before they were recorded."""
    if "hidden_frac_steps" not in r.index:
        return None
    text = "" if pd.isna(r["hidden_frac_steps"]) else str(r["hidden_frac_steps"])
    return [v for v in (float(x) for x in text.split()) if np.isfinite(v)]


def _claim_hidden(tr, block, fails) -> dict:
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
        r = _row(tr, s, top)
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


def _claim_weights(tr, block, fails) -> dict:
    cid = "weights_equal"
    tier = _tier(tr, block)
    # on CPU torch's save_on_cpu has nothing to move (its saved tensors already are in host memory): the
    # sweep does not run it there (sweep.CPU_ONLY_SKIPPED), so the claim names what it compares
    absent = {s: why for s, why in CPU_ONLY_SKIPPED.items()
              if s in block["strategies"] and tier == "ram>file"}
    compared = [s for s in block["strategies"] if s != "none" and s not in absent]
    statement = (
        f"{', '.join(compared) or 'no offload strategy'} each train to bit-identical weights (sha256 of the "
        "final parameters) as 'none', same seed and steps, at every size"
        + "".join(f"; {s} not compared on this tier ({why})" for s, why in absent.items())
    )
    if "none" not in block["strategies"]:
        return not_measured(cid, statement, "offload.strategies lacks 'none'")
    holds, missing = {}, {}
    for d in sorted(block["model"]["depths"]):
        for s in compared:
            r, n = _row(tr, s, d), _row(tr, "none", d)
            if r is None or n is None:
                missing[f"{s}/{d}L"] = "; ".join(
                    why_point_missing(fails, "steps", strategy=x, depth=d)
                    for x, row in ((s, r), ("none", n))
                    if row is None
                )
                continue
            holds[f"{s}/{d}L"] = str(r["weights_sha256"]) == str(n["weights_sha256"])
    return every(
        cid, statement, holds, missing, compared=compared, not_compared=absent,
        required="sha256 equal to none's", tolerance="0 (bit-identical)"
    )


def _claim_capacity(cap, tr, block, fails) -> dict:
    cid = "capacity_ratio"
    budget = block["capacity"]["budget_mb"]
    least = block["claims"]["capacity_min_ratio"]
    statement = (f"under a {budget:g} MiB fast-tier budget on the measured peak "
                 f"({MEASURED_BY.get(_tier(tr, block), UNKNOWN_MEASURE)}), 'both' trains >= {least:g}x "
                 "the parameters of 'none' (AxoNN's parameters-per-GPU gain)")
    if lacking := _lacking(block, "none", "both"):
        return not_measured(cid, statement, lacking, threshold=least)
    rows = {
        s: (cap[cap["strategy"] == s].iloc[0] if not cap.empty and (cap["strategy"] == s).any() else None)
        for s in ("none", "both")
    }
    absent = [s for s, r in rows.items() if r is None]
    if absent:
        return not_measured(
            cid,
            statement,
            [why_point_missing(fails, "capacity", strategy=s) for s in absent],
            threshold=least,
        )
    n, b = rows["none"], rows["both"]
    if "peak_measured_by" not in cap:  # a search that fitted on the registry alone (before)
        return not_measured(cid, statement, "capacity.csv predates the measured peak (peak_measured_by): "
                            "rerun the study", threshold=least)
    if int(n["max_params"]) == 0:
        return not_measured(
            cid, statement, "'none' fits not even one layer under the budget", threshold=least
        )
    ratio = float(b["max_params"]) / float(n["max_params"])
    capped = bool(str(b.get("capped_at_max_depth", False)).lower() == "true")
    if capped and ratio < least:
        return not_measured(
            cid,
            statement,
            "'both' reached offload.capacity.max_depth: its capacity is a lower bound",
            capacity_ratio=round(ratio, 4),
            threshold=least,
        )
    return claim(
        cid,
        statement,
        ratio >= least,
        capacity_ratio=round(ratio, 4),
        none_max_depth=int(n["max_depth"]),
        both_max_depth=int(b["max_depth"]),
        none_max_params=int(n["max_params"]),
        both_max_params=int(b["max_params"]),
        capped_at_max_depth=capped,
        # the registry at each side's largest fitting depth, as a cross-check of what the budget held
        both_peak_fast_bytes=int(b["peak_fast_bytes_at_max"]),
        both_peak_accounted_bytes=int(b["peak_accounted_bytes_at_max"]),
        none_peak_fast_bytes=int(n["peak_fast_bytes_at_max"]),
        none_peak_accounted_bytes=int(n["peak_accounted_bytes_at_max"]),
        threshold=least,
    )
