"""Local PyCOMPSs backend overhead per no-op task, against a bare ProcessPoolExecutor.

    python benchmarks/bench_runtime.py [--tasks 500] [--csv out.csv]

Both pools are warmed up first, so the numbers are the per-task dispatch cost
(submit, dependency/units bookkeeping, pickling, result hand-back), not process start-up.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import runtime_tasks  # noqa: E402
from _common import emit, parser  # noqa: E402

from hpcdl.platform.task_app import compss_wait_on, set_local_cores  # noqa: E402


def _noop():
    return None


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--tasks", type=int, default=500)
    args = p.parse_args()
    n = args.tasks

    set_local_cores(2)
    compss_wait_on([runtime_tasks.noop() for _ in range(4)])  # warm the workers
    t0 = time.perf_counter()
    compss_wait_on([runtime_tasks.noop() for _ in range(n)])
    local_ms = (time.perf_counter() - t0) / n * 1e3

    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        [f.result() for f in [pool.submit(_noop) for _ in range(4)]]
        t0 = time.perf_counter()
        [f.result() for f in [pool.submit(_noop) for _ in range(n)]]
        bare_ms = (time.perf_counter() - t0) / n * 1e3

    emit([{"measure": "no-op task overhead", "tasks": n, "hpcdl_local_ms": local_ms,
           "bare_pool_ms": bare_ms, "ratio_local_over_bare": local_ms / bare_ms,
           "target_ms": 5.0, "within_target": local_ms <= 5.0}], args.csv)


if __name__ == "__main__":
    main()
