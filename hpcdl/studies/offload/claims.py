"""Claims stage of the memory-offload study: tables/ -> the six claims (memory ratio, hidden transfer
fraction, equal weights, capacity ratio of Myelin's 'both'; memory and capacity ratio of ZeRO-Offload's
'zero_offload'), their thresholds from the config (`offload.claims`), each paper's line and source in
the evidence (`PAPER_LINES`, as resources/papers.yaml quotes them).

Every ratio is against 'none' at the same precision (`offload.precision`: every strategy runs at it).

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
from hpcdl.studies.offload import tolerance
from hpcdl.studies.offload.sweep import CPU_ONLY_SKIPPED
from hpcdl.studies.offload.tiers import too_fast

CLAIMS = ("memory_ratio", "hidden_fraction", "weights_equal", "capacity_ratio", "zero_memory_ratio",
          "zero_capacity_ratio")
# where each verdict is confirmed (hpcdl.platform.kit.confirmation): sizes come from the config, values
# from the seed, and no memory peak or timing depends on the values
CONFIRMATION = {
    "memory_ratio": unseeded("measured peaks of this run: tensor sizes, not the seeded values, decide them"),
    "hidden_fraction": measured_afresh("transfer and step times of this run"),
    "weights_equal": deterministic("each strategy's weights equal those of 'none' bit for bit (zero_offload: "
                                   "within tolerance.py's tolerance, its host Adam's kernels deterministic "
                                   "too), from one seed"),
    "capacity_ratio": unseeded("the largest depth whose measured peak fits the budget: tensor sizes, not the "
                               "seeded values, decide it"),
    "zero_memory_ratio": unseeded("measured peaks of this run: tensor sizes, not the seeded values, "
                                  "decide them"),
    "zero_capacity_ratio": unseeded("the largest depth whose measured peak fits the budget: tensor sizes, "
                                    "not the seeded values, decide it"),
}
# each claim's published line and its source, verbatim as resources/papers.yaml quotes them (a test
# holds the two equal)
MYELIN = {"source": "Singh and Bhatele, Myelin / AxoNN (arXiv 2110.13005; IPDPS 2022), abstract",
          "line": "Myelin is able to reduce GPU memory consumption by four times"}
AXONN = {"source": "Singh and Bhatele, Myelin / AxoNN (arXiv 2110.13005; IPDPS 2022), abstract",
         "line": "increase the number of parameters per GPU by four times, thus reducing the amount of "
                 "communication and increasing performance by over 13%"}
ZERO_OFFLOAD = {"source": "Ren et al., ZeRO-Offload (arXiv 2101.06840), abstract",
                "line": "It can train models with over 13 billion parameters on a single GPU, a 10x increase "
                        "in size compared to popular framework such as PyTorch"}
PAPER_LINES = {"memory_ratio": MYELIN, "capacity_ratio": AXONN, "zero_memory_ratio": MYELIN,
               "zero_capacity_ratio": ZERO_OFFLOAD}
# which strategy each memory and capacity claim compares with 'none', and its threshold's key
MEMORY = {"memory_ratio": ("both", "memory_max_ratio"), "zero_memory_ratio": ("zero_offload",
                                                                               "zero_memory_max_ratio")}
CAPACITY = {"capacity_ratio": ("both", "capacity_min_ratio"),
            "zero_capacity_ratio": ("zero_offload", "zero_capacity_min_ratio")}
DESCRIBED = {"both": "optimizer + activation offload ('both')",
             "zero_offload": "ZeRO-Offload's design ('zero_offload': parameters and gradients in the "
                             "training precision in the fast tier, fp32 master weights, Adam's moments and "
                             "step on the host)"}
# strategies whose update runs other kernels than none's: equal within tolerance.py's tolerance
WITHIN_TOLERANCE = ("zero_offload",)
OFFLOADS = ["optimizer", "activations", "both"]
SAMPLED = 256  # precision.SAMPLE (not imported: that module loads torch)
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
        _on_this_host(_claim_memory(tr, block, fails, "zero_memory_ratio"), host, block),
        _on_this_host(_claim_capacity(cap, tr, block, fails, "zero_capacity_ratio"), host, block),
    ]


def _g(x) -> str:
    """A threshold as the statement shows it ('?' where a partial config leaves it out)."""
    return "?" if x is None else f"{x:g}"


def _precision(df: pd.DataFrame, block: dict) -> str:
    """The precision the run trained at (its rows), else the config's (fp32 before the key existed)."""
    if not df.empty and "precision" in df and df["precision"].notna().any():
        return str(df["precision"].dropna().iloc[0])
    return str(block.get("precision", "fp32"))


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


