"""Micro-batched convolution benchmarks: ratios measured in one run (never fails on timing).

    python benchmarks/bench_microbatch.py [--networks alexnet resnet18 deepbench] [--batch 8]
                                          [--image 64] [--deepbench-layers subset] [--device auto]
                                          [--csv PATH]

Per network and policy, for the ILP plan at a total workspace budget equal to the default's:
1. planned / default time: the executed plan's whole-network fwd+bwd conv time over the default's
   (median of the same interleaved rounds), and the planner's predicted ratio;
2. the plan's workspace / the budget (<= 1 by construction of the ILP);
3. planning cost: benchmark seconds of the sizes the policy needs, DP and solver seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import emit, parser  # noqa: E402
from hpcdl.platform.task_app import resolved_device  # noqa: E402
from hpcdl.studies.microbatch.compute import run_network  # noqa: E402
from hpcdl.studies.microbatch.tables import network_speedup  # noqa: E402


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--networks", nargs="+", default=["alexnet", "resnet18", "deepbench"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--image", type=int, default=64)
    p.add_argument("--deepbench-scale", type=float, default=0.25)
    p.add_argument("--deepbench-layers", default="subset", choices=["subset", "training_3x3_5x5"],
                   help="DeepBench's six-layer subset, or the training set's 3x3 and 5x5 layers (μ-cuDNN's)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--stack-vetting-rounds", type=int, default=21,
                   help="rounds vetting each moved layer inside the network (0: plan on the benchmark alone)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = resolved_device(args.device, "--device")  # once, as the task app does: run_network takes it
    rows = []
    for net in args.networks:
        res = run_network(
            net,
            device,
            args.batch,
            args.image,
            args.deepbench_scale,
            None,
            ["undivided", "powerOfTwo", "all"],
            5,
            1,
            9,
            [1.0],
            None,
            0,
            stack_vetting_rounds=args.stack_vetting_rounds,
            deepbench_layers=args.deepbench_layers,
        )
        ex = pd.DataFrame(res["execution"])
        speed = network_speedup(ex.assign(device=res["meta"]["device"], status="ok"),
                                pd.DataFrame(res["network_rounds"]))
        plan = pd.DataFrame(res["planning"]).set_index("policy")
        for r in speed[speed["planner"] == "ilp"].itertuples():
            pl = plan.loc[r.policy]
            rows.append(
                {
                    "network": net,
                    "policy": r.policy,
                    "device": res["meta"]["device"],
                    "planned_over_default": r.measured_plan_s / r.measured_default_s,
                    "predicted_planned_over_default": r.predicted_plan_s / r.predicted_default_s,
                    "plan_workspace_over_budget": pl["ilp_workspace_bytes"] / pl["default_workspace_bytes"],
                    "bench_s": pl["bench_s"],
                    "dp_s": pl["dp_s"],
                    "ilp_solve_s": pl["ilp_solve_s"],
                }
            )
    emit(rows, args.csv)


if __name__ == "__main__":
    main()
