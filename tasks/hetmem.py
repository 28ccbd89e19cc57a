"""Heterogeneous-memory study as a PyCOMPSs application: every mini-app kernel is one task.

    python -m tasks.hetmem --config configs/default.yaml          # local backend
    python -m hpcdl compss command hetmem --config FILE    # prints the runcompss command line

A task compiles the kernels, traces its app under valgrind lackey, simulates the two-tier
reference (simulated: this machine has one memory tier), validates the differential estimator
and runs the placement policies. Writes raw/traces.csv (one row per app: tracing cost, footprint,
simulated bounds), raw/validation.csv (app x sampling period x placement: estimate vs simulated
reference) and raw/policies.csv (app x capacity x policy). A failing app becomes a failed row with
its error; the others run. Every app's record is kept in <results>/hetmem/points/ as it finishes.
"""

from __future__ import annotations

import sys
import time

import pandas as pd

from hpcdl.platform.points import StudyRun, failed_row
from hpcdl.platform.results import write_table
from hpcdl.platform.task_runtime import compss_wait_on, constraint, failure_reason, on_failure, task
from hpcdl.platform.task_runtime.app import start_app
from hpcdl.studies.hetmem import compute, sweep


@on_failure(management="IGNORE", returns=None)
@constraint(computing_units="$HPCDL_HETMEM_UNITS")
@task(returns=1)
def app_point(point: dict, block: dict, work_dir: str, slot) -> dict:
    return slot.run(
        compute.run_app, point["name"], point["size"], point["iters"], block, work_dir, block["seed"]
    )


def main(argv=None) -> None:
    cfg = start_app("hetmem", argv, __doc__.splitlines()[0])
    study = StudyRun(cfg, "hetmem")
    block = sweep.compute_block(cfg)
    work_dir = str(study.dir / "traces")
    apps = sweep.app_points(cfg)
    print(f"[hetmem] {len(apps)} app(s): {', '.join(a['name'] for a in apps)}", file=sys.stderr, flush=True)
    # The key covers the app and every setting its task computes from, not where its files go.
    batch = study.submit(
        "app",
        apps,
        lambda p, slot: app_point(p, block, work_dir, slot),
        inputs=lambda p: {"app": p, "block": block},
    )
    (outcomes,) = study.gather([batch], compss_wait_on, failure_reason)
    traces, validation, policies = [], [], []
    for o in outcomes:
        if not o.ok:
            traces.append(
                failed_row(
                    {"app": o.point["name"], "size": o.point["size"], "iters": o.point["iters"]}, o.error
                )
            )
            last = o.error.strip().splitlines()[-1] if o.error.strip() else ""
            print(f"[hetmem] app {o.point['name']} FAILED: {last}", file=sys.stderr, flush=True)
            continue
        traces.append({**o.result["trace"], "status": "ok", "error": ""})
        validation.extend(o.result["validation"])
        policies.extend(o.result["policies"])
    raw = study.dir / "raw"
    write_table(pd.DataFrame(traces), raw / "traces.csv", cfg, study.started)
    write_table(
        pd.DataFrame(validation, columns=_columns(validation, "app")),
        raw / "validation.csv",
        cfg,
        study.started,
    )
    write_table(
        pd.DataFrame(policies, columns=_columns(policies, "app")), raw / "policies.csv", cfg, study.started
    )
    study.write_summary()
    failed = sum(r["status"] == "failed" for r in traces)
    print(
        f"[hetmem] done in {time.time() - study.started:.0f} s; {failed} failed app(s)",
        file=sys.stderr,
        flush=True,
    )


def _columns(rows: list[dict], first: str) -> list[str]:
    """The rows' columns (an empty table keeps at least its key column, so it still reads back)."""
    return list(rows[0]) if rows else [first]


if __name__ == "__main__":
    main()
