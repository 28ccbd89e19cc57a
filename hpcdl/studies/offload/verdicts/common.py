"""What the offload claim families share: the papers' lines, how each tier's peak is measured, and
the look-ups into the run's tables."""

from __future__ import annotations

import pandas as pd

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
DESCRIBED = {"both": "optimizer + activation offload ('both')",
             "zero_offload": "ZeRO-Offload's design ('zero_offload': parameters and gradients in the "
                             "training precision in the fast tier, fp32 master weights, Adam's moments and "
                             "step on the host)"}
MEASURED_BY = {"ram>file": "anonymous RSS high-water mark",
               "gpu>pinned_host": "torch.cuda.max_memory_allocated"}  # as train.MEASURED_BY, by tier
UNKNOWN_MEASURE = "RSS high-water mark on CPU, allocator peak on CUDA"


def shown(x) -> str:
    """A threshold as the statement shows it ('?' where a partial config leaves it out)."""
    return "?" if x is None else f"{x:g}"


def paper(cid: str, precision: str) -> dict:
    """The claim's published line and source, and the precision it was judged at (its evidence)."""
    return {"paper_source": PAPER_LINES[cid]["source"], "paper_line": PAPER_LINES[cid]["line"],
            "precision": precision}


def precision_of(df: pd.DataFrame, block: dict) -> str:
    """The precision the run trained at (its rows), else the config's (fp32 before the key existed)."""
    if not df.empty and "precision" in df and df["precision"].notna().any():
        return str(df["precision"].dropna().iloc[0])
    return str(block.get("precision", "fp32"))


def row(tr: pd.DataFrame, strategy: str, depth: int):
    if tr.empty:
        return None
    d = tr[(tr["strategy"] == strategy) & (tr["depth"] == depth)]
    return d.iloc[0] if len(d) else None


def largest_both_ran(tr: pd.DataFrame, a: str, b: str) -> int | None:
    if tr.empty:
        return None
    depths = set(tr[tr["strategy"] == a]["depth"]) & set(tr[tr["strategy"] == b]["depth"])
    return int(max(depths)) if depths else None


def tier_of(tr: pd.DataFrame, block: dict) -> str | None:
    """The tier the run measured (from its rows), else the one the config forces, else unknown."""
    if not tr.empty and "tier" in tr:
        return str(tr["tier"].iloc[0])
    return {"cpu": "ram>file", "cuda": "gpu>pinned_host"}.get(block["device"])


def lacking(block: dict, *strategies: str) -> str | None:
    """Why a claim comparing `strategies` cannot be measured: the config runs only some of them."""
    need = sorted(set(strategies) - set(block["strategies"]))
    return f"offload.strategies lacks {need}" if need else None


def failed_whatever_the_tier(c: dict, finding: str) -> dict:
    """A failed claim whose failure no tier could turn into a pass, with the numbers as its reason."""
    return {**c, "reason": f"failed whatever the tier: {finding}"}
