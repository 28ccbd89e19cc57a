"""Shuffle-fraction study as a PyCOMPSs application: each sweep point is one task launching its M ranks.

    python -m tasks.shuffle --config configs/default.yaml          # local backend
    python -m hpcdl.runtime.compss command shuffle --config FILE    # prints the runcompss command line

Writes raw/epochs.csv (one row per point, epoch and rank) and raw/points.csv (one row per
point with its status; a failed point keeps its error). HPCDL_SHUFFLE_KILL="POINT:RANK:EPOCH"
makes RANK of sweep point POINT ("*" = every partial point) die inside its exchange of
EPOCH (fault-injection for tests).
"""

from __future__ import annotations

import os
import sys
import time

import pandas as pd

from hpcdl.config import study_dir
from hpcdl.results import write_table
from hpcdl.runtime import compss_wait_on, constraint, failure_reason, on_failure, task
from hpcdl.runtime.app import start_app
from hpcdl.shuffle import data as shuffle_data
from hpcdl.shuffle import run, sweep

KILL_ENV = "HPCDL_SHUFFLE_KILL"


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="$HPCDL_SHUFFLE_UNITS")
@task(returns=1)
def run_point(point, train, data, timeout_s, kill):
    return run.run_point(point=point, train=train, data=data, timeout_s=timeout_s, kill=kill)


def _kill_for(point: dict) -> dict | None:
    spec = os.environ.get(KILL_ENV, "")
    if not spec:
        return None
    target, rank, epoch = spec.rsplit(":", 2)
    if target == point["point"] or (target == "*" and point["strategy"] == "partial"):
        return {"rank": int(rank), "epoch": int(epoch)}
    return None


def main(argv=None) -> None:
    cfg = start_app("shuffle", argv, __doc__.splitlines()[0])
    block = cfg["shuffle"]
    out = study_dir(cfg, "shuffle")
    started = time.time()
    data = shuffle_data.prepare(cfg["data"]["fashion_mnist_dir"], out / "cache", block["n_train"],
                                block["n_val"], seed=block["seeds"][0])
    points = sweep.expand(block)
    train = {k: block[k] for k in ("epochs", "batch_size", "lr", "momentum", "model", "alpha",
                                   "exchange_timeout_s")}
    print(f"[shuffle] {len(points)} sweep points", file=sys.stderr, flush=True)
    futures = [run_point(p, train, data, block["point_timeout_s"], _kill_for(p)) for p in points]
    results = compss_wait_on(futures)
    rows, status = [], []
    for p, fut, res in zip(points, futures, results, strict=True):
        if res is None:
            reason = failure_reason(fut) or "task failed"
            status.append({**p, "status": "failed", "error": reason[-2000:], "point_wall_s": float("nan")})
            print(f"[shuffle] point {p['point']} FAILED: {reason.splitlines()[0] if reason else ''}",
                  file=sys.stderr, flush=True)
            continue
        rows.extend(res)
        status.append({**p, "status": "ok", "error": "", "point_wall_s": res[0]["point_wall_s"]})
    raw = out / "raw"
    write_table(pd.DataFrame(rows), raw / "epochs.csv", cfg, started)
    write_table(pd.DataFrame(status), raw / "points.csv", cfg, started)


if __name__ == "__main__":
    main()
