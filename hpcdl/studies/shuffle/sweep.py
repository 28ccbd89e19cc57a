"""Expand the `shuffle:` config block into sweep points (one task each).

Q = 0 is run as `local`, Q = 1 as `global`, anything between as `partial`. A global point
reads from the whole dataset, so it does not depend on the partitioning: it runs once per M
with partitioning "shared" and serves as the baseline of both partitionings.

A point trains once per entry of its `runs` (seed, hiding fraction F, round), one after the other
within one launch of its M ranks: starting ranks costs more than a laptop-scale training run, so
the seeds of one configuration share it. The claims' comparisons (global, local and partial at
`claim_q`) run every seed of `seeds`; the other Q values of the sweep run `q_sweep_seeds`.

KAKURENBO is one point of global shuffling at its M whose runs interleave the hiding fractions
round by round, one round per seed: F = 0, every F > 0 (the order reversed every other round), F = 0
again. F and the two F = 0 runs bracketing it share the seed and run seconds apart, so the paired
time saving (against the bracket's mean) sees the same machine drift on both sides, and the two
F = 0 runs of a round measure the noise of such a pair on their own. A warm-up run (round -1,
F = 0) comes first, so the first timed run does not also pay the launch's first-touch costs
(allocator, gloo buffers, page cache); the tables leave it out. `slot` is a run's place in its round.
"""

from __future__ import annotations


def strategy_for(q: float) -> str:
    return "local" if q == 0 else "global" if q == 1 else "partial"


def point_id(p: dict) -> str:
    if p.get("kakurenbo"):
        return f"kakurenbo-M{p['world_size']}"
    return f"{p['strategy']}-q{p['q']:g}-{p['partitioning']}-M{p['world_size']}"


WARMUP_ROUND = -1


def kakurenbo_runs(fractions: list[float], seeds: list[int]) -> list[dict]:
    """The interleaved order: a warm-up, then round r with the r-th seed: F = 0, every F > 0
    (reversed on odd rounds), F = 0."""
    fs = sorted({float(f) for f in fractions if f > 0})
    runs = [{"seed": int(seeds[0]), "kakurenbo_fraction": 0.0, "round": WARMUP_ROUND, "slot": 0}]
    for r, seed in enumerate(seeds):
        order = [0.0, *(fs if r % 2 == 0 else fs[::-1]), 0.0]
        runs += [{"seed": int(seed), "kakurenbo_fraction": f, "round": r, "slot": i}
                 for i, f in enumerate(order)]
    return runs


def plain_runs(seeds: list[int]) -> list[dict]:
    return [{"seed": int(s), "kakurenbo_fraction": 0.0, "round": r, "slot": 0} for r, s in enumerate(seeds)]


def sweep_seeds(block: dict) -> list[int]:
    return list(block.get("q_sweep_seeds") or block["seeds"][:1])


def expand(block: dict) -> list[dict]:
    points: dict[str, dict] = {}
    claim_qs = {0.0, float(block["claim_q"]), 1.0}

    def add(p: dict) -> None:
        p["point"] = point_id(p)
        points.setdefault(p["point"], p)

    for grid in block["grids"]:
        for m in grid["world_sizes"]:
            for q in grid["qs"]:
                strategy = strategy_for(q)
                seeds = block["seeds"] if float(q) in claim_qs else sweep_seeds(block)
                for part in (["shared"] if strategy == "global" else grid["partitionings"]):
                    add({"strategy": strategy, "q": float(q), "partitioning": part, "world_size": int(m),
                         "kakurenbo": False, "runs": plain_runs(seeds)})
    kk = block["kakurenbo"]
    if any(f > 0 for f in kk["fractions"]):
        add({"strategy": "global", "q": 1.0, "partitioning": "shared", "world_size": int(kk["world_size"]),
             "kakurenbo": True, "runs": kakurenbo_runs(kk["fractions"], kk.get("seeds") or block["seeds"])})
    return list(points.values())
