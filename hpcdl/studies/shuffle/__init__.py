"""Shuffle-fraction study: global, local and partial-Q data shuffling over real ranks, plus KAKURENBO.

Pure pieces (partition, plan, kakurenbo) are numpy only; `train` holds the rank function
that runs under `hpcdl.platform.rank_runtime.launch.run_ranks`; `run` turns one sweep point into rows.
"""

from hpcdl.platform.study import StudySpec


def _largest_world(cfg: dict) -> int:
    from hpcdl.studies.shuffle.sweep import expand

    return max(p["world_size"] for p in expand(cfg["shuffle"]))


SPEC = StudySpec(
    name="shuffle",
    title="Shuffle fraction (global / local / partial-Q, KAKURENBO)",
    raw_tables=("epochs", "points"),
    tables=("epochs", "final", "kakurenbo"),
    figures=("acc_vs_epoch", "final_acc_vs_q", "time_per_epoch_vs_q", "bytes_vs_q", "kakurenbo"),
    # one core per rank of the largest M, so no point oversubscribes
    task_units=_largest_world,
    # the batch step starts each point's ranks with srun inside this N-task allocation
    run_resources=lambda cfg: {"mem_mb": 4000, "runtime": 60, "tasks": _largest_world(cfg), "mpi": "srun"},
)
