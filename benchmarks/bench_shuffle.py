"""Shuffle benchmarks: ratios measured in one run (never fails on timing).

    python benchmarks/bench_shuffle.py [--ranks 4] [--n-train 4800] [--epochs 4] [--csv PATH]

1. exchange throughput / memcpy bandwidth: the partial-Q all_to_all (gloo, loopback) of the
   same bytes a Q = 0.1 and a Q = 1 epoch move, against one in-process copy of those bytes;
2. fraction of the exchange hidden behind compute at Q = 0.1 (1 - exposed / exchange time);
3. epoch time of local / global shuffling (same model, data, ranks).
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

from hpcdl.platform.rank_runtime.launch import run_ranks  # noqa: E402
from hpcdl.studies.shuffle import data as shuffle_data  # noqa: E402
from hpcdl.studies.shuffle.exchange_plan import exchange_count  # noqa: E402

TRAIN = dict(batch_size=64, lr=0.1, momentum=0.9, model={"kind": "mlp_bn", "width": 64, "depth": 2},
             alpha=0.1, partitioning="random", runs=[{"seed": 0, "kakurenbo_fraction": 0.0, "round": 0}])


def _epochs(data, strategy, q, ranks, epochs):
    res = run_ranks("hpcdl.studies.shuffle.train:train_rank", ranks,
                    dict(data=data, strategy=strategy, q=q, epochs=epochs, **TRAIN), timeout_s=600)
    return pd.DataFrame([r for out in res for r in out["records"]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--n-train", type=int, default=4800)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--csv", help="also write the table here")
    args = ap.parse_args(argv)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (BENCH_DIR, os.environ.get("PYTHONPATH", "")) if p)  # inherited by the ranks
    rows = []
    for q in (0.1, 1.0):
        k = exchange_count(args.n_train, args.ranks, q)
        res = run_ranks("shuffle_exchange:exchange_throughput", args.ranks, {"k": k},
                        timeout_s=300)
        total = sum(r["bytes_sent"] for r in res)
        t = max(r["time_s"] for r in res)              # the exchange ends with its slowest rank
        per_rank_bw = np.mean([r["bytes_sent"] / r["time_s"] for r in res])
        memcpy_bw = np.mean([r["bytes_sent"] / r["memcpy_s"] for r in res])
        rows.append({"metric": f"exchange throughput / memcpy bandwidth (Q={q:g}, {total / 1e6:.1f} MB)",
                     "value": per_rank_bw / memcpy_bw,
                     "detail": f"exchange {total / t / 1e6:.0f} MB/s all ranks, {per_rank_bw / 1e6:.0f} MB/s "
                               f"per rank; memcpy {memcpy_bw / 1e6:.0f} MB/s"})
    with tempfile.TemporaryDirectory() as tmp:
        data = shuffle_data.prepare(args.data_dir, tmp, args.n_train, args.n_train // 4, seed=0)
        part = _epochs(data, "partial", 0.1, args.ranks, args.epochs)
        ex, exposed = part["exchange_s"].sum(), part["exposed_exchange_s"].sum()
        rows.append({"metric": "fraction of exchange hidden behind compute (Q=0.1; target >= 0.9)",
                     "value": 1 - exposed / ex if ex > 0 else float("nan"),
                     "detail": f"exchange {ex / len(part) * 1e3:.1f} ms, exposed "
                               f"{exposed / len(part) * 1e3:.2f} ms per rank-epoch"})
        # epoch 0 carries the one-off partition read of local: compare steady-state epochs
        loc = _epochs(data, "local", 0.0, args.ranks, args.epochs)
        glo = _epochs(data, "global", 1.0, args.ranks, args.epochs)
        tl = loc[loc["epoch"] > 0]["epoch_s"].mean()
        tg = glo[glo["epoch"] > 0]["epoch_s"].mean()
        rows.append({"metric": "epoch time local / global", "value": tl / tg,
                     "detail": f"local {tl:.3f} s, global {tg:.3f} s per epoch (loading: local "
                               f"{loc[loc['epoch'] > 0]['load_s'].mean() * 1e3:.1f} ms, global "
                               f"{glo[glo['epoch'] > 0]['load_s'].mean() * 1e3:.1f} ms)"})
    table = pd.DataFrame(rows)
    with pd.option_context("display.max_colwidth", 200, "display.width", 250):
        print(f"shuffle benchmarks: {args.ranks} ranks, N = {args.n_train}, {args.epochs} epochs")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
