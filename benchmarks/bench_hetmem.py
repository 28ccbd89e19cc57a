"""hetmem benchmarks: ratios measured in one run (never fails on timing).

    python benchmarks/bench_hetmem.py [--apps stream,cg,gups] [--config configs/default.yaml] [--csv PATH]

Per app (kernel sizes and cache/tier settings from the config's hetmem block):
1. tracing overhead: the kernel's compute phase under valgrind lackey (--trace-mem=yes, trace to a
   file) / the same phase untraced, and the same for the whole process (valgrind start-up included);
2. estimates per second: single-placement estimates (random page-range placements) and batched
   ones (1000 placements in one call), against one simulated reference run per second.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import emit, parser  # noqa: E402
from hpcdl.platform.task_app import validate_config  # noqa: E402
from hpcdl.studies.hetmem import agent, reference  # noqa: E402
from hpcdl.studies.hetmem.compute import build_estimator  # noqa: E402
from hpcdl.studies.hetmem.layout import Layout, range_pages_for  # noqa: E402
from hpcdl.studies.hetmem.trace import trace_app  # noqa: E402


def bench_app(app: dict, block: dict, work: Path) -> dict:
    trace, info = trace_app(app["name"], app["size"], app["iters"], work)
    layout = Layout(trace.objects)
    prof = reference.simulate(trace, layout, block)
    model = reference.TimingModel.from_config(block)
    win = reference.window_times(
        prof, model, np.stack([np.ones(layout.n_pages, bool), np.zeros(layout.n_pages, bool)])
    )
    est = build_estimator(prof, win[0], win[1], block["sample_every"], 0)
    ranges = layout.ranges(range_pages_for(layout, block["n_ranges"]))
    rng = np.random.default_rng(0)
    masks = np.stack(
        [
            layout.ranges_mask(ranges, agent.random_policy(ranges, int(f * layout.n_pages), rng))
            for f in rng.uniform(0, 1, 1000)
        ]
    )
    t0 = time.perf_counter()
    for m in masks[:200]:
        est.estimate_one(m)
    single = 200 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    est.estimate(masks)
    batched = len(masks) / (time.perf_counter() - t0)
    _, one_ref_s = reference.reference_runs(prof, model, masks[:1])
    return {
        "app": app["name"],
        "accesses": info["accesses"],
        "raw_trace_mb": info["raw_trace_mb"],
        "tracing_overhead_compute": info["traced_compute_s"] / info["untraced_compute_s"],
        "tracing_overhead_process": info["traced_wall_s"] / info["untraced_wall_s"],
        "parse_accesses_per_s": info["accesses"] / info["parse_s"],
        "estimates_per_s": single,
        "estimates_per_s_batched": batched,
        "reference_runs_per_s_simulated": 1.0 / one_ref_s,
        "estimate_speedup": single * one_ref_s,
    }


def main(argv=None) -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument(
        "--config", type=Path, default=Path(__file__).resolve().parent.parent / "configs" / "default.yaml"
    )
    ap.add_argument("--apps", default="", help="comma-separated subset of the config's apps")
    args = ap.parse_args(argv)
    block = validate_config(yaml.safe_load(args.config.read_text()))["hetmem"]
    apps = [a for a in block["apps"] if not args.apps or a["name"] in args.apps.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench_app(a, block, Path(tmp)) for a in apps]
    emit(rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
