"""Cost of the point store per point, against the point's own run time.

    python benchmarks/bench_points.py [--reps 100] [--dir DIR] [--csv out.csv]

Per record size (rows of 20 numeric columns, as the studies' records are): the key (hash of a
point's inputs), the task body's store work (start marker + JSON + temp file, fsync, rename +
read-back) and the main program's lookup of a stored record, in DIR (default: a temporary
directory under ./results, the file system results live on). Then the cheapest real point of the
project, a 4096-parameter torch checkpoint save/load (hpcdl.studies.checkpoint.compute.run_point), run
bare and through the store: the ratio is the store's share of a point's time at its worst.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, parser  # noqa: E402

from hpcdl.platform.task_app import StudyRun, point_key, read_record  # noqa: E402
from hpcdl.studies.checkpoint import compute  # noqa: E402


def _record(rows: int) -> list[dict]:
    return [{"point": "partial-q0.1-random-M8-F0-s0", "rank": r % 8, "epoch": r // 8,
             **{f"value_{i}_s": 0.1234567891234 * (r + i) for i in range(18)}} for r in range(rows)]


def _timed(fn, reps: int) -> float:
    """Median seconds of fn() over reps calls (the median: other load on the machine only adds time)."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--dir", type=Path, default=Path("results"))
    args = p.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-points-", dir=args.dir))
    try:
        run = StudyRun({"results_dir": str(tmp)}, "bench")
        inputs = {"point": {"strategy": "partial", "q": 0.1, "world_size": 8, "seed": 0},
                  "block": {"model": {"channels": [8, 16, 16], "dense": [64]}, "lr": 0.003, "seed": 0,
                            "grf": {"amplitude": [0.5, 2.0], "ns": [-3.0, -1.0]}, "run_timeout_s": 300}}
        rows = []
        for n_rows in (1, 100, 1000):
            record = _record(n_rows)
            slot = run.plan("bench", [{"rows": n_rows}]).entries[0].slot
            key_s = _timed(lambda: point_key("bench", "bench", inputs), args.reps)
            write_s = _timed(lambda rec=record, s=slot: s.run(lambda: rec), args.reps)
            read_s = _timed(lambda s=slot: read_record(s.root, s.key), args.reps)
            size = (Path(slot.root) / f"{slot.key}.json").stat().st_size
            rows.append({"measure": f"store ops, {n_rows}-row record", "record_bytes": size,
                         "key_ms": key_s * 1e3, "write_ms": write_s * 1e3, "read_ms": read_s * 1e3,
                         "total_ms": (key_s + write_s + read_s) * 1e3})

        scratch = str(tmp / "scratch")
        point = {"fmt": "torch", "mode": "sync", "n_params": 4096, "scratch_dir": scratch, "cold_load": True}
        compute.run_point(**point)  # warm imports and allocator
        bare_s = _timed(lambda: compute.run_point(**point), max(5, args.reps // 10))
        slot = run.plan("io", [point]).entries[0].slot
        stored_s = _timed(lambda: (point_key("bench", "io", point), slot.run(compute.run_point, **point),
                                   read_record(slot.root, slot.key)), max(5, args.reps // 10))
        store_ms = rows[0]["total_ms"]
        rows.append({"measure": "smallest checkpoint point (torch, 4096 params)",
                     "record_bytes": (Path(slot.root) / f"{slot.key}.json").stat().st_size,
                     "point_bare_ms": bare_s * 1e3, "point_stored_ms": stored_s * 1e3,
                     "total_ms": store_ms, "store_ops_over_point": store_ms / 1e3 / bare_s,
                     "stored_over_bare": stored_s / bare_s})
        emit(rows, args.csv)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
