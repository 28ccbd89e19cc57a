"""Malleability study as a PyCOMPSs application: every experiment point is one task.

    python -m tasks.malleable --config configs/default.yaml        # local backend
    python -m hpcdl compss command malleable --config FILE   # prints the runcompss command line

Each task runs its point in a driver process group (hpcdl.studies.malleable.driver): (a) a thread-count
change by API, signal or quota; (b) one repeat of a quota cut, threads kept then followed (order
rotated per repeat); (c) one repeat of a job workload under every co-scheduling policy in turn.
Writes raw/points.csv (one row per variant and repeat: status ok / failed / skipped with the
reason), raw/series.csv (every iteration of every job), raw/changes.csv (every thread-count request
and when it took effect), raw/decisions.csv and raw/jobs.csv (co-scheduler events and per-job times).
Points are kept in <results>/malleable/points/ as they finish.
"""

from __future__ import annotations

import sys
import time

from hpcdl.platform.task_app import failed_row, start_app, study_task, write_table
from hpcdl.studies.malleable import compute, sweep

TABLES = ("points", "series", "changes", "decisions", "jobs")


@study_task("malleable", gpus=False)
def response_point(point: dict, period_us: int, slot) -> dict:
    return slot.run(compute.run, point, period_us)


@study_task("malleable", gpus=False)
def oversub_point(point: dict, period_us: int, slot) -> dict:
    return slot.run(compute.run, point, period_us)


@study_task("malleable", gpus=False)
def cosched_point(point: dict, period_us: int, slot) -> dict:
    return slot.run(compute.run, point, period_us)


def main(argv=None) -> None:
    run = start_app("malleable", argv, __doc__.splitlines()[0])
    cfg = run.cfg
    block = cfg["malleable"]
    run.log(f"device {run.device} (a CPU study), recorded before the first table")
    period = block["cfs_period_us"]
    sweeps = (
        ("response", sweep.response_points(cfg), response_point),
        ("oversub", sweep.oversub_points(cfg), oversub_point),
        ("cosched", sweep.cosched_points(cfg), cosched_point),
    )
    print(
        f"[malleable] {sum(len(p) for _, p, _ in sweeps)} points on {block['cores']} cores",
        file=sys.stderr,
        flush=True,
    )
    batches = [
        run.submit(
            name,
            points,
            lambda p, slot, fn=fn: fn(p, period, slot),
            inputs=lambda p: {"point": p, "period_us": period},
        )
        for name, points, fn in sweeps
    ]
    outcomes = run.gather(batches)
    rows = {t: [] for t in TABLES}
    for o in (o for batch in outcomes for o in batch):
        if not o.ok:
            # a failed point fails every variant of its repeat: none of them has a partner to pair with
            rows["points"].extend(failed_row(lab, o.error) for lab in sweep.labels(o.point))
            continue
        for t in TABLES:
            rows[t].extend(o.result[t])
    raw = run.raw
    for t in TABLES:
        write_table(compute.frame(t, rows[t]), raw / f"{t}.csv", cfg, run.started)
    run.write_summary()
    print(f"[malleable] done in {time.time() - run.started:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
