"""Malleability costs as ratios and latencies measured in one run (never fails on a timing).

    python benchmarks/bench_malleable.py [--changes 6] [--width 32] [--batch 128] [--csv out.csv]

1. Cost of one thread-count change: a job alternates between `--cores` and 1 threads through
   set_threads() every 8 iterations; per change, the first iteration with the new count divided
   by the steady (median) iteration at that count, and the set_num_threads call itself.
2. Scheduler decision latency per event: the policy's decision alone (n running jobs), and a real
   co-scheduled workload of tiny jobs (policy + cgroup quota writes + control file + SIGUSR1 per
   event; admissions include the job's fork from the forkserver).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._common import emit, parser  # noqa: E402
from hpcdl.studies.malleable import cgroups, compute, policies, response  # noqa: E402
from hpcdl.studies.malleable.scheduler import CoScheduler  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def change_cost(changes: int, cores: int, width: int, batch: int, work: Path) -> list[dict]:
    period = 8
    schedule = [[period * (i + 1), 1 if i % 2 == 0 else cores] for i in range(changes)]
    spec = {
        "name": "bench",
        "iterations": period * (changes + 1),
        "threads": cores,
        "max_threads": cores,
        "batch_size": batch,
        "model": {"width": width, "depth": 2},
        "data_dir": DATA,
        "seed": 0,
        "log_file": str(work / "bench.jsonl"),
        "control_file": str(work / "bench.ctl"),
        "cgroup": None,
        "follow_quota": False,
        "api_schedule": schedule,
    }
    res = response._run(spec, [], 600)
    rows = [
        r
        for r in compute.change_rows({"experiment": "bench", "variant": "api"}, res)
        if r["outcome"] == "applied"
    ]
    out = []
    for direction, sel in (
        ("down", lambda r: r["target_threads"] < r["old_threads"]),
        ("up", lambda r: r["target_threads"] > r["old_threads"]),
    ):
        d = [r for r in rows if sel(r) and r["steady_iter_s"]]
        if d:
            out.append(
                {
                    "measure": f"thread change {direction} ({d[0]['old_threads']}->{d[0]['target_threads']})",
                    "n": len(d),
                    "first_over_steady": statistics.median(r["first_iter_s"] / r["steady_iter_s"] for r in d),
                    "steady_iter_ms": 1000 * statistics.median(r["steady_iter_s"] for r in d),
                    "set_call_us": 1e6 * statistics.median(r["set_call_s"] for r in d),
                    "lag_iters_max": max(r["lag_iters"] for r in d),
                }
            )
    return out


def decide_latency(cores: int) -> list[dict]:
    out = []
    for n in (4, 16, 64):
        running = [policies.JobView(str(i), 1, 10 + i, 1.0) for i in range(n)]
        for policy in policies.POLICIES:
            reps = 2000
            t0 = time.perf_counter()
            for _ in range(reps):
                policies.decide(policy, cores * 8, running, [policies.JobView("new", 2, 50)])
            out.append(
                {
                    "measure": f"decide {policy}, {n} running jobs",
                    "n": reps,
                    "decide_us": 1e6 * (time.perf_counter() - t0) / reps,
                }
            )
    return out


def scheduler_latency(cores: int, work: Path) -> list[dict]:
    ctrl, why = cgroups.usable()
    run = cgroups.RunCgroups(ctrl, 10000) if ctrl else None
    jobs = [{"name": str(i), "arrival_s": 0.3 * i, "iterations": 30, "request_cores": 1} for i in range(4)]
    try:
        res = CoScheduler(
            jobs,
            "equal",
            cores,
            {"batch_size": 32, "model": {"width": 8, "depth": 1}, "data_dir": DATA, "seed": 0},
            work,
            run,
        ).run()
    finally:
        if run:
            run.remove()
    events = {}
    for d in res["decisions"]:
        events.setdefault(d["event_index"], d)
    out, enforced = [], "quota+threads" if run else f"threads only: {why}"
    for kind in ("arrival", "departure"):
        ev = [e for e in events.values() if e["event"] == kind]
        if ev:
            out.append(
                {
                    "measure": f"scheduler event: {kind} ({enforced})",
                    "n": len(ev),
                    "decide_us": 1e6 * statistics.median(e["decide_s"] for e in ev),
                    "apply_ms": 1000 * statistics.median(e["apply_s"] for e in ev),
                }
            )
    return out


def main(argv=None) -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=6)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--batch", type=int, default=128)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = change_cost(a.changes, a.cores, a.width, a.batch, Path(tmp))
        rows += decide_latency(a.cores)
        rows += scheduler_latency(a.cores, Path(tmp) / "sched")
    emit(rows, a.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
