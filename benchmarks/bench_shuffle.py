"""Shuffle benchmarks: ratios measured in one run (never fails on timing).

    python benchmarks/bench_shuffle.py [--ranks 4] [--n-train 4800] [--epochs 4] [--device cpu|cuda]
                                       [--csv PATH]

1. exchange throughput / copy bandwidth: the partial-Q all_to_all of the same bytes a Q = 0.1 and
   a Q = 1 epoch move, against one in-process copy of those bytes in the same memory (on the CPU:
   gloo over loopback; with --device cuda: once in host memory over gloo, once as CUDA tensors over
   NCCL);
2. fraction of the exchange hidden behind compute at Q = 0.1 (1 - exposed / exchange time);
3. epoch time of local / global shuffling (same model, data, ranks);
4. with --device cuda, the study's `shuffle.exchange_device` choice: steady-state epoch time of
   partial-0.1 with the samples held and exchanged on the GPU over that with them in host memory
   (below 1: the device exchange is faster). One rank per GPU: --ranks at most the node's GPUs, and
   at least 2 for an exchange to happen.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

BENCH_DIR = str(Path(__file__).resolve().parent)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpcdl.platform.task_app import pythonpath, run_ranks  # noqa: E402
from hpcdl.studies.shuffle import data as shuffle_data  # noqa: E402
from hpcdl.studies.shuffle.exchange_plan import exchange_count  # noqa: E402

TRAIN = dict(batch_size=64, lr=0.1, momentum=0.9, model={"kind": "mlp_bn", "width": 64, "depth": 2},
             alpha=0.1, partitioning="random", runs=[{"seed": 0, "kakurenbo_fraction": 0.0, "round": 0}])


def _epochs(data, strategy, q, ranks, epochs, device, exchange_device="host"):
    res = run_ranks("hpcdl.studies.shuffle.train:train_rank", ranks,
                    dict(data=data, strategy=strategy, q=q, epochs=epochs, exchange_device=exchange_device,
                         **TRAIN), timeout_s=600, device=device)
    return pd.DataFrame([r for out in res for r in out["records"]])


def _steady(df: pd.DataFrame, col: str = "epoch_s") -> float:
    # epoch 0 carries the one-off partition read (and, on CUDA, the first kernels' setup)
    return float(df[df["epoch"] > 0][col].mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--n-train", type=int, default=4800)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the ranks compute (cuda: one rank per GPU)")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--csv", help="also write the table here")
    args = ap.parse_args(argv)
    if args.epochs < 2:
        ap.error("--epochs must be at least 2 (epoch 0 is left out of the steady-state times)")
    os.environ["PYTHONPATH"] = pythonpath(BENCH_DIR)  # inherited by the ranks
    places = ("host", "device") if args.device == "cuda" else ("host",)
    rows = []
    for on in places:
        for q in (0.1, 1.0):
            k = exchange_count(args.n_train, args.ranks, q)
            res = run_ranks("shuffle_exchange:exchange_throughput", args.ranks, {"k": k, "on": on},
                            timeout_s=300, device=args.device)
            total = sum(r["bytes_sent"] for r in res)
            t = max(r["time_s"] for r in res)              # the exchange ends with its slowest rank
            per_rank_bw = np.mean([r["bytes_sent"] / r["time_s"] for r in res])
            copy_bw = np.mean([r["bytes_sent"] / r["memcpy_s"] for r in res])
            how = "host memory, gloo" if on == "host" else "GPU memory, NCCL"
            metric = f"exchange throughput / copy bandwidth ({how}; Q={q:g}, {total / 1e6:.1f} MB)"
            rows.append({"metric": metric, "value": per_rank_bw / copy_bw,
                         "detail": f"exchange {total / t / 1e6:.0f} MB/s all ranks, "
                                   f"{per_rank_bw / 1e6:.0f} MB/s per rank; copy {copy_bw / 1e6:.0f} MB/s; "
                                   f"{res[0]['device']}"})
    with tempfile.TemporaryDirectory() as tmp:
        data = shuffle_data.prepare(args.data_dir, tmp, args.n_train, args.n_train // 4, seed=0)
        part = _epochs(data, "partial", 0.1, args.ranks, args.epochs, args.device)
        ex, exposed = part["exchange_s"].sum(), part["exposed_exchange_s"].sum()
        rows.append({"metric": "fraction of exchange hidden behind compute (Q=0.1, host memory; "
                               "target >= 0.9)",
                     "value": 1 - exposed / ex if ex > 0 else float("nan"),
                     "detail": f"exchange {ex / len(part) * 1e3:.1f} ms, exposed "
                               f"{exposed / len(part) * 1e3:.2f} ms per rank-epoch; "
                               f"{part['device'].iloc[0]}"})
        loc = _epochs(data, "local", 0.0, args.ranks, args.epochs, args.device)
        glo = _epochs(data, "global", 1.0, args.ranks, args.epochs, args.device)
        tl, tg = _steady(loc), _steady(glo)
        rows.append({"metric": "epoch time local / global", "value": tl / tg,
                     "detail": f"local {tl:.3f} s, global {tg:.3f} s per epoch (loading: local "
                               f"{_steady(loc, 'load_s') * 1e3:.1f} ms, global "
                               f"{_steady(glo, 'load_s') * 1e3:.1f} ms)"})
        if args.device == "cuda":
            # the measurement behind shuffle.exchange_device (hpcdl.studies.shuffle.train's docstring)
            dev = _epochs(data, "partial", 0.1, args.ranks, args.epochs, args.device,
                          exchange_device="device")
            th, td = _steady(part), _steady(dev)
            rows.append({"metric": "partial-0.1 epoch time, samples on the GPU (NCCL) / in host memory "
                                   "(gloo)",
                         "value": td / th,
                         "detail": f"device {td * 1e3:.1f} ms, host {th * 1e3:.1f} ms per epoch (loading: "
                                   f"device {_steady(dev, 'load_s') * 1e3:.1f} ms, host "
                                   f"{_steady(part, 'load_s') * 1e3:.1f} ms; exposed exchange: device "
                                   f"{_steady(dev, 'exposed_exchange_s') * 1e3:.2f} ms, host "
                                   f"{_steady(part, 'exposed_exchange_s') * 1e3:.2f} ms)"})
    table = pd.DataFrame(rows)
    with pd.option_context("display.max_colwidth", 250, "display.width", 300):
        print(f"shuffle benchmarks: {args.ranks} ranks on {args.device}, N = {args.n_train}, "
              f"{args.epochs} epochs")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
