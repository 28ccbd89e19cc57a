"""Heterogeneous-memory study as a PyCOMPSs application: every mini-app kernel is one task.

    python -m tasks.hetmem --config configs/default.yaml          # local backend
    python -m hpcdl compss command hetmem --config FILE    # prints the runcompss command line

Every app runs on hetmem.device, resolved once and recorded (hpcdl.platform.kit.points.StudyRun), and its
task body is one call, hpcdl.studies.hetmem.compute.run_point. On the CPU a task compiles the
kernels, traces its app under valgrind lackey, simulates the two-tier reference (simulated: a CPU
node has one memory tier), validates the differential estimator and runs the placement policies. On
CUDA a task holds one GPU and measures its app's placements on it instead: objects in GPU memory or
in pinned host memory mapped into the GPU, the estimate and the policies at object granularity
(hpcdl.studies.hetmem.gpu; no lackey, no simulation: the hardware is the reference). Writes
raw/traces.csv (one row per app: tracing cost or the GPU's measurement cost, footprint, the bounds),
raw/validation.csv (app x sampling period x placement: estimate vs reference) and raw/policies.csv
(app x capacity x policy); every row names its `device` and its `reference` ("simulated" or
"hardware: GPU HBM vs mapped pinned host"). A failing app becomes a failed row with its error; the
others run. Every app's record is kept in <results>/hetmem/points/ as it finishes.
"""

from __future__ import annotations

import sys
import time

import pandas as pd

from hpcdl.platform.task_app import failed_row, start_app, study_task, write_table
from hpcdl.studies.hetmem import compute, sweep


@study_task("hetmem")
def app_point(point: dict, block: dict, work_dir: str, slot) -> dict:
    return slot.run(compute.run_point, point, block, work_dir, block["seed"])


def device_label(device: str, trace: dict | None) -> str:
    """The rows' `device`: "cpu", or "cuda (<model of the GPU the task ran on>)" ("cuda" for a failed
    task: on a cluster the GPU it got is the worker's, unknown here)."""
    if device == "cpu":
        return "cpu"
    return f"cuda ({trace['gpu']})" if trace and trace.get("gpu") else "cuda"


def main(argv=None) -> None:
    run = start_app("hetmem", argv, __doc__.splitlines()[0])
    cfg = run.cfg
    # resolved once and recorded (start_app has refused `cuda` without a GPU); on cuda each task holds a GPU
    device = run.device
    block = sweep.compute_block(cfg, device)
    work_dir = str(run.dir / "traces")
    apps = sweep.app_points(cfg, device)
    print(f"[hetmem] {len(apps)} app(s) on {device}: {', '.join(a['name'] for a in apps)}", file=sys.stderr,
          flush=True)
    # The key covers the app and every setting its task computes from, not where its files go.
    batch = run.submit(
        "app",
        apps,
        lambda p, slot: app_point(p, block, work_dir, slot),
        inputs=lambda p: {"app": p, "block": block},
    )
    (outcomes,) = run.gather([batch])
    traces, validation, policies = [], [], []
    for o in outcomes:
        if not o.ok:
            gpu = block.get("gpu", {})
            what = ({"app": o.point["name"], "size": o.point["size"], "iters": o.point["iters"]}
                    if device == "cpu" else
                    {"app": o.point["name"], "scale": gpu["scale"], "repeats": gpu["repeats"]})
            traces.append({**failed_row(what, o.error), "device": device_label(device, None)})
            last = o.error.strip().splitlines()[-1] if o.error.strip() else ""
            print(f"[hetmem] app {o.point['name']} FAILED: {last}", file=sys.stderr, flush=True)
            continue
        label = device_label(device, o.result["trace"])
        traces.append({**o.result["trace"], "device": label, "status": "ok", "error": ""})
        validation.extend({**r, "device": label} for r in o.result["validation"])
        policies.extend({**r, "device": label} for r in o.result["policies"])
    raw = run.raw
    write_table(pd.DataFrame(traces), raw / "traces.csv", cfg, run.started)
    write_table(
        pd.DataFrame(validation, columns=_columns(validation, "app")),
        raw / "validation.csv",
        cfg,
        run.started,
    )
    write_table(
        pd.DataFrame(policies, columns=_columns(policies, "app")), raw / "policies.csv", cfg, run.started
    )
    run.write_summary()
    failed = sum(r["status"] == "failed" for r in traces)
    print(
        f"[hetmem] done in {time.time() - run.started:.0f} s; {failed} failed app(s)",
        file=sys.stderr,
        flush=True,
    )


def _columns(rows: list[dict], first: str) -> list[str]:
    """The rows' columns (an empty table keeps at least its key column, so it still reads back)."""
    return list(rows[0]) if rows else [first]


if __name__ == "__main__":
    main()
