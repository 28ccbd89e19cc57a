"""Spatial scaling study as a PyCOMPSs application: every scaling run is one task launching its ranks.

    python -m tasks.spatial --config configs/default.yaml          # local backend
    python -m hpcdl compss command spatial --config FILE    # prints the runcompss command line

Every launch runs on spatial.device, resolved here once (on CUDA one GPU per rank, or GPUs shared by
the ranks over gloo where spatial.gpu_sharing allows), and every row names it.
Order: the float64 exactness check, on CUDA the GPU calibration at the papers' slab shapes
(spatial.gpu_calibration.in_study; raw/gpu_calibration/<gpu>.csv), then the scaling runs' repeats,
each repeat preceded by one round of the calibration microbenchmarks (calibration.rounds; rounds
beyond the repeats run at the end).
A multi-rank spatial strong run measures its no-communication ceiling in the same launch, step by
step (sweep.expand: the ceiling's point is not launched on its own), and gives back both runs' rows.
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

from hpcdl.platform.task_app import (
    available_cores,
    failed_row,
    start_app,
    study_task,
    write_table,
)
from hpcdl.studies.spatial import compute, sweep


@study_task("spatial")
def exactness(block, layout, slot):
    return slot.run(compute.exactness_point, block, layout)


@study_task("spatial")
def calibrate(block, resources_dir, round_index, slot):
    return slot.run(compute.calibrate_point, block, resources_dir, round_index)


@study_task("spatial")
def gpu_calibration(block, out_dir, slot):
    return slot.run(compute.gpu_calibration_point, block, out_dir)


@study_task("spatial")
def scaling_run(point, block, resources_dir, slot):
    return slot.run(compute.run_point, point, block, resources_dir)


def _log(msg: str) -> None:
    print(f"[spatial] {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> None:
    run = start_app("spatial", argv, __doc__.splitlines()[0])
    cfg = run.cfg
    # absolute: under COMPSs a task runs in its sandbox directory, not where the app started
    block, res_dir = cfg["spatial"], os.path.abspath(cfg["data"]["resources_dir"])
    # resolved once and recorded (start_app has refused `cuda` without a GPU): every launch runs on it
    where = sweep.placement(block, run.device)
    points = sweep.expand(block)
    for p in points:  # generate every field cache once, before any task reads it
        compute.dataset_for(block, res_dir, p["shape"])
    # Each task gets (and each stored result is keyed by) only the part of the block it reads, and
    # where it runs.
    ex_block, cal_block, run_block = ({**unit(block), **where} for unit in (
        sweep.exactness_block, sweep.calibration_block, sweep.run_block))
    shared = " (ranks may share a GPU, over gloo)" if where.get("gpu_sharing") else ""
    _log(f"device {where['device']}{shared}")
    _exactness(run, ex_block, block["exactness"]["layouts"])
    calibration = _Calibration(run, cal_block, res_dir, block["calibration"]["rounds"])
    if where["device"] == "cuda" and block["gpu_calibration"]["in_study"]:
        _gpu_calibration(run, block, where)
    summaries, iters, ranks = _scaling_runs(run, points, run_block, res_dir, calibration)
    calibration.finish()
    for name, rows in (("runs", summaries), ("iterations", iters), ("ranks", ranks)):
        write_table(pd.DataFrame(rows), run.raw / f"{name}.csv", cfg, run.started)
    run.write_summary()


def _exactness(run, ex_block: dict, layouts: list) -> None:
    (ex,) = run.gather([run.submit("exactness", layouts,
                                   lambda lay, slot: exactness(ex_block, lay, slot),
                                   inputs=lambda lay: {"block": ex_block, "layout": lay})])
    ex_rows = [r for o in ex if o.ok for r in o.result]
    write_table(pd.DataFrame(ex_rows), run.raw / "exactness.csv", run.cfg, run.started)
    worst = max((r["err_grad_params"] for r in ex_rows), default=None)
    _log(f"exactness: {len(ex_rows)} rank rows, worst parameter-gradient error {worst}")


class _Calibration:
    """The calibration rounds: round r runs just before repeat r of the scaling runs, so calibration
    and measurement interleave; rounds no run reached run at the end."""

    def __init__(self, run, cal_block: dict, res_dir: str, rounds: int):
        self.run, self.block, self.res_dir, self.rounds = run, cal_block, res_dir, rounds
        self.rows: list[dict] = []
        self.done: set[int] = set()

    def before_repeat(self, repeat: int) -> None:
        if repeat < self.rounds and repeat not in self.done:
            self._round(repeat)

    def _round(self, r: int) -> None:
        block, res_dir = self.block, self.res_dir
        cal = self.run.one("calibration", r, lambda r, slot: calibrate(block, res_dir, r, slot),
                           inputs=lambda r: {"block": block, "resources_dir": res_dir, "round": r})
        self.done.add(r)
        if cal.ok:
            self.rows.extend(cal.result)
            _log(f"calibration round {r + 1}/{self.rounds} " + ("reused" if cal.reused else "done"))
        elif not self.rows and r == self.rounds - 1:
            self.run.write_summary()
            raise SystemExit(f"[spatial] calibration failed: {cal.error}")
        else:
            _log(f"calibration round {r + 1} FAILED: {cal.error.splitlines()[0] if cal.error else ''}")

    def finish(self) -> None:
        """The rounds left, then raw/calibration.csv (the run stops where every round failed)."""
        for r in range(self.rounds):
            if r not in self.done:
                self._round(r)
        if not self.rows:
            self.run.write_summary()
            raise SystemExit("[spatial] calibration failed in every round")
        write_table(pd.DataFrame(self.rows).assign(cores=available_cores()), self.run.raw / "calibration.csv",
                    self.run.cfg, self.run.started)


def _gpu_calibration(run, block: dict, where: dict) -> None:
    """Per-layer times at the papers' slab shapes (raw/gpu_calibration/<gpu>.csv): the paper predictions
    of this run rest on them (tables.gpu_calibration); copy the file to resources/calibration/ to commit."""
    gblock = {k: block[k] for k in ("papers", "extrapolate", "machine", "gpu_calibration")} | where
    gdir = str(run.raw / "gpu_calibration")
    gc = run.one("gpu_calibration", 0, lambda r, slot: gpu_calibration(gblock, gdir, slot),
                 inputs=lambda r: {"block": gblock})
    _log(f"GPU calibration {'reused' if gc.reused else 'done'}: {gc.result['path']}" if gc.ok
         else f"GPU calibration FAILED: {gc.error.splitlines()[0] if gc.error else ''}")


def _scaling_runs(run, points: list[dict], run_block: dict, res_dir: str, calibration: _Calibration):
    """Every scaling run, one at a time (a timing taken next to another run would measure the
    contention): (summaries, iterations, ranks) rows."""
    summaries, iters, ranks = [], [], []
    launched = sweep.launches(points)
    for i, p in enumerate(launched):
        calibration.before_repeat(p["repeat"])
        o = run.one("run", p, lambda p, slot: scaling_run(p, run_block, res_dir, slot),
                    inputs=lambda p: {"point": p, "block": run_block, "resources_dir": res_dir})
        if not o.ok:  # a paired ceiling fails with its launch
            for q in (p, sweep.ceiling_point(p)) if "paired_ceiling" in p else (p,):
                summaries.append(failed_row({k: v for k, v in q.items() if k not in ("layout", "shape")},
                                            o.error))
            _log(f"run {p['run']} FAILED: {o.error.splitlines()[0] if o.error else ''}")
            continue
        for res in (o.result, o.result.get("ceiling")):
            if res is not None:
                summaries.append(res["summary"])
                iters += res["iterations"]
                ranks += res["ranks"]
        wall = o.result["summary"]["launch_wall_s"]
        how = f"reused from {run.root}" if o.reused else f"done in {wall:.1f} s"
        also = f" (+ {p['paired_ceiling']}, step by step)" if "paired_ceiling" in p else ""
        _log(f"run {i + 1}/{len(launched)} {p['run']}{also} {how}")
    return summaries, iters, ranks


if __name__ == "__main__":
    main()
