"""Spatial scaling study as a PyCOMPSs application: every scaling run is one task launching its ranks.

    python -m tasks.spatial --config configs/default.yaml          # local backend
    python -m hpcdl.runtime.compss command spatial --config FILE    # prints the runcompss command line

Order: the float64 exactness check, the calibration microbenchmarks, then the scaling runs.
Each task reserves the cores of the largest run (HPCDL_SPATIAL_UNITS) and the main program
waits for each timed task before submitting the next, so no two timed runs overlap.
Writes raw/{exactness,calibration,runs,iterations,ranks}.csv (+ provenance).
"""

from __future__ import annotations

import sys
import time

import pandas as pd

from hpcdl.config import study_dir
from hpcdl.results import available_cores, write_table
from hpcdl.runtime import compss_wait_on, constraint, failure_reason, on_failure, task
from hpcdl.runtime.app import start_app
from hpcdl.spatial import runs


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="$HPCDL_SPATIAL_UNITS")
@task(returns=1)
def exactness(block, layout):
    return runs.exactness_point(block, layout)


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="$HPCDL_SPATIAL_UNITS")
@task(returns=1)
def calibrate(block, resources_dir):
    return runs.calibrate_point(block, resources_dir)


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="$HPCDL_SPATIAL_UNITS")
@task(returns=1)
def scaling_run(point, block, resources_dir):
    return runs.run_point(point, block, resources_dir)


def _log(msg: str) -> None:
    print(f"[spatial] {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> None:
    cfg = start_app("spatial", argv, __doc__.splitlines()[0])
    block, res_dir = cfg["spatial"], cfg["data"]["resources_dir"]
    out = study_dir(cfg, "spatial") / "raw"
    started = time.time()
    points = runs.expand(block)
    for p in points:  # generate every field cache once, before any task reads it
        runs.dataset_for(block, res_dir, p["shape"])

    ex = compss_wait_on([exactness(block, lay) for lay in block["exactness"]["layouts"]])
    ex_rows = [r for res in ex if res for r in res]
    write_table(pd.DataFrame(ex_rows), out / "exactness.csv", cfg, started)
    worst = max((r["err_grad_params"] for r in ex_rows), default=None)
    _log(f"exactness: {len(ex_rows)} rank rows, worst parameter-gradient error {worst}")

    fut = calibrate(block, res_dir)
    cal = compss_wait_on(fut)
    if cal is None:
        raise SystemExit(f"[spatial] calibration failed: {failure_reason(fut)}")
    write_table(pd.DataFrame(cal).assign(cores=available_cores()), out / "calibration.csv", cfg, started)

    summaries, iters, ranks = [], [], []
    for i, p in enumerate(points):
        # one at a time: a timing taken next to another run would measure the contention
        fut = scaling_run(p, block, res_dir)
        res = compss_wait_on(fut)
        if res is None:
            reason = failure_reason(fut) or "task failed"
            summaries.append({**{k: v for k, v in p.items() if k not in ("layout", "shape")},
                              "status": "failed", "error": reason[-2000:]})
            _log(f"run {p['run']} FAILED: {reason.splitlines()[0] if reason else ''}")
            continue
        summaries.append(res["summary"])
        iters += res["iterations"]
        ranks += res["ranks"]
        _log(f"run {i + 1}/{len(points)} {p['run']} done in {res['summary']['launch_wall_s']:.1f} s")
    write_table(pd.DataFrame(summaries), out / "runs.csv", cfg, started)
    write_table(pd.DataFrame(iters), out / "iterations.csv", cfg, started)
    write_table(pd.DataFrame(ranks), out / "ranks.csv", cfg, started)


if __name__ == "__main__":
    main()
