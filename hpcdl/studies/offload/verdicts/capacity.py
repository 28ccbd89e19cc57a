"""The capacity claims (capacity_ratio: AxoNN's parameters-per-GPU gain of 'both'; zero_capacity_ratio:
ZeRO-Offload's model size of 'zero_offload'): the parameters of the largest depth that trains under
the fast-tier budget, against 'none''s. A strategy that fits fewer than 'none' fails whatever the tier:
no slow tier makes a smaller model a gain."""

from __future__ import annotations

from hpcdl.platform import claim, not_measured, why_point_missing
from hpcdl.studies.offload.verdicts.common import (
    MEASURED_BY,
    UNKNOWN_MEASURE,
    failed_whatever_the_tier,
    lacking,
    paper,
    precision_of,
    shown,
    tier_of,
)

# which strategy each capacity claim compares with 'none', and its threshold's key
CAPACITY = {"capacity_ratio": ("both", "capacity_min_ratio"),
            "zero_capacity_ratio": ("zero_offload", "zero_capacity_min_ratio")}


def finding(c: dict) -> str | None:
    """What a measured capacity claim found, in numbers (None where it measured no ratio)."""
    m, s = c["measured"], CAPACITY[c["id"]][0]
    if f"{s}_max_depth" not in m:
        return None
    fewer = "; fewer than 'none' fits" if m["capacity_ratio"] < 1 else ""
    return (f"'{s}' trains {m[f'{s}_max_depth']} layers under the budget against 'none''s "
            f"{m['none_max_depth']}, {m['capacity_ratio']:g}x its parameters (the claim: >= "
            f"{shown(m['threshold'])}x){fewer}")


def claim_capacity(cap, tr, block, fails, cid: str = "capacity_ratio") -> dict:
    s, key = CAPACITY[cid]
    budget = block["capacity"]["budget_mb"]
    least = block["claims"][key] if s in block["strategies"] else block["claims"].get(key)
    precision = precision_of(cap, block)
    gain = "AxoNN's parameters-per-GPU gain" if s == "both" else "ZeRO-Offload's model size on one GPU"
    statement = (f"under a {budget:g} MiB fast-tier budget on the measured peak "
                 f"({MEASURED_BY.get(tier_of(tr, block), UNKNOWN_MEASURE)}), '{s}' trains >= {shown(least)}x "
                 f"the parameters of 'none' ({gain})" + (f", both at {precision}" if s != "both" else ""))
    evidence = paper(cid, precision)
    if why := lacking(block, "none", s):
        return not_measured(cid, statement, why, threshold=least, **evidence)
    rows = {
        x: (cap[cap["strategy"] == x].iloc[0] if not cap.empty and (cap["strategy"] == x).any() else None)
        for x in ("none", s)
    }
    if absent := [x for x, r in rows.items() if r is None]:
        return not_measured(cid, statement, [why_point_missing(fails, "capacity", strategy=x)
                                             for x in absent], threshold=least, **evidence)
    n, b = rows["none"], rows[s]
    if "peak_measured_by" not in cap:  # a search that fitted on the registry alone (before)
        return not_measured(cid, statement, "capacity.csv predates the measured peak (peak_measured_by): "
                            "rerun the study", threshold=least, **evidence)
    if int(n["max_params"]) == 0:
        return not_measured(cid, statement, "'none' fits not even one layer under the budget",
                            threshold=least, **evidence)
    ratio = float(b["max_params"]) / float(n["max_params"])
    capped = bool(str(b.get("capped_at_max_depth", False)).lower() == "true")
    if capped and ratio < least:
        return not_measured(cid, statement, f"'{s}' reached offload.capacity.max_depth: its capacity is a "
                            "lower bound", capacity_ratio=round(ratio, 4), threshold=least, **evidence)
    c = claim(
        cid,
        statement,
        ratio >= least and ratio >= 1,
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
        **evidence,
    )
    return failed_whatever_the_tier(c, finding(c)) if ratio < 1 else c
