"""Micro-batched convolution study as a PyCOMPSs application: every network is one task.

    python -m tasks.microbatch --config configs/default.yaml     # local backend
    python -m hpcdl compss command microbatch --config FILE    # prints the runcompss command line

Each network runs on microbatch.device, resolved once here: on CUDA the candidates are cuDNN's modes
that PyTorch exposes and each task holds one GPU. A task benchmarks every candidate algorithm per
kernel and micro-batch size of one network's conv layers, plans with the DP per kernel and the ILP
over the network, executes every distinct plan and the framework's default as whole networks in
interleaved rounds, and checks exactness. Writes raw/bench.csv, plans.csv, budget.csv,
execution.csv, network_rounds.csv, exactness.csv and planning.csv. A failing network becomes a row
with status=failed and its error in every table; the rest runs. Every network's record is kept in
<results>/microbatch/points/ as it finishes (hpcdl.platform.points): a rerun runs only what is not
finished.
"""

from __future__ import annotations

import sys
import time

import pandas as pd

from hpcdl.platform.device import study_device
from hpcdl.platform.points import StudyRun, failed_row
from hpcdl.platform.results import write_table
from hpcdl.platform.task_runtime import compss_wait_on, constraint, failure_reason, on_failure, task
from hpcdl.platform.task_runtime.app import start_app
from hpcdl.studies.microbatch import compute, sweep

RAW = ("bench", "plans", "budget", "execution", "network_rounds", "exactness", "planning")


@on_failure(management="IGNORE", returns=None)
@constraint(processors=[{"processorType": "CPU", "computingUnits": "$HPCDL_MICROBATCH_UNITS"},
                        {"processorType": "GPU", "computingUnits": "$HPCDL_MICROBATCH_GPUS"}])
@task(returns=1)
def network_point(point: dict, slot) -> dict:
    return slot.run(compute.run_network, **point)


def main(argv=None) -> None:
    cfg = start_app("microbatch", argv, __doc__.splitlines()[0])
    run = StudyRun(cfg, "microbatch")
    # resolved once, here (start_app has refused `cuda` without a GPU); on cuda each task holds a GPU
    points = sweep.network_points(cfg, study_device(cfg, "microbatch"))
    print(
        f"[microbatch] {len(points)} network point(s): {', '.join(p['network_name'] for p in points)}",
        file=sys.stderr,
        flush=True,
    )
    (outcomes,) = run.gather(
        [run.submit("network", points, lambda p, slot: network_point(p, slot))],
        compss_wait_on,
        failure_reason,
    )
    tables = {name: [] for name in RAW}
    for o in outcomes:
        if not o.ok:
            for name in RAW:
                tables[name].append(failed_row({"network": o.point["network_name"]}, o.error))
            continue
        meta = o.result["meta"]
        for name in RAW:
            tables[name] += [
                {
                    **r,
                    "device": meta["device"],
                    "clock": meta["clock"],
                    "status": r.get("status", "ok"),
                    "error": "",
                }
                for r in o.result.get(name, [])  # a record stored before a table existed has none
            ]
    raw = run.dir / "raw"
    for name in RAW:
        write_table(pd.DataFrame(tables[name]), raw / f"{name}.csv", cfg, run.started)
    run.write_summary()
    failed = sum(not o.ok for o in outcomes)
    print(
        f"[microbatch] done in {time.time() - run.started:.0f} s; {failed} failed network(s)",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    main()
