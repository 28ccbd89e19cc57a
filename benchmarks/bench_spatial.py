"""Spatial study benchmark: ratios measured in one run (never fails on timing).

  1. 1-rank / 2-rank time of one Conv3d forward+backward on the same global input, one thread per rank
  2. halo-exchange share of the iteration time of a 2-rank spatial training run
  3. oracle prediction / measurement for 1- and 2-rank training runs (oracle calibrated here)
  4. communication hiding: 2-rank iteration time with every exchange blocking / with halo overlapped
     and bucketed all-reduce during the backward; 2-rank efficiency against the no-communication ceiling

    python benchmarks/bench_spatial.py [--grid 32] [--device auto|cpu|cuda] [--gpu-sharing] [--csv PATH]

Every launch runs on --device (resolved as a study's `device` is: auto is CUDA where a GPU is
visible); two ranks on one GPU need --gpu-sharing (gloo through host memory, labelled so).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the ranks import the rank target "spatial_conv:conv_fwd_bwd" from this directory
BENCH_DIR = str(Path(__file__).resolve().parent)

from hpcdl.common.layers import build_spec  # noqa: E402
from hpcdl.platform.task_app import (  # noqa: E402
    DEVICES,
    available_cores,
    pythonpath,
    resolved_device,
    run_ranks,
)
from hpcdl.studies.spatial.data import ensure_dataset  # noqa: E402
from hpcdl.studies.spatial.perfmodel.fit import fit_machine  # noqa: E402
from hpcdl.studies.spatial.perfmodel.oracle import Strategy, predict  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=int, default=32, help="global input grid^3")
    ap.add_argument("--channels", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--comm-gap-ms", type=float, default=2.0,
                    help="compute before each timed collective in the calibration (0: back to back)")
    ap.add_argument("--device", choices=DEVICES, default="auto", help="where the ranks compute")
    ap.add_argument("--gpu-sharing", action="store_true", help="let ranks share a GPU (over gloo)")
    ap.add_argument("--csv", help="also write the table here")
    args = ap.parse_args(argv)
    placed = {"device": resolved_device(args.device, "--device"), "gpu_sharing": args.gpu_sharing}
    os.environ["PYTHONPATH"] = pythonpath(BENCH_DIR)  # inherited by the ranks
    g = args.grid
    rows = []

    conv = {}
    for n in (1, 2):
        res = run_ranks("spatial_conv:conv_fwd_bwd", n, {
            "shape": (g, g, g), "cin": args.channels, "cout": args.channels, "kernel": 3, "batch": args.batch,
            "repeats": 7}, timeout_s=600, **placed)
        conv[n] = (max(r["time_s"] for r in res), max(r["halo_s"] for r in res))
        measured_on = ", ".join(sorted({r["placement"] for r in res}))  # the 2-rank launch's, last
    rows.append({"measure": f"conv3d fwd+bwd {g}^3 x{args.channels}ch: 1-rank / 2-rank time",
                 "ratio": conv[1][0] / conv[2][0],
                 "detail": f"{conv[1][0] * 1e3:.1f} ms / {conv[2][0] * 1e3:.1f} ms"})
    rows.append({"measure": "conv3d 2-rank: halo share of fwd+bwd", "ratio": conv[2][1] / conv[2][0],
                 "detail": f"{conv[2][1] * 1e3:.2f} ms halo"})

    model = {"channels": [8, 16, 16], "dense": [64]}
    with tempfile.TemporaryDirectory() as tmp:
        data = ensure_dataset(tmp, (g, g, g), 16, 0, (0.5, 2.0), (-3.0, -1.0))
        spec = build_spec((g, g, g), model)
        cal = run_ranks("hpcdl.studies.spatial.calibration.microbench:calibrate_rank", 2, {
            "specs": [(spec, args.batch)], "data_dir": str(data),
            "sizes_bytes": [1024, 65536, 1048576, 4194304],
            "fractions": [1.0, 0.5, 0.25], "repeats": 5, "comm_gap_s": args.comm_gap_ms / 1e3},
            timeout_s=600, **placed)[0]
        def train(n, **kw):
            res = run_ranks("hpcdl.studies.spatial.train:train_run", n, {
                "data_dir": str(data), "n_data": 1, "grid": (n, 1), "model": model, "batch_size": args.batch,
                "iterations": args.iterations, "lr": 1e-3, "seed": 0, **kw}, timeout_s=600, **placed)
            it = pd.DataFrame([{**rec, "rank": r["rank"]} for r in res for rec in r["records"]])
            it = it[it["iteration"] >= 2].groupby("iteration")
            return float(it["total_s"].max().median()), float(it["halo_s"].mean().median())

        machine, consts = fit_machine(cal, cores=available_cores(), overlap=True)
        for n in (1, 2):
            total, halo = train(n)
            pred = predict(spec, args.batch, Strategy(depth=n), machine)["total_s"]
            if n == 2:
                rows.append({"measure": "training 2-rank: exposed halo share of iteration",
                             "ratio": halo / total,
                             "detail": f"{halo * 1e3:.2f} ms of {total * 1e3:.1f} ms"})
            rows.append({"measure": f"oracle / measured, training {n} rank(s)", "ratio": pred / total,
                         "detail": f"{pred * 1e3:.1f} ms / {total * 1e3:.1f} ms"})
            conv[f"train{n}"] = total
        blocking, _ = train(2, overlap=False)
        ceiling, _ = train(2, communicate=False)
        rows.append({"measure": "training 2-rank: blocking / hidden communication iteration time",
                     "ratio": blocking / conv["train2"],
                     "detail": f"{blocking * 1e3:.1f} ms / {conv['train2'] * 1e3:.1f} ms"})
        rows.append({"measure": "training 2-rank: efficiency vs no-communication ceiling",
                     "ratio": (conv["train1"] / conv["train2"]) / (conv["train1"] / ceiling),
                     "detail": f"ceiling speedup {conv['train1'] / ceiling:.2f}"})
    rows.append({"measure": "training: 1-rank / 2-rank iteration time",
                 "ratio": conv["train1"] / conv["train2"],
                 "detail": ""})
    df = pd.DataFrame(rows)
    with pd.option_context("display.max_colwidth", 80, "display.width", 160):
        print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"(measured on {measured_on}; cores available: {available_cores()}; "
          f"ping-pong bandwidth {consts['bandwidth_gbs']:.2f} GB/s, "
          f"latency {consts['alpha_s'] * 1e6:.0f} us; conv {consts['conv_gflops']:.1f} GFLOP/s)")
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
