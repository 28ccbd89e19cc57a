"""Shuffle-fraction study as a PyCOMPSs application: each sweep point is one task launching its M ranks.

    python -m tasks.shuffle --config configs/default.yaml          # local backend
    python -m hpcdl compss command shuffle --config FILE    # prints the runcompss command line

Writes raw/epochs.csv (one row per point, run, epoch and rank, with the rank's device) and
raw/points.csv (one row per point with its status and the study's device; a failed point keeps its
error). The device is `shuffle.device`, resolved once here; every point's ranks run on it.
HPCDL_SHUFFLE_KILL="POINT:RANK:EPOCH" makes RANK of sweep point POINT ("*" = every partial point)
die inside its exchange of EPOCH (fault-injection for tests). Every point's record is kept in
<results>/shuffle/points/ as it finishes (hpcdl.platform.kit.points): a rerun after a kill runs only the
points not finished yet.
"""

from __future__ import annotations

import os
import sys

import pandas as pd

from hpcdl.platform.task_app import failed_row, start_app, study_task, write_table
from hpcdl.studies.shuffle import compute, sweep
from hpcdl.studies.shuffle import data as shuffle_data

KILL_ENV = "HPCDL_SHUFFLE_KILL"


@study_task("shuffle")
def run_point(point, train, data, timeout_s, kill, device, gpu_sharing, slot):
    return slot.run(compute.run_point, point=point, train=train, data=data, timeout_s=timeout_s, kill=kill,
                    device=device, gpu_sharing=gpu_sharing)


def _kill_for(point: dict) -> dict | None:
    spec = os.environ.get(KILL_ENV, "")
    if not spec:
        return None
    target, rank, epoch = spec.rsplit(":", 2)
    if target == point["point"] or (target == "*" and point["strategy"] == "partial"):
        return {"rank": int(rank), "epoch": int(epoch)}
    return None


def main(argv=None) -> None:
    run = start_app("shuffle", argv, __doc__.splitlines()[0])
    cfg = run.cfg
    block = cfg["shuffle"]
    # resolved once and recorded (start_app has refused `cuda` without a GPU): every point's ranks run on it
    device = run.device
    sharing = bool(block.get("gpu_sharing", False))
    data = shuffle_data.prepare(cfg["data"]["fashion_mnist_dir"], run.dir / "cache", block["n_train"],
                                block["n_val"], seed=block["seeds"][0])
    points = sweep.expand(block)
    train = {k: block[k] for k in ("epochs", "batch_size", "lr", "momentum", "model", "alpha",
                                   "exchange_timeout_s", "exchange_device")}
    shared = " (ranks share GPUs over gloo where M exceeds them)" if device == "cuda" and sharing else ""
    print(f"[shuffle] {len(points)} sweep points on {device}{shared}", file=sys.stderr, flush=True)
    # The key covers what the task computes from: the point, the training settings, the data files
    # (their path holds a hash of what made them), the device (and on CUDA whether ranks may share a
    # GPU); not the timeout or a test's kill injection.
    where = {"device": device, **({"gpu_sharing": sharing} if device == "cuda" else {})}
    batch = run.submit("point", points, lambda p, slot: run_point(
        p, train, data, block["point_timeout_s"], _kill_for(p), device, sharing, slot),
        inputs=lambda p: {"point": p, "train": train, "data": data, **where})
    (outcomes,) = run.gather([batch])
    rows, status = [], []
    for o in outcomes:
        labels = {**{k: v for k, v in o.point.items() if k != "runs"}, "runs": len(o.point["runs"]),
                  "device": device}
        if not o.ok:
            status.append({**failed_row(labels, o.error), "point_wall_s": float("nan")})
            last = o.error.strip().splitlines()[-1] if o.error.strip() else ""
            print(f"[shuffle] point {o.point['point']} FAILED: {last}", file=sys.stderr, flush=True)
            continue
        rows.extend(o.result)
        status.append({**labels, "status": "ok", "error": "", "point_wall_s": o.result[0]["point_wall_s"]})
    raw = run.raw
    write_table(pd.DataFrame(rows), raw / "epochs.csv", cfg, run.started)
    write_table(pd.DataFrame(status), raw / "points.csv", cfg, run.started)
    run.write_summary()


if __name__ == "__main__":
    main()