def _claim_memory(tr, block, fails, cid: str = "memory_ratio") -> dict:
    s, key = MEMORY[cid]
    limit = block["claims"][key] if s in block["strategies"] else block["claims"].get(key)
    tier = _tier(tr, block)
    precision = _precision(tr, block)
    statement = (f"{DESCRIBED[s]} cuts the measured peak fast-tier memory "
                 f"({MEASURED_BY.get(tier, UNKNOWN_MEASURE)}) to <= {_g(limit)} of 'none' at the largest "
                 "size both ran"
                 + (f", both at {precision} (Myelin's 4x memory reduction)" if s != "both" else ""))
    paper = {"paper_source": PAPER_LINES[cid]["source"], "paper_line": PAPER_LINES[cid]["line"],
             "precision": precision}
    if lacking := _lacking(block, "none", s):
        return not_measured(cid, statement, lacking, threshold=limit, **paper)
    depth = _largest_both_ran(tr, "none", s)
    if depth is None:
        top = max(block["model"]["depths"])
        return not_measured(
            cid,
            statement,
            [
                why_point_missing(fails, "steps", strategy=x, depth=top)
                for x in ("none", s)
                if _row(tr, x, top) is None
            ],
            threshold=limit,
            **paper,
        )
    r, n = _row(tr, s, depth), _row(tr, "none", depth)
    if "peak_measured_by" not in tr:  # peak_fast_bytes was the registry's on CPU before
        return not_measured(cid, statement, "tradeoff.csv predates the measured peak (peak_measured_by): "
                            "rerun the study", threshold=limit, **paper)
    if not n["peak_fast_bytes"] > 0:
        return not_measured(cid, statement, f"'none' at {depth} layers has no measured peak", threshold=limit,
                            **paper)
    ratio = float(r["peak_fast_bytes"] / n["peak_fast_bytes"])
    accounted = float(r["peak_accounted_bytes"] / n["peak_accounted_bytes"])
    # the fast tier's model state per parameter (the registry's; e.g. 'zero_offload: 2 bytes a parameter')
    per_param = {f"{x}_fast_bytes_per_param": round(float(row["fast_bytes_per_param"]), 3)
                 for x, row in ((s, r), ("none", n))
                 if "fast_bytes_per_param" in row.index and pd.notna(row["fast_bytes_per_param"])}
    return claim(
        cid,
        statement,
        ratio <= limit,
        depth=depth,
        memory_ratio=round(ratio, 4),
        measured_by=str(r["peak_measured_by"]),
        **{f"{s}_peak_fast_bytes": int(r["peak_fast_bytes"])},
        none_peak_fast_bytes=int(n["peak_fast_bytes"]),
        registry_ratio=round(accounted, 4),
        **{f"{s}_peak_accounted_bytes": int(r["peak_accounted_bytes"])},
        none_peak_accounted_bytes=int(n["peak_accounted_bytes"]),
        **per_param,
        cross_check=_cross_check(ratio, accounted, block["claims"]["cross_check_factor"]),
        tier=str(r["tier"]),
        threshold=limit,
        **paper,
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
    exact = [s for s in compared if s not in WITHIN_TOLERANCE]
    close = [s for s in compared if s in WITHIN_TOLERANCE]
    precision = _precision(tr, block)
    steps = int(tr["steps"].max()) if not tr.empty and "steps" in tr else int(block.get("steps", 1))
    statement = (
        (f"{', '.join(exact)} each train to bit-identical weights (sha256 of the final parameters) as "
         "'none', same seed and steps, at every size" if exact or not close else "")
        + ("; " if exact and close else "")
        + "".join(f"{s} trains to the weights of 'none' at the same precision ({precision}), same seed and "
                  f"steps, at every size: bit-identical, or within sqrt(steps) / 2 = "
                  f"{tolerance.tolerance(steps):.3g} units in the last place of {precision} (root mean "
                  f"square over {SAMPLED} sampled weights; its host Adam runs other kernels than the fast "
                  "tier's)"
                  for s in close)
        + "".join(f"; {s} not compared on this tier ({why})" for s, why in absent.items())
    )
    if "none" not in block["strategies"]:
        return not_measured(cid, statement, "offload.strategies lacks 'none'")
    holds, missing, deviations = {}, {}, {}
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
            same = str(r["weights_sha256"]) == str(n["weights_sha256"])
            if same or s not in close:
                holds[f"{s}/{d}L"] = same
                continue
            a, b = (tolerance.parse_sample(x.get("weights_sample")) for x in (r, n))
            if not a or len(a) != len(b):
                missing[f"{s}/{d}L"] = ("its weights differ from none's and tradeoff.csv holds no comparable "
                                        "weights_sample: rerun the study")
                continue
            dev = tolerance.deviation(a, b, precision)
            deviations[f"{s}/{d}L"] = round(dev, 4)
            holds[f"{s}/{d}L"] = dev <= tolerance.tolerance(steps)
    within = {"within_tolerance": close, "deviation_ulps": deviations,
              "tolerance_ulps": round(tolerance.tolerance(steps), 4)} if close else {}
    return every(
        cid, statement, holds, missing, compared=compared, not_compared=absent,
        required="sha256 equal to none's" + (f" ({', '.join(exact)})" if close else ""),
        tolerance="0 (bit-identical)"
        + ("; zero_offload: sqrt(steps)/2 ulps rms (tolerance.py)" if close else ""),
        **within,
    )


def _claim_capacity(cap, tr, block, fails, cid: str = "capacity_ratio") -> dict:
    s, key = CAPACITY[cid]
    budget = block["capacity"]["budget_mb"]
    least = block["claims"][key] if s in block["strategies"] else block["claims"].get(key)
    precision = _precision(cap, block)
    gain = "AxoNN's parameters-per-GPU gain" if s == "both" else "ZeRO-Offload's model size on one GPU"
    statement = (f"under a {budget:g} MiB fast-tier budget on the measured peak "
                 f"({MEASURED_BY.get(_tier(tr, block), UNKNOWN_MEASURE)}), '{s}' trains >= {_g(least)}x "
                 f"the parameters of 'none' ({gain})" + (f", both at {precision}" if s != "both" else ""))
    paper = {"paper_source": PAPER_LINES[cid]["source"], "paper_line": PAPER_LINES[cid]["line"],
             "precision": precision}
    if lacking := _lacking(block, "none", s):
        return not_measured(cid, statement, lacking, threshold=least, **paper)
    rows = {
        x: (cap[cap["strategy"] == x].iloc[0] if not cap.empty and (cap["strategy"] == x).any() else None)
        for x in ("none", s)
    }
    absent = [x for x, r in rows.items() if r is None]
    if absent:
        return not_measured(
            cid,
            statement,
            [why_point_missing(fails, "capacity", strategy=x) for x in absent],
            threshold=least,
            **paper,
        )
    n, b = rows["none"], rows[s]
    if "peak_measured_by" not in cap:  # a search that fitted on the registry alone (before)
        return not_measured(cid, statement, "capacity.csv predates the measured peak (peak_measured_by): "
                            "rerun the study", threshold=least, **paper)
    if int(n["max_params"]) == 0:
        return not_measured(
            cid, statement, "'none' fits not even one layer under the budget", threshold=least, **paper
        )
    ratio = float(b["max_params"]) / float(n["max_params"])
    capped = bool(str(b.get("capped_at_max_depth", False)).lower() == "true")
    if capped and ratio < least:
        return not_measured(
            cid,
            statement,
            f"'{s}' reached offload.capacity.max_depth: its capacity is a lower bound",
            capacity_ratio=round(ratio, 4),
            threshold=least,
            **paper,
        )
    return claim(
        cid,
        statement,
        ratio >= least,
        capacity_ratio=round(ratio, 4),
        none_max_depth=int(n["max_depth"]),
        **{f"{s}_max_depth": int(b["max_depth"])},
        none_max_params=int(n["max_params"]),
        **{f"{s}_max_params": int(b["max_params"])},
        capped_at_max_depth=capped,
        # the registry at each side's largest fitting depth, as a cross-check of what the budget held
        **{f"{s}_peak_fast_bytes": int(b["peak_fast_bytes_at_max"])},
        **{f"{s}_peak_accounted_bytes": int(b["peak_accounted_bytes_at_max"])},
        none_peak_fast_bytes=int(n["peak_fast_bytes_at_max"]),
        none_peak_accounted_bytes=int(n["peak_accounted_bytes_at_max"]),
        threshold=least,
        **paper,
    )
