"""Expand the `shuffle:` config block into sweep points (one task each).

Q = 0 is run as `local`, Q = 1 as `global`, anything between as `partial`. A global point
reads from the whole dataset, so it does not depend on the partitioning: it runs once per
(M, seed) with partitioning "shared" and serves as the baseline of both partitionings.
KAKURENBO points run global shuffling at one M; F = 0 is that M's global point.
"""

from __future__ import annotations


def strategy_for(q: float) -> str:
    return "local" if q == 0 else "global" if q == 1 else "partial"


def point_id(p: dict) -> str:
    return (f"{p['strategy']}-q{p['q']:g}-{p['partitioning']}-M{p['world_size']}"
            f"-F{p['kakurenbo_fraction']:g}-s{p['seed']}")


def expand(block: dict) -> list[dict]:
    points: dict[str, dict] = {}

    def add(strategy, q, partitioning, m, seed, f=0.0):
        p = {"strategy": strategy, "q": float(q), "partitioning": partitioning, "world_size": int(m),
             "seed": int(seed), "kakurenbo_fraction": float(f)}
        p["point"] = point_id(p)
        points.setdefault(p["point"], p)

    for seed in block["seeds"]:
        for grid in block["grids"]:
            for m in grid["world_sizes"]:
                for q in grid["qs"]:
                    strategy = strategy_for(q)
                    for part in (["shared"] if strategy == "global" else grid["partitionings"]):
                        add(strategy, q, part, m, seed)
        kk = block["kakurenbo"]
        for f in kk["fractions"]:
            add("global", 1.0, "shared", kk["world_size"], seed, f)
    return list(points.values())
