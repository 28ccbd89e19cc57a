"""Claims stage of the memory-offload study: tables/ -> the four claims (memory ratio, hidden transfer
fraction, bit-identical weights, capacity ratio) with their thresholds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform.claims import claim, every, not_measured
from hpcdl.platform.stages import FAILURE_COLUMNS, read_or_empty, why_point_missing

CLAIMS = ("memory_ratio", "hidden_fraction", "weights_equal", "capacity_ratio")
MEMORY_MAX_RATIO = 0.30
HIDDEN_MIN = 0.70
CAPACITY_MIN_RATIO = 3.0
OFFLOADS = ["optimizer", "activations", "both"]


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    tables = Path(study_dir) / "tables"
    tr = read_or_empty(tables / "tradeoff.csv")
    cap = read_or_empty(tables / "capacity.csv")
    fails = read_or_empty(tables / "failures.csv", columns=FAILURE_COLUMNS)
    block = cfg["offload"]
    return [
        _claim_memory(tr, block, fails),
        _claim_hidden(tr, block, fails),
        _claim_weights(tr, block, fails),
        _claim_capacity(cap, block, fails),
    ]


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


def _claim_memory(tr, block, fails) -> dict:
    cid = "memory_ratio"
    statement = (
        f"optimizer + activation offload ('both') cuts peak fast-tier memory to <= {MEMORY_MAX_RATIO} of "
        "'none' at the largest size both ran"
    )
    need = {"none", "both"} - set(block["strategies"])
    if need:
        return not_measured(
            cid, statement, f"offload.strategies lacks {sorted(need)}", threshold=MEMORY_MAX_RATIO
        )
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
            threshold=MEMORY_MAX_RATIO,
        )
    r, n = _row(tr, "both", depth), _row(tr, "none", depth)
    ratio = float(r["peak_fast_bytes"] / n["peak_fast_bytes"])
    return claim(
        cid,
        statement,
        ratio <= MEMORY_MAX_RATIO,
        depth=depth,
        memory_ratio=round(ratio, 4),
        both_peak_fast_bytes=int(r["peak_fast_bytes"]),
        none_peak_fast_bytes=int(n["peak_fast_bytes"]),
        rss_ratio=round(float(r["peak_extra_rss_bytes"] / n["peak_extra_rss_bytes"]), 4),
        tier=str(r["tier"]),
        threshold=MEMORY_MAX_RATIO,
    )


def _claim_hidden(tr, block, fails) -> dict:
    cid = "hidden_fraction"
    offloads = [s for s in OFFLOADS if s in block["strategies"]]
    top = max(block["model"]["depths"])
    statement = (
        f">= {HIDDEN_MIN:.0%} of transfer time hidden behind compute, for every offload strategy at the "
        f"largest size ({top} layers)"
    )
    holds, missing, fractions = {}, {}, {}
    for s in offloads:
        r = _row(tr, s, top)
        if r is None or not np.isfinite(r["hidden_frac"]):
            missing[s] = (
                why_point_missing(fails, "steps", strategy=s, depth=top) if r is None else "no transfer timed"
            )
            continue
        fractions[s] = round(float(r["hidden_frac"]), 4)
        holds[s] = fractions[s] >= HIDDEN_MIN
    tier = str(tr["tier"].iloc[0]) if not tr.empty else None
    return every(
        cid, statement, holds, missing, hidden_frac=fractions, depth=top, tier=tier, threshold=HIDDEN_MIN
    )


def _claim_weights(tr, block, fails) -> dict:
    cid = "weights_equal"
    statement = (
        "every offload strategy trains to bit-identical weights (sha256 of the final parameters) as 'none', "
        "same seed and steps, at every size"
    )
    if "none" not in block["strategies"]:
        return not_measured(cid, statement, "offload.strategies lacks 'none'")
    holds, missing = {}, {}
    for d in sorted(block["model"]["depths"]):
        for s in [s for s in block["strategies"] if s != "none"]:
            r, n = _row(tr, s, d), _row(tr, "none", d)
            if r is None or n is None:
                if s == "save_on_cpu" and not tr.empty and str(tr["tier"].iloc[0]) == "ram>file":
                    continue  # CPU run: this strategy is skipped by design (sweep.CPU_ONLY_SKIPPED)
                missing[f"{s}/{d}L"] = "; ".join(
                    why_point_missing(fails, "steps", strategy=x, depth=d)
                    for x, row in ((s, r), ("none", n))
                    if row is None
                )
                continue
            holds[f"{s}/{d}L"] = str(r["weights_sha256"]) == str(n["weights_sha256"])
    return every(
        cid, statement, holds, missing, required="sha256 equal to none's", tolerance="0 (bit-identical)"
    )


def _claim_capacity(cap, block, fails) -> dict:
    cid = "capacity_ratio"
    budget = block["capacity"]["budget_mb"]
    statement = (
        f"under a {budget:g} MiB fast-tier budget, 'both' trains >= {CAPACITY_MIN_RATIO:g}x the parameters "
        "of 'none' (Myelin's parameters-per-device gain)"
    )
    need = {"none", "both"} - set(block["strategies"])
    if need:
        return not_measured(
            cid, statement, f"offload.strategies lacks {sorted(need)}", threshold=CAPACITY_MIN_RATIO
        )
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
            threshold=CAPACITY_MIN_RATIO,
        )
    n, b = rows["none"], rows["both"]
    if int(n["max_params"]) == 0:
        return not_measured(
            cid, statement, "'none' fits not even one layer under the budget", threshold=CAPACITY_MIN_RATIO
        )
    ratio = float(b["max_params"]) / float(n["max_params"])
    capped = bool(str(b.get("capped_at_max_depth", False)).lower() == "true")
    if capped and ratio < CAPACITY_MIN_RATIO:
        return not_measured(
            cid,
            statement,
            "'both' reached offload.capacity.max_depth: its capacity is a lower bound",
            capacity_ratio=round(ratio, 4),
            threshold=CAPACITY_MIN_RATIO,
        )
    return claim(
        cid,
        statement,
        ratio >= CAPACITY_MIN_RATIO,
        capacity_ratio=round(ratio, 4),
        none_max_depth=int(n["max_depth"]),
        both_max_depth=int(b["max_depth"]),
        none_max_params=int(n["max_params"]),
        both_max_params=int(b["max_params"]),
        capped_at_max_depth=capped,
        threshold=CAPACITY_MIN_RATIO,
    )
