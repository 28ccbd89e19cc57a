"""What the shuffle task app's task body runs (tasks/shuffle.py): one sweep point, whose M ranks
run `train.train_rank` (every run of the point in turn) under the rank runtime on the study's
resolved device; their per-epoch records become the point's rows, one per run, epoch and rank, each
naming the device it was measured on (the rank's placement) and where its samples were held."""

from __future__ import annotations

import time

from hpcdl.platform import run_ranks

SAMPLE_BYTES = 28 * 28 * 4 + 8 + 8   # float32 image + int64 label + int64 sample id


def run_point(*, point: dict, train: dict, data: dict, timeout_s: float = 600.0,
              kill: dict | None = None, device: str = "cpu", gpu_sharing: bool = False) -> list[dict]:
    """`point`: strategy, q, partitioning, world_size, runs (hpcdl.studies.shuffle.sweep) (+ labels).

    `train`: epochs, batch_size, lr, momentum, model, alpha, exchange_timeout_s[, exchange_device].
    `device`: the study's resolved device (hpcdl.platform.kit.device.study_device), cpu or cuda;
    `gpu_sharing`: the block's key (ranks may share GPUs over gloo).
    Raises hpcdl.platform.kit.rank_runtime.launch.RankFailure when any rank fails.
    """
    started = time.time()
    kwargs = dict(data=data, strategy=point["strategy"], q=float(point["q"]),
                  partitioning=point["partitioning"], alpha=float(train["alpha"]), runs=list(point["runs"]),
                  epochs=int(train["epochs"]), batch_size=int(train["batch_size"]), lr=float(train["lr"]),
                  momentum=float(train["momentum"]), model=dict(train["model"]),
                  exchange_timeout_s=float(train["exchange_timeout_s"]),
                  exchange_device=str(train.get("exchange_device", "host")), kill=kill)
    results = run_ranks("hpcdl.studies.shuffle.train:train_rank", int(point["world_size"]), kwargs,
                        timeout_s=timeout_s, threads_per_rank=1, device=device, gpu_sharing=gpu_sharing)
    wall = time.time() - started
    labels = {k: v for k, v in point.items() if k != "runs"}
    rows = []
    for res in results:
        for rec in res["records"]:
            rows.append({**labels, **rec, "point_wall_s": wall, "status": "ok", "error": ""})
    return rows
