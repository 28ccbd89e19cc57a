"""Checkpoint cost as ratios measured in one run (never fails on a timing).

    python benchmarks/bench_checkpoint.py [--size-mib 256] [--repeats 3] [--csv out.csv]

For each format, on a synthetic fp32 state of --size-mib: write bandwidth to durable bytes
divided by the storage ceiling (the same bytes written as a save writes them, one file in a fresh
directory fsync'd the same way, probed right before and after each save after the same untimed
page-cache warm-up; the faster probe is the ceiling), and the asynchronous save's blocking time
divided by the synchronous save time. Scratch goes under results/ and is deleted.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._common import emit, parser  # noqa: E402
from hpcdl.studies.checkpoint import compute  # noqa: E402
from hpcdl.studies.checkpoint.formats import FORMATS  # noqa: E402


def main(argv=None) -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=float, default=256.0, help="fp32 state size (MiB)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    ap.add_argument("--scratch", default=str(REPO / "results" / "bench" / "checkpoint-scratch"))
    a = ap.parse_args(argv)
    n_params = max(1024, int(a.size_mib * 2**20) // 4 // 1024 * 1024)
    rows = []
    for fmt in a.formats:
        sync = compute.run_point(fmt, "sync", n_params, a.scratch, repeats=a.repeats)
        asyn = compute.run_point(fmt, "async", n_params, a.scratch, repeats=a.repeats)
        med = statistics.median
        rows.append({
            "format": fmt, "state_mib": n_params * 4 / 2**20,
            "write_mib_s": med(r["write_bw_bytes_per_s"] for r in sync) / 2**20,
            "ceiling_mib_s": med(r["ceiling_bw_bytes_per_s"] for r in sync) / 2**20,
            "bw_over_ceiling": med(r["write_bw_bytes_per_s"] / r["ceiling_bw_bytes_per_s"] for r in sync),
            "sync_s": med(r["blocking_s"] for r in sync),
            "async_blocking_s": med(r["blocking_s"] for r in asyn),
            "async_over_sync": med(r["blocking_s"] for r in asyn) / med(r["blocking_s"] for r in sync),
        })
        print(f"  {fmt} done", file=sys.stderr, flush=True)
    emit(rows, a.csv)
    print("\nbw_over_ceiling: write bandwidth to fsync'd bytes / the ceiling probe's (same bytes, as a save)"
          "\nasync_over_sync: training stall of an async save / time of a sync save (same format)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
