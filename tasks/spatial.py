"""Spatial scaling study as a PyCOMPSs application: every scaling run is one task launching its ranks.

    python -m tasks.spatial --config configs/default.yaml          # local backend
    python -m hpcdl compss command spatial --config FILE    # prints the runcompss command line

Every launch runs on spatial.device, resolved here once (on CUDA one GPU per rank, or GPUs shared by
the ranks over gloo where spatial.gpu_sharing allows), and every row names it.
Order: the float64 exactness check, on CUDA the GPU calibration at the papers' slab shapes
(spatial.gpu_calibration.in_study; raw/gpu_calibration/<gpu>.csv), then the scaling runs' repeats,
each repeat preceded by one round of the calibration microbenchmarks (calibration.rounds; rounds
beyond the repeats run at the end).
Each task reserves the cores of the largest run (HPCDL_SPATIAL_UNITS) and the main program
waits for each timed task before submitting the next, so no two timed runs overlap.
Writes raw/{exactness,calibration,runs,iterations,ranks}.csv (+ provenance). Every result is kept in
<results>/spatial/points/ as it finishes (hpcdl.platform.kit.points): a rerun after a kill keeps the order and
reuses the exactness checks, calibration and runs already done whose parameters are unchanged.
"""

from __future__ import annotations

import os
import sys

import pandas as pd

from hpcdl.platform.kit.points import StudyRun, failed_row
from hpcdl.platform.kit.results import available_cores, write_table
from hpcdl.platform.orchestration.task_runtime import (
    compss_wait_on,
    constraint,
    failure_reason,
    on_failure,
    task,
)
from hpcdl.platform.orchestration.task_runtime.app import start_app
from hpcdl.studies.spatial import compute, sweep


@on_failure(management="IGNORE", returns=None)
@constraint(processors=[{"processorType": "CPU", "computingUnits": "$HPCDL_SPATIAL_UNITS"},
                        {"processorType": "GPU", "computingUnits": "$HPCDL_SPATIAL_GPUS"}])
@task(returns=1)
def exactness(block, layout, slot):
    return slot.run(compute.exactness_point, block, layout)


@on_failure(management="IGNORE", returns=None)
@constraint(processors=[{"processorType": "CPU", "computingUnits": "$HPCDL_SPATIAL_UNITS"},
                        {"processorType": "GPU", "computingUnits": "$HPCDL_SPATIAL_GPUS"}])
@task(returns=1)
def calibrate(block, resources_dir, round_index, slot):
    return slot.run(compute.calibrate_point, block, resources_dir, round_index)


@on_failure(management="IGNORE", returns=None)
@constraint(processors=[{"processorType": "CPU", "computingUnits": "$HPCDL_SPATIAL_UNITS"},
                        {"processorType": "GPU", "computingUnits": "$HPCDL_SPATIAL_GPUS"}])
@task(returns=1)
def gpu_calibration(block, out_dir, slot):
    return slot.run(compute.gpu_calibration_point, block, out_dir)


@on_failure(management="IGNORE", returns=None)
@constraint(processors=[{"processorType": "CPU", "computingUnits": "$HPCDL_SPATIAL_UNITS"},
                        {"processorType": "GPU", "computingUnits": "$HPCDL_SPATIAL_GPUS"}])
@task(returns=1)
def scaling_run(point, block, resources_dir, slot):
    return slot.run(compute.run_point, point, block, resources_dir)


