"""The slow-tier gate of the memory and capacity claims: "not measured on this host" where the slow tier,
measured in the same run (tables/tiers.csv, tiers.py), is not `offload.claims.slow_tier_min_slowdown`
times slower than the fast tier in both directions (files through the page cache are RAM again)."""

from __future__ import annotations

import pandas as pd

from hpcdl.platform import not_measured
from hpcdl.studies.offload.tiers import too_fast


def on_this_host(c: dict, host: pd.DataFrame, block: dict) -> dict:
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
