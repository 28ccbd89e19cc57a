"""The slow-tier gate: a claim whose meaning rests on the slow tier being a slower, distinct memory is
"not measured on this host" where the slow tier, measured in the same run (tables/tiers.csv, tiers.py),
is not `offload.claims.slow_tier_min_slowdown` times slower than the fast tier in both directions
(files through the page cache are RAM again).

It covers (`GATED`), and why:
    memory_ratio, zero_memory_ratio       a fast-tier peak cut by moving bytes into the same memory is
                                          no saving
    capacity_ratio, zero_capacity_ratio   nor is a larger model under the budget that way
    hidden_fraction                       transfers to a tier as fast as RAM are cheap and trivially
                                          hidden: the fraction says nothing of hiding a real transfer
It does not cover weights_equal: the final weights do not depend on the tier's speed.

The gate only turns a claim that would otherwise pass or straddle into "not measured": a failed claim
is a finding whatever the tier (a strategy that holds more fast memory than 'none', fits fewer
parameters than 'none', or does not even hide transfers to RAM), and keeps its verdict with the
numbers and the tier's in its reason.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from hpcdl.platform import not_measured
from hpcdl.studies.offload.tiers import too_fast

GATED = ("memory_ratio", "hidden_fraction", "capacity_ratio", "zero_memory_ratio", "zero_capacity_ratio")


def on_this_host(c: dict, host: pd.DataFrame, block: dict, finding: Callable[[dict], str | None]) -> dict:
    """Claim `c` (one of GATED) through the gate; the tiers' bandwidths join its evidence. `finding`
    says in numbers what a failed claim found (its family's)."""
    least = block["claims"]["slow_tier_min_slowdown"]
    why, evidence = too_fast(host, least)
    statement = (f"{c['statement']}, onto a slow tier measured >= {least:g}x slower than the fast tier in "
                 "this run")
    measured = {**c["measured"], **evidence}
    if why is None:
        return {**c, "statement": statement, "measured": measured}
    if c["status"] == "failed":
        found = c.get("reason") or f"failed whatever the tier: {finding(c) or 'see its evidence'}"
        return {**c, "statement": statement, "measured": measured,
                "reason": f"{found}; the slow-tier gate, closed here, makes only a claim that would "
                          f"otherwise pass or straddle not measured ({why})"}
    other = [c["reason"].removeprefix("not measured: ")] if c["status"] == "not_measured" else []
    return not_measured(c["id"], statement, [why, *other], **measured)
