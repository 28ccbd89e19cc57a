"""Shuffle-fraction study: global, local and partial-Q data shuffling over real ranks, plus KAKURENBO.

Pure pieces (partition, plan, kakurenbo) are numpy only; `train` holds the rank function
that runs under `hpcdl.runtime.launch.run_ranks`; `run` turns one sweep point into rows.
"""


def task_units(cfg: dict) -> int:
    """Cores each sweep-point task reserves: one per rank of the largest M, so no point oversubscribes."""
    from hpcdl.shuffle.sweep import expand

    return max(p["world_size"] for p in expand(cfg["shuffle"]))
