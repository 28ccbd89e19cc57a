"""One command for the CUDA path of the offload study (needs only torch, numpy and pandas):

    python -m hpcdl.studies.offload.gpu_probe --out DIR

Fast tier = GPU memory (torch.cuda.max_memory_allocated), slow tier = pinned host memory, copies on
their own CUDA streams. Runs every strategy (none, optimizer, activations, both, and torch's
save_on_cpu) at a few depths, then the capacity search under a fast-tier budget, and prints the
memory ratio (both / none at the largest depth), the hidden fraction per strategy, the capacity
ratio (both / none parameters under the budget), the slowdown per strategy and whether the weights
equal none's. Writes steps.csv, capacity.csv and timeline.csv to DIR. `--device cpu` runs the same
on the CPU tiers (a smoke test where there is no GPU).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from hpcdl.studies.offload.capacity import largest_depth
from hpcdl.studies.offload.train import STRATEGIES, RunSpec, train


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--depths", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    ap.add_argument("--budget-mb", type=float, default=2048.0)
    ap.add_argument("--max-depth", type=int, default=256)
    ap.add_argument("--capacity-strategies", nargs="+", default=["none", "optimizer", "activations", "both"])
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slow = Path(tempfile.mkdtemp(prefix="offload-slow-"))
    strategies = [s for s in STRATEGIES if args.device == "cuda" or s != "save_on_cpu"]
    started = time.time()
    rows, spans = [], []
    print(
        f"[gpu_probe] {torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU'}; "
        f"torch {torch.__version__}; "
        f"width {args.width}, batch {args.batch}, depths {args.depths}",
        flush=True,
    )
    for depth in args.depths:
        for s in strategies:
            spec = RunSpec(
                s,
                args.width,
                depth,
                args.batch,
                args.steps,
                device=args.device,
                slow_dir=str(slow),
                bucket_mb=args.bucket_mb,
                warmup_steps=2,
            )
            try:
                rec, tl = train(spec)
            except Exception as exc:  # a strategy that cannot run at this size is a row, not a crash
                rows.append(
                    {
                        "strategy": s,
                        "depth": depth,
                        "status": "failed",
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                )
                print(f"  {s:12s} depth {depth}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            rows.append({**rec, "status": "ok", "error": ""})
            spans += [{"strategy": s, "depth": depth, **x} for x in tl]
            print(
                f"  {s:12s} depth {depth:4d}: peak fast {rec['peak_fast_bytes'] / 2**20:9.1f} MiB, step "
                f"{rec['step_s'] * 1000:8.1f} ms, hidden {rec['hidden_frac']:.3f}, exposed "
                f"{rec['exposed_transfer_s'] * 1000:.1f} ms of {rec['transfer_s'] * 1000:.1f} ms transfer",
                flush=True,
            )
    steps = pd.DataFrame(rows)
    steps.to_csv(out / "steps.csv", index=False)
    pd.DataFrame(spans).to_csv(out / "timeline.csv", index=False)
    caps = []
    for s in args.capacity_strategies:
        spec = RunSpec(
            s,
            args.width,
            1,
            args.batch,
            2,
            device=args.device,
            slow_dir=str(slow),
            bucket_mb=args.bucket_mb,
            warmup_steps=0,
            budget_mb=args.budget_mb,
        )
        t0 = time.time()
        caps.append(largest_depth(spec, args.max_depth))
        print(
            f"  capacity {s:12s}: {caps[-1]['max_depth']} layers "
            f"({caps[-1]['max_params'] / 1e6:.1f} M params) "
            f"under {args.budget_mb:g} MiB; probes {caps[-1]['probes']} ({time.time() - t0:.0f} s)",
            flush=True,
        )
    cap = pd.DataFrame(caps)
    cap.to_csv(out / "capacity.csv", index=False)
    _summary(steps, cap, time.time() - started)
    return 0


def _summary(steps: pd.DataFrame, cap: pd.DataFrame, elapsed: float) -> None:
    ok = steps[steps["status"] == "ok"]
    print(f"\n[gpu_probe] summary ({elapsed:.0f} s)")
    base = ok[ok["strategy"] == "none"].set_index("depth")
    for _, r in ok[ok["strategy"] != "none"].iterrows():
        if r["depth"] in base.index:
            b = base.loc[r["depth"]]
            print(
                f"  {r['strategy']:12s} depth {int(r['depth']):4d}: "
                f"memory ratio {r['peak_fast_bytes'] / b['peak_fast_bytes']:.3f}, "
                f"slowdown {r['step_s'] / b['step_s']:.3f}, hidden fraction {r['hidden_frac']:.3f}, "
                f"weights equal none: {r['weights_sha256'] == b['weights_sha256']}"
            )
    if not cap.empty and {"none", "both"} <= set(cap["strategy"]):
        c = cap.set_index("strategy")
        n = c.loc["none", "max_params"]
        print(
            f"  capacity ratio both/none: {c.loc['both', 'max_params'] / n:.2f} "
            f"({c.loc['both', 'max_depth']} vs {c.loc['none', 'max_depth']} layers)"
            if n
            else "  none fits 0 layers"
        )


if __name__ == "__main__":
    raise SystemExit(main())
