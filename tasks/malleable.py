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

from hpcdl.platform.kit.points import StudyRun, failed_row
from hpcdl.platform.kit.results import write_table
from hpcdl.platform.orchestration.task_runtime import (
    compss_wait_on,
    constraint,
    failure_reason,
    on_failure,
    task,
)
from hpcdl.platform.orchestration.task_runtime.app import start_app
from hpcdl.studies.malleable import compute, sweep

TABLES = ("points", "series", "changes", "decisions", "jobs")


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="$HPCDL_MALLEABLE_UNITS")
@task(returns=1)
def response_point(point: dict, period_us: int, slot) -> dict:
    return slot.run(compute.run, point, period_us)


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="$HPCDL_MALLEABLE_UNITS")
@task(returns=1)
def oversub_point(point: dict, period_us: int, slot) -> dict:
    return slot.run(compute.run, point, period_us)


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="$HPCDL_MALLEABLE_UNITS")
@task(returns=1)
def cosched_point(point: dict, period_us: int, slot) -> dict:
    return slot.run(compute.run, point, period_us)


def main(argv=None) -> None:
    cfg = start_app("malleable", argv, __doc__.splitlines()[0])
    block = cfg["malleable"]
    run = StudyRun(cfg, "malleable")
    run.record_device()  # before the first table (a CPU study: cpu)
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
    outcomes = run.gather(batches, compss_wait_on, failure_reason)
    rows = {t: [] for t in TABLES}
    for o in (o for batch in outcomes for o in batch):
        if not o.ok:
            # a failed point fails every variant of its repeat: none of them has a partner to pair with
            rows["points"].extend(failed_row(lab, o.error) for lab in sweep.labels(o.point))
            continue
        for t in TABLES:
            rows[t].extend(o.result[t])
    raw = run.dir / "raw"
    for t in TABLES:
        write_table(compute.frame(t, rows[t]), raw / f"{t}.csv", cfg, run.started)
    run.write_summary()
    print(f"[malleable] done in {time.time() - run.started:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
