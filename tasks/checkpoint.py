"""Checkpoint-cost study as a PyCOMPSs application: every sweep point is one task.

    python -m tasks.checkpoint --config configs/default.yaml     # local backend
    python -m hpcdl compss command checkpoint --config FILE    # prints the runcompss command line

Writes raw/io.csv (save/load cost per format, mode, size, ranks), raw/resume.csv
(bit-identical resume per format) and raw/overhead.csv (throughput vs checkpoint
interval). A sync point's storage ceiling comes from fio (hpcdl/studies/checkpoint/fio.py; `make
tools` installs it): without fio the run goes on and says so. checkpoint.device is resolved here,
once: on cuda the state lives on the GPU, each task holds GPUs (HPCDL_CHECKPOINT_GPUS: the largest
DCP launch's ranks, one each), and every point and row names the device. A failing point becomes a
row with status=failed and its error; the rest runs.
Every point's record is kept in <results>/checkpoint/points/ as it finishes (hpcdl.platform.kit.points): a
rerun after a kill runs only the points not finished yet.
"""

from __future__ import annotations

import shutil
import sys
import time

import pandas as pd

from hpcdl.platform.task_app import failed_row, start_app, study_task, write_table
from hpcdl.studies.checkpoint import compute, fio, sweep


@study_task("checkpoint")
def io_point(point: dict, slot) -> list:
    return slot.run(compute.run_point, **point)


@study_task("checkpoint")
def ranks_point(point: dict, slot) -> list:
    return slot.run(compute.ranks_point, **point)


@study_task("checkpoint", cpu_units="1")
def resume_point(point: dict, slot) -> dict:
    return slot.run(compute.resume_check, **point)


@study_task("checkpoint")
def overhead_point(point: dict, slot) -> dict:
    return slot.run(compute.overhead_run, **point)


def _rows(outcomes, label) -> list[dict]:
    """Successful records (a task may return several) plus one failed row per failed point."""
    rows = []
    for o in outcomes:
        if not o.ok:
            rows.append(failed_row(label(o.point), o.error))
            continue
        for rec in o.result if isinstance(o.result, list) else [o.result]:
            rows.append({**rec, "status": "ok", "error": ""})
    return rows


def _submit_io(p: dict, slot):
    args = {k: v for k, v in p.items() if k != "kind"}
    return io_point(args, slot) if p["kind"] == "io" else ranks_point(args, slot)


def main(argv=None) -> None:
    run = start_app("checkpoint", argv, __doc__.splitlines()[0])
    cfg = run.cfg
    device = run.device  # resolved once and recorded (start_app has refused `cuda` without a GPU)
    scratch = sweep.scratch_path(cfg)
    scratch.mkdir(parents=True, exist_ok=True)

    io_pts = sweep.io_points(cfg, device)
    res_pts = sweep.resume_points(cfg, device)
    ovh_pts = sweep.overhead_points(cfg, device)
    print(f"[checkpoint] {len(io_pts)} I/O points, {len(res_pts)} resume checks, "
          f"{len(ovh_pts)} overhead runs on {device}; scratch {scratch}", file=sys.stderr, flush=True)
    if fio.executable() is None:  # the points still run; their ceiling columns say why they are empty
        print(f"[checkpoint] {fio.FIO_MISSING}: no storage ceiling, the bandwidth claim will be not "
              "measured", file=sys.stderr, flush=True)
    # A point's key covers its whole dict: sweep.py puts in it everything the measurement reads.
    batches = [run.submit("io", io_pts, _submit_io),
               run.submit("resume", res_pts, lambda p, slot: resume_point(p, slot)),
               run.submit("overhead", ovh_pts, lambda p, slot: overhead_point(p, slot))]
    io_out, res_out, ovh_out = run.gather(batches)
    shutil.rmtree(scratch, ignore_errors=True)

    raw = run.raw
    io_rows = _rows(io_out, lambda p: {
        "device": device, "format": p.get("fmt", "dcp"), "mode": p.get("mode", "sync"),
        "process_group": p["kind"] == "ranks",
        "ranks": p.get("ranks", 1),
        "n_params": p["n_params"]})
    res_rows = _rows(res_out, lambda p: {
        "device": device, "format": p["fmt"], "steps_total": p["steps_total"], "stop_at": p["stop_at"]})
    ovh_rows = _rows(ovh_out, lambda p: {
        "device": device, "mode": p["mode"], "interval_steps": p["interval"],
        "format": p["fmt"], "steps": p["steps"]})
    write_table(pd.DataFrame(io_rows), raw / "io.csv", cfg, run.started)
    write_table(pd.DataFrame(res_rows), raw / "resume.csv", cfg, run.started)
    write_table(pd.DataFrame(ovh_rows), raw / "overhead.csv", cfg, run.started)
    run.write_summary()
    failed = sum(r["status"] == "failed" for r in io_rows + res_rows + ovh_rows)
    print(f"[checkpoint] done in {time.time() - run.started:.0f} s; {failed} failed point(s)",
          file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