def _log(msg: str) -> None:
    print(f"[spatial] {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> None:
    cfg = start_app("spatial", argv, __doc__.splitlines()[0])
    # absolute: under COMPSs a task runs in its sandbox directory, not where the app started
    block, res_dir = cfg["spatial"], os.path.abspath(cfg["data"]["resources_dir"])
    study = StudyRun(cfg, "spatial")
    # resolved once and recorded (start_app has refused `cuda` without a GPU): every launch runs on it
    where = sweep.placement(block, study.device)
    out = study.dir / "raw"
    points = sweep.expand(block)
    for p in points:  # generate every field cache once, before any task reads it
        compute.dataset_for(block, res_dir, p["shape"])
    # Each task gets (and each stored result is keyed by) only the part of the block it reads, and
    # where it runs.
    ex_block, cal_block, run_block = ({**unit(block), **where} for unit in (
        sweep.exactness_block, sweep.calibration_block, sweep.run_block))
    shared = " (ranks may share a GPU, over gloo)" if where.get("gpu_sharing") else ""
    _log(f"device {where['device']}{shared}")

    (ex,) = study.gather([study.submit("exactness", block["exactness"]["layouts"],
                                       lambda lay, slot: exactness(ex_block, lay, slot),
                                       inputs=lambda lay: {"block": ex_block, "layout": lay})],
                         compss_wait_on, failure_reason)
    ex_rows = [r for o in ex if o.ok for r in o.result]
    write_table(pd.DataFrame(ex_rows), out / "exactness.csv", cfg, study.started)
    worst = max((r["err_grad_params"] for r in ex_rows), default=None)
    _log(f"exactness: {len(ex_rows)} rank rows, worst parameter-gradient error {worst}")

    cal_rows, done_rounds = [], set()

    def calibration_round(r: int) -> None:
        # round r runs just before repeat r of the scaling runs: calibration and measurement interleave
        cal = study.one("calibration", r, lambda r, slot: calibrate(cal_block, res_dir, r, slot),
                        compss_wait_on, failure_reason,
                        inputs=lambda r: {"block": cal_block, "resources_dir": res_dir, "round": r})
        done_rounds.add(r)
        if cal.ok:
            cal_rows.extend(cal.result)
            _log(f"calibration round {r + 1}/{rounds} " + ("reused" if cal.reused else "done"))
        elif not cal_rows and r == rounds - 1:
            study.write_summary()
            raise SystemExit(f"[spatial] calibration failed: {cal.error}")
        else:
            _log(f"calibration round {r + 1} FAILED: {cal.error.splitlines()[0] if cal.error else ''}")

    if where["device"] == "cuda" and block["gpu_calibration"]["in_study"]:
        # per-layer times at the papers' slab shapes (raw/gpu_calibration/<gpu>.csv): the paper predictions
        # of this run rest on them (tables.gpu_calibration); copy the file to resources/calibration/ to commit
        gblock = {k: block[k] for k in ("papers", "extrapolate", "machine", "gpu_calibration")} | where
        gdir = str(out / "gpu_calibration")
        gc = study.one("gpu_calibration", 0, lambda r, slot: gpu_calibration(gblock, gdir, slot),
                       compss_wait_on, failure_reason, inputs=lambda r: {"block": gblock})
        _log(f"GPU calibration {'reused' if gc.reused else 'done'}: {gc.result['path']}" if gc.ok
             else f"GPU calibration FAILED: {gc.error.splitlines()[0] if gc.error else ''}")

    rounds = block["calibration"]["rounds"]
    summaries, iters, ranks = [], [], []
    for i, p in enumerate(points):
        if p["repeat"] < rounds and p["repeat"] not in done_rounds:
            calibration_round(p["repeat"])
        # one at a time: a timing taken next to another run would measure the contention
        o = study.one("run", p, lambda p, slot: scaling_run(p, run_block, res_dir, slot), compss_wait_on,
                      failure_reason, inputs=lambda p: {"point": p, "block": run_block,
                                                        "resources_dir": res_dir})
        if not o.ok:
            label = {k: v for k, v in p.items() if k not in ("layout", "shape")}
            summaries.append(failed_row(label, o.error))
            _log(f"run {p['run']} FAILED: {o.error.splitlines()[0] if o.error else ''}")
            continue
        summaries.append(o.result["summary"])
        iters += o.result["iterations"]
        ranks += o.result["ranks"]
        wall = o.result["summary"]["launch_wall_s"]
        how = f"reused from {study.root}" if o.reused else f"done in {wall:.1f} s"
        _log(f"run {i + 1}/{len(points)} {p['run']} {how}")
    for r in range(rounds):
        if r not in done_rounds:
            calibration_round(r)
    if not cal_rows:
        study.write_summary()
        raise SystemExit("[spatial] calibration failed in every round")
    write_table(pd.DataFrame(cal_rows).assign(cores=available_cores()), out / "calibration.csv", cfg,
                study.started)
    write_table(pd.DataFrame(summaries), out / "runs.csv", cfg, study.started)
    write_table(pd.DataFrame(iters), out / "iterations.csv", cfg, study.started)
    write_table(pd.DataFrame(ranks), out / "ranks.csv", cfg, study.started)
    study.write_summary()


if __name__ == "__main__":
    main()
