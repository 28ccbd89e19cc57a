"""Micro-batched convolution study as a PyCOMPSs application: one task per network (2 with cuDNN engines).

    python -m tasks.microbatch --config configs/default.yaml     # local backend
    python -m hpcdl compss command microbatch --config FILE    # prints the runcompss command line

Each network runs on microbatch.device, resolved once here: on CUDA the candidates are cuDNN's modes
that PyTorch exposes and each task holds one GPU. A task benchmarks every candidate algorithm per
kernel and micro-batch size of one network's conv layers, plans with the DP per kernel and the ILP
over the network, executes every distinct plan and the framework's default as whole networks in
interleaved rounds, and checks exactness. Writes raw/bench.csv, plans.csv, budget.csv,
execution.csv, network_rounds.csv, exactness.csv, planning.csv and stack_vetting.csv. Where the
device is cuda and microbatch.cudnn.engines is true, a second task per network runs μ-cuDNN's own
experiment (hpcdl.studies.microbatch.cudnn.study: cuDNN's engines by id under workspace limits, the
engine table as its record) into cudnn_engines.csv and cudnn_limits.csv; elsewhere those two hold their
header only. A failing network becomes a row with status=failed and its error in every table of its
task; the rest runs. Every network's record is kept in
<results>/microbatch/points/ as it finishes (hpcdl.platform.kit.points): a rerun runs only what is not
finished.
"""

from __future__ import annotations

import sys
import time

import pandas as pd

from hpcdl.platform.task_app import failed_row, start_app, study_task, write_table
from hpcdl.studies.microbatch import compute, sweep
from hpcdl.studies.microbatch.choice import vetting
from hpcdl.studies.microbatch.cudnn import study as cudnn_study
from hpcdl.studies.microbatch.tables import CUDNN_RAW, RAW

# the raw tables that may have no rows: their header, so the tables stage can still read them
HEADERS = {**cudnn_study.COLUMNS, "stack_vetting": [*vetting.COLUMNS, *cudnn_study.APP_COLUMNS]}


@study_task("microbatch")
def network_point(point: dict, slot) -> dict:
    return slot.run(compute.run_network, **point)


@study_task("microbatch")
def cudnn_point(point: dict, slot) -> dict:
    return slot.run(compute.run_cudnn_network, **point)


def _rows(outcomes, names: tuple[str, ...]) -> dict[str, list[dict]]:
    """Each raw table's rows from the outcomes: a failed network gives a failed row in every table."""
    tables = {name: [] for name in names}
    for o in outcomes:
        if not o.ok:
            for name in names:
                tables[name].append(failed_row({"network": o.point["network_name"]}, o.error))
            continue
        meta = o.result["meta"]
        for name in names:
            tables[name] += [
                {**r, "device": meta["device"], "clock": meta["clock"], "status": r.get("status", "ok"),
                 "error": ""}
                for r in o.result.get(name, [])  # a record stored before a table existed has none
            ]
    return tables


def main(argv=None) -> None:
    run = start_app("microbatch", argv, __doc__.splitlines()[0])
    cfg = run.cfg
    # resolved once and recorded (start_app has refused `cuda` without a GPU); on cuda each task holds a GPU
    device = run.device
    points = sweep.network_points(cfg, device)
    cudnn_points = sweep.cudnn_points(cfg, device)  # none unless cuda and microbatch.cudnn.engines
    print(
        f"[microbatch] {len(points)} network point(s): {', '.join(p['network_name'] for p in points)}",
        file=sys.stderr,
        flush=True,
    )
    outcomes, cudnn_outcomes = run.gather(
        [run.submit("network", points, lambda p, slot: network_point(p, slot)),
         run.submit("cudnn", cudnn_points, lambda p, slot: cudnn_point(p, slot))],
    )
    tables = {**_rows(outcomes, RAW), **_rows(cudnn_outcomes, CUDNN_RAW)}
    raw = run.raw
    # header only: cuDNN's tables where the experiment did not run (a CPU run), stack_vetting where
    # no plan was vetted
    for name in (*RAW, *CUDNN_RAW):
        rows = tables[name]
        write_table(pd.DataFrame(rows, columns=None if rows else HEADERS.get(name)), raw / f"{name}.csv", cfg,
                    run.started)
    run.write_summary()
    failed = sum(not o.ok for o in (*outcomes, *cudnn_outcomes))
    print(
        f"[microbatch] done in {time.time() - run.started:.0f} s; {failed} failed network(s)",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    main()
