"""Memory-offload study as a PyCOMPSs application: every (strategy, depth) point and every
strategy's capacity search is one task.

    python -m tasks.offload --config configs/default.yaml     # local backend
    python -m hpcdl compss command offload --config FILE    # prints the runcompss command line

Writes raw/steps.csv (per strategy and depth: peak fast-tier bytes, peak RSS, step time split into
forward / backward / optimizer / exposed transfer, bytes moved each way, hidden fraction, final
weights' sha256), raw/timeline.csv (every span of the last measured step of each point) and
raw/capacity.csv (largest depth under the fast-tier budget, per strategy). A failing point becomes
a row with status=failed and its error; the rest runs. Every point's record is kept in
<results>/offload/points/ as it finishes (hpcdl.platform.kit.points).
"""

from __future__ import annotations

import shutil
import sys
import time

import pandas as pd

from hpcdl.platform.task_app import failed_row, start_app, study_task, write_table
from hpcdl.studies.offload import sweep


@study_task("offload")
def run_point(point: dict, slot) -> dict:
    from hpcdl.studies.offload import compute

    return slot.run(compute.measure_point, point)


@study_task("offload")
def capacity_point(point: dict, slot) -> dict:
    from hpcdl.studies.offload import compute

    return slot.run(compute.search_point, point)


def main(argv=None) -> None:
    run = start_app("offload", argv, __doc__.splitlines()[0])
    cfg = run.cfg
    try:
        slow, owned, stale = sweep.prepare_slow_dir(cfg)  # stale: an interrupted run's offload files
    except sweep.SlowTierError as exc:
        print(f"error: {exc.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    # resolved once and recorded (start_app has refused `cuda` without a GPU); on cuda each task holds a GPU
    device = run.device
    cuda = device == "cuda"
    points, capacity = sweep.sweep_points(cfg, device), sweep.capacity_points(cfg, device)
    skipped = [s for s in cfg["offload"]["strategies"] if s not in sweep.strategies(cfg, device)]
    run.log(
        f"{len(points)} sweep points, {len(capacity)} capacity searches on "
        f"{'CUDA (GPU > pinned host)' if cuda else 'CPU (process memory > files in ' + str(slow) + ')'}"
        + (f"; removed {len(stale)} stale offload run dir(s)" if stale else "")
        + (
            f"; skipped on CPU: {', '.join(f'{s} ({sweep.CPU_ONLY_SKIPPED[s]})' for s in skipped)}"
            if skipped
            else ""
        )
    )
    batches = [
        run.submit("sweep", points, lambda p, slot: run_point(p, slot)),
        run.submit("capacity", capacity, lambda p, slot: capacity_point(p, slot)),
    ]
    sweep_out, cap_out = run.gather(batches)
    if owned:
        shutil.rmtree(slow, ignore_errors=True)

    steps, timeline, caps = [], [], []
    for o in sweep_out:
        label = {"strategy": o.point["strategy"], "depth": o.point["depth"], "width": o.point["width"]}
        if not o.ok:
            steps.append(failed_row(label, o.error))
            continue
        steps.append({**o.result["record"], "status": "ok", "error": ""})
        timeline += [{**label, **span} for span in o.result["timeline"]]
    for o in cap_out:
        label = {
            "strategy": o.point["spec"]["strategy"],
            "width": o.point["spec"]["width"],
            "budget_mb": o.point["spec"]["budget_mb"],
        }
        caps.append(failed_row(label, o.error) if not o.ok else {**o.result, "status": "ok", "error": ""})
    raw = run.raw
    write_table(pd.DataFrame(steps), raw / "steps.csv", cfg, run.started)
    write_table(
        pd.DataFrame(
            timeline, columns=["strategy", "depth", "width", "lane", "kind", "start_s", "end_s", "span_bytes"]
        ),
        raw / "timeline.csv",
        cfg,
        run.started,
    )
    write_table(pd.DataFrame(caps), raw / "capacity.csv", cfg, run.started)
    run.write_summary()
    failed = sum(r["status"] == "failed" for r in steps + caps)
    run.log(f"done in {time.time() - run.started:.0f} s; {failed} failed point(s)")


if __name__ == "__main__":
    main()
