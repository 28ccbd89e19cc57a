"""The async snapshot's CPU copy, torch's `copy_` against the queued chunk copy (host_copy.py), on an
idle machine and beside a process spinning on one core; ratios of one run, never a pass/fail.

    python benchmarks/snapshot_copy.py [--size-mib 256] [--copies 100] [--csv out.csv]

For each copy method and condition: median, 95th percentile and worst copy time, and the tail as
p95 / median. The spinner is a real busy process (`sh -c 'while :; do :; done'`), started before
the copies and killed after them.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks._common import emit, parser  # noqa: E402
from hpcdl.studies.checkpoint.host_copy import QueuedCopy  # noqa: E402
from hpcdl.studies.checkpoint.instruments import synthetic_state  # noqa: E402


def _times(copy, copies: int) -> list[float]:
    out = []
    for _ in range(copies):
        t0 = time.perf_counter()
        copy()
        out.append(time.perf_counter() - t0)
        time.sleep(0.01)  # a training step's worth of pause between snapshots
    return sorted(out)


def main(argv=None) -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=float, default=256.0, help="fp32 state size (MiB)")
    ap.add_argument("--copies", type=int, default=100)
    a = ap.parse_args(argv)
    state = synthetic_state(max(1024, int(a.size_mib * 2**20) // 4 // 1024 * 1024))
    buffers = {k: torch.zeros_like(t) for k, t in state.items()}
    queued = QueuedCopy(torch.get_num_threads())
    methods = {"torch copy_": lambda: [buffers[k].copy_(t) for k, t in state.items()],
               "queued chunks": lambda: queued(buffers, state)}
    rows = []
    for condition in ("idle", "one core busy"):
        spinner = (subprocess.Popen(["sh", "-c", "while :; do :; done"]) if condition != "idle" else None)
        try:
            for name, copy in methods.items():
                copy()  # first touch outside the timings
                t = _times(copy, a.copies)
                p95 = t[int(0.95 * (len(t) - 1))]
                rows.append({"condition": condition, "method": name, "median_ms": statistics.median(t) * 1e3,
                             "p95_ms": p95 * 1e3, "max_ms": t[-1] * 1e3,
                             "p95_over_median": p95 / statistics.median(t)})
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    queued.close()
    emit(rows, a.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
