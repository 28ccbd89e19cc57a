"""The CUDA path in one command: benchmark cuDNN's modes, plan (DP + ILP), execute, print speedups.

    python -m hpcdl.studies.microbatch.gpu_probe --out DIR [--batch 64] [--image 224] [--networks ...]

Depends on torch, numpy, pandas and scipy only (no Snakemake, no config file). For each network it
prints the executed plan's speedup over PyTorch's default (cuDNN heuristic, NCHW, TF32 off) per
policy and planner, the predicted speedup, the prediction error and the planning cost (benchmark
and solver time), and writes every raw table as CSV under DIR. Candidates on CUDA are what PyTorch
exposes (cudnn.benchmark on/off x NCHW/NHWC); PyTorch cannot select a cuDNN algorithm by id.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--networks", nargs="+", default=["alexnet", "resnet18", "deepbench"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--deepbench-scale", type=float, default=0.5)
    ap.add_argument("--policies", nargs="+", default=["undivided", "powerOfTwo", "all"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--exec-repeats", type=int, default=10)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu", "auto"])
    ap.add_argument("--switch-margin", type=float, default=0.05,
                    help="predicted gain a kernel needs to leave the default (microbatch.switch_margin)")
    args = ap.parse_args(argv)
    from hpcdl.studies.microbatch.compute import run_network
    from hpcdl.studies.microbatch.tables import SEED_SPEEDUP, layer_speedup, network_speedup

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tables: dict[str, list] = {}
    t_all = time.perf_counter()
    for net in args.networks:
        t0 = time.perf_counter()
        res = run_network(
            net,
            args.device,
            args.batch,
            args.image,
            args.deepbench_scale,
            None,
            args.policies,
            args.repeats,
            1,
            args.exec_repeats,
            [0.25, 0.5, 1, 2, 4],
            None,
            0,
            switch_margin=args.switch_margin,
        )
        meta = res.pop("meta")
        for name, rows in res.items():
            tables.setdefault(name, []).extend(
                {**r, "device": meta["device"], "status": r.get("status", "ok")} for r in rows
            )
        print(
            f"[gpu_probe] {net}: {time.perf_counter() - t0:.0f} s on {meta['gpu'] or meta['device']} "
            f"(torch {meta['torch']})",
            flush=True,
        )
    for name, rows in tables.items():
        pd.DataFrame(rows).to_csv(args.out / f"{name}.csv", index=False)
    execution = pd.DataFrame(tables["execution"])
    nets = network_speedup(execution, pd.DataFrame(tables["network_rounds"]), pd.DataFrame(tables["plans"]))
    layer_speedup(execution).to_csv(args.out / "layer_speedup.csv", index=False)
    nets.to_csv(args.out / "network_speedup.csv", index=False)
    planning = pd.DataFrame(tables["planning"])
    bench = pd.DataFrame(tables["bench"])
    pd.set_option("display.width", 200)
    print(
        "\nper-network conv fwd+bwd time: executed plan vs PyTorch default (measured), and the DP/ILP "
        "prediction"
    )
    print(
        nets[
            [
                "network",
                "policy",
                "planner",
                "measured_default_s",
                "measured_plan_s",
                "measured_speedup",
                "predicted_speedup",
                "prediction_error_frac",
                "prediction_error_scaled_frac",
                "max_rel_err",
            ]
        ].to_string(index=False)
    )
    print("\nplanning cost (s): benchmark of the sizes each policy needs, DP, ILP solve")
    print(
        planning[["network", "policy", "bench_s", "dp_s", "ilp_solve_s", "front_points"]].to_string(
            index=False
        )
    )
    ran = bench[bench["status"] == "ok"].groupby("algorithm")["ran"].agg(lambda s: s.value_counts().index[0])
    print("\nwhat ran (most frequent, per candidate):")
    print(ran.to_string())
    print(
        f"\nμ-cuDNN's V100 reference: {json.dumps(SEED_SPEEDUP)}; total {time.perf_counter() - t_all:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
