"""What the shuffle task app's task body runs (tasks/shuffle.py): one sweep point, whose M ranks
run `train.train_rank` (every run of the point in turn) under the rank runtime; their per-epoch
records become the point's rows, one per run, epoch and rank."""

from __future__ import annotations

import time

from hpcdl.platform.rank_runtime.launch import run_ranks

SAMPLE_BYTES = 28 * 28 * 4 + 8 + 8   # float32 image + int64 label + int64 sample id


def run_point(*, point: dict, train: dict, data: dict, timeout_s: float = 600.0,
              kill: dict | None = None) -> list[dict]:
    """`point`: strategy, q, partitioning, world_size, runs (hpcdl.studies.shuffle.sweep) (+ labels).

    `train`: epochs, batch_size, lr, momentum, model, alpha, exchange_timeout_s.
    Raises hpcdl.platform.rank_runtime.launch.RankFailure when any rank fails.
    """
    started = time.time()
    kwargs = dict(data=data, strategy=point["strategy"], q=float(point["q"]),
                  partitioning=point["partitioning"], alpha=float(train["alpha"]), runs=list(point["runs"]),
                  epochs=int(train["epochs"]), batch_size=int(train["batch_size"]), lr=float(train["lr"]),
                  momentum=float(train["momentum"]), model=dict(train["model"]),
                  exchange_timeout_s=float(train["exchange_timeout_s"]), kill=kill)
    results = run_ranks("hpcdl.studies.shuffle.train:train_rank", int(point["world_size"]), kwargs,
                        timeout_s=timeout_s, threads_per_rank=1)
    wall = time.time() - started
    labels = {k: v for k, v in point.items() if k != "runs"}
    rows = []
    for res in results:
        for rec in res["records"]:
            rows.append({**labels, **rec, "point_wall_s": wall, "status": "ok", "error": ""})
    return rows
