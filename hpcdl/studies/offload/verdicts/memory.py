"""The fast-tier memory claims (memory_ratio: Myelin's 'both'; zero_memory_ratio: 'zero_offload'): the
measured peak fast-tier memory against 'none''s at the largest size both ran, the tensor registry's
ratio beside it as a cross-check. A strategy that holds more than 'none' (a ratio above 1) fails
whatever the tier: no slow tier makes holding more a saving."""

from __future__ import annotations

import pandas as pd

from hpcdl.platform import claim, not_measured, why_point_missing
from hpcdl.studies.offload.verdicts.common import (
    DESCRIBED,
    MEASURED_BY,
    UNKNOWN_MEASURE,
    failed_whatever_the_tier,
    lacking,
    largest_both_ran,
    paper,
    precision_of,
    row,
    shown,
    tier_of,
)

# which strategy each memory claim compares with 'none', and its threshold's key
MEMORY = {"memory_ratio": ("both", "memory_max_ratio"), "zero_memory_ratio": ("zero_offload",
                                                                               "zero_memory_max_ratio")}


def cross_check(measured: float, accounted: float, factor: float) -> str:
    """Whether the registry's ratio agrees with the measured one (evidence only, not the verdict)."""
    if not (accounted > 0 and measured > 0):
        return "no registry ratio to compare"
    apart = max(measured, accounted) / min(measured, accounted)
    if apart > factor:
        return (f"DISAGREE: measured ratio {measured:.3f} vs registry {accounted:.3f}, {apart:.2f}x apart "
                f"(> {factor:g}x): the registry does not account for what the process holds")
    return f"agree within {factor:g}x ({apart:.2f}x apart)"


def finding(c: dict) -> str | None:
    """What a measured memory claim found, in numbers (None where it measured no ratio)."""
    m, s = c["measured"], MEMORY[c["id"]][0]
    if "memory_ratio" not in m:
        return None
    more = "; more than 'none' holds" if m["memory_ratio"] > 1 else ""
    return (f"'{s}' holds {m['memory_ratio']:g} of the measured peak fast-tier memory of 'none' at "
            f"{m['depth']} layers ({m[f'{s}_peak_fast_bytes']} against {m['none_peak_fast_bytes']} bytes; "
            f"the claim: <= {shown(m['threshold'])}){more}")


def claim_memory(tr, block, fails, cid: str = "memory_ratio") -> dict:
    s, key = MEMORY[cid]
    limit = block["claims"][key] if s in block["strategies"] else block["claims"].get(key)
    precision = precision_of(tr, block)
    statement = (f"{DESCRIBED[s]} cuts the measured peak fast-tier memory "
                 f"({MEASURED_BY.get(tier_of(tr, block), UNKNOWN_MEASURE)}) to <= {shown(limit)} of 'none' "
                 "at the largest size both ran"
                 + (f", both at {precision} (Myelin's 4x memory reduction)" if s != "both" else ""))
    evidence = {"threshold": limit, **paper(cid, precision)}
    if why := lacking(block, "none", s):
        return not_measured(cid, statement, why, **evidence)
    depth = largest_both_ran(tr, "none", s)
    if depth is None:
        top = max(block["model"]["depths"])
        return not_measured(cid, statement, [why_point_missing(fails, "steps", strategy=x, depth=top)
                                             for x in ("none", s) if row(tr, x, top) is None], **evidence)
    r, n = row(tr, s, depth), row(tr, "none", depth)
    if "peak_measured_by" not in tr:  # peak_fast_bytes was the registry's on CPU before
        return not_measured(cid, statement, "tradeoff.csv predates the measured peak (peak_measured_by): "
                            "rerun the study", **evidence)
    if not n["peak_fast_bytes"] > 0:
        return not_measured(cid, statement, f"'none' at {depth} layers has no measured peak", **evidence)
    ratio = float(r["peak_fast_bytes"] / n["peak_fast_bytes"])
    c = claim(cid, statement, ratio <= limit and ratio <= 1,
              **_measured(s, r, n, depth, ratio, block["claims"]["cross_check_factor"]), **evidence)
    return failed_whatever_the_tier(c, finding(c)) if ratio > 1 else c


def _measured(s: str, r: pd.Series, n: pd.Series, depth: int, ratio: float, factor: float) -> dict:
    """The evidence of a measured memory claim, in the order its claims.json has always shown it."""
    accounted = float(r["peak_accounted_bytes"] / n["peak_accounted_bytes"])
    # the fast tier's model state per parameter (the registry's; e.g. 'zero_offload: 2 bytes a parameter')
    per_param = {f"{x}_fast_bytes_per_param": round(float(rw["fast_bytes_per_param"]), 3)
                 for x, rw in ((s, r), ("none", n))
                 if "fast_bytes_per_param" in rw.index and pd.notna(rw["fast_bytes_per_param"])}
    return {
        "depth": depth,
        "memory_ratio": round(ratio, 4),
        "measured_by": str(r["peak_measured_by"]),
        f"{s}_peak_fast_bytes": int(r["peak_fast_bytes"]),
        "none_peak_fast_bytes": int(n["peak_fast_bytes"]),
        "registry_ratio": round(accounted, 4),
        f"{s}_peak_accounted_bytes": int(r["peak_accounted_bytes"]),
        "none_peak_accounted_bytes": int(n["peak_accounted_bytes"]),
        **per_param,
        "cross_check": cross_check(ratio, accounted, factor),
        "tier": str(r["tier"]),
    }
