"""Checkpoint-cost study as a PyCOMPSs application: every sweep point is one task.

    python -m tasks.checkpoint --config configs/default.yaml     # local backend
    python -m hpcdl.runtime.compss command checkpoint --config FILE    # prints the runcompss command line

Writes raw/io.csv (save/load cost per format, mode, size, ranks), raw/resume.csv
(bit-identical resume per format) and raw/overhead.csv (throughput vs checkpoint
interval). A failing point becomes a row with status=failed and its error; the rest runs.
"""

from __future__ import annotations

import shutil
import sys
import time

import pandas as pd

from hpcdl.checkpoint import distributed, measure, plan, training
from hpcdl.config import study_dir
from hpcdl.results import write_table
from hpcdl.runtime import compss_wait_on, constraint, failure_reason, on_failure, task
from hpcdl.runtime.app import start_app


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="$HPCDL_CHECKPOINT_UNITS")
@task(returns=1)
def io_point(point: dict) -> list:
    return measure.run_point(**point)


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="$HPCDL_CHECKPOINT_UNITS")
@task(returns=1)
def ranks_point(point: dict) -> list:
    return distributed.run_point(**point)


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="1")
@task(returns=1)
def resume_point(point: dict) -> dict:
    return training.resume_check(**point)


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="$HPCDL_CHECKPOINT_UNITS")
@task(returns=1)
def overhead_point(point: dict) -> dict:
    return training.overhead_run(**point)


def _rows(points: list[dict], futures: list, results: list, label) -> list[dict]:
    """Successful records (a task may return several) plus one failed row per failed point."""
    rows = []
    for point, fut, res in zip(points, futures, results, strict=True):
        if res is None:
            rows.append({**label(point), "status": "failed",
                         "error": failure_reason(fut) or "task returned no result"})
            continue
        for rec in res if isinstance(res, list) else [res]:
            rows.append({**rec, "status": "ok", "error": ""})
    return rows


def main(argv=None) -> None:
    cfg = start_app("checkpoint", argv, __doc__.splitlines()[0])
    started = time.time()
    out = study_dir(cfg, "checkpoint")
    scratch = plan.scratch_path(cfg)
    scratch.mkdir(parents=True, exist_ok=True)

    io_pts = plan.io_points(cfg)
    res_pts = plan.resume_points(cfg)
    ovh_pts = plan.overhead_points(cfg)
    print(f"[checkpoint] {len(io_pts)} I/O points, {len(res_pts)} resume checks, "
          f"{len(ovh_pts)} overhead runs; scratch {scratch}", file=sys.stderr, flush=True)
    io_futs = [io_point({k: v for k, v in p.items() if k != "kind"}) if p["kind"] == "io"
               else ranks_point({k: v for k, v in p.items() if k != "kind"}) for p in io_pts]
    res_futs = [resume_point(p) for p in res_pts]
    ovh_futs = [overhead_point(p) for p in ovh_pts]
    io_res, res_res, ovh_res = compss_wait_on(io_futs, res_futs, ovh_futs)
    shutil.rmtree(scratch, ignore_errors=True)

    raw = out / "raw"
    io_rows = _rows(io_pts, io_futs, io_res, lambda p: {
        "format": p.get("fmt", "dcp"), "mode": p.get("mode", "sync"), "process_group": p["kind"] == "ranks",
        "ranks": p.get("ranks", 1),
        "n_params": p["n_params"]})
    res_rows = _rows(res_pts, res_futs, res_res, lambda p: {
        "format": p["fmt"], "steps_total": p["steps_total"], "stop_at": p["stop_at"]})
    ovh_rows = _rows(ovh_pts, ovh_futs, ovh_res, lambda p: {
        "mode": p["mode"], "interval_steps": p["interval"],
        "format": p["fmt"], "steps": p["steps"]})
    write_table(pd.DataFrame(io_rows), raw / "io.csv", cfg, started)
    write_table(pd.DataFrame(res_rows), raw / "resume.csv", cfg, started)
    write_table(pd.DataFrame(ovh_rows), raw / "overhead.csv", cfg, started)
    failed = sum(r["status"] == "failed" for r in io_rows + res_rows + ovh_rows)
    print(f"[checkpoint] done in {time.time() - started:.0f} s; {failed} failed point(s)",
          file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
