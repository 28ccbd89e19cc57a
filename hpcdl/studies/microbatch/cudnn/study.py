"""μ-cuDNN's own experiment on one network, on CUDA (issue 38): what the task app runs per network
where microbatch.device resolves to cuda and microbatch.cudnn.engines is true.

1. the engine table: every conv layer's cuDNN plans per kernel and micro-batch size
   (cudnn.bench.benchmark_layer), over the largest limit marked over_limit;
2. the plans (cudnn.plan.plan_network, pure): under every limit of the network
   (cudnn.plan.network_limits_mib: microbatch.cudnn.limits_mib, DeepBench's deepbench_limits_mib where
   set) and the library default (64 MiB), per kernel the undivided baseline, the DP (μ-cuDNN's WR)
   and the ILP (its WD, the limit times the network's kernel calls pooled);
3. execution: every distinct division of each kernel (baselines and plans alike) run with its
   cuDNN engines by id (cudnn.engines.run_division), in `rounds` interleaved rounds after `warmup`
   calls each, synchronised around every call; its output checked against PyTorch's own kernel
   (cuDNN, TF32 off). A plan equal to its baseline is that one measurement (speedup exactly 1).

Kernels are timed one at a time: a network's measured time is the count-weighted sum of its
kernels' (median) times, as the planner's prediction is a sum of benchmarked ones. Each timed call
includes allocating the kernel's full result (as PyTorch's layers do) and, for a divided filter
gradient, summing the micro-batches' gradients (cuDNN's graph API has no accumulating output).

Returns the rows of raw/cudnn_engines.csv (the engine table) and raw/cudnn_limits.csv (one per
limit, policy, planner and kernel: cudnn.plan's columns and the measured ones).
"""

from __future__ import annotations

import statistics
import time

import pandas as pd
import torch

from hpcdl.studies.microbatch.choice.algorithms import DEFAULT, KERNELS, KernelCall
from hpcdl.studies.microbatch.choice.bench import round_order
from hpcdl.studies.microbatch.choice.exact import distances, exact, rel_err
from hpcdl.studies.microbatch.common.dp import policy_sizes
from hpcdl.studies.microbatch.common.workloads import network
from hpcdl.studies.microbatch.cudnn import plan as cudnn_plan
from hpcdl.studies.microbatch.cudnn.bench import benchmark_layer
from hpcdl.studies.microbatch.cudnn.engine_table import FIELDS
from hpcdl.studies.microbatch.cudnn.engines import KernelGraph, binding, library_record, run_division

MiB = cudnn_plan.MiB
# the raw tables' columns beyond each row's (the task app's), and all of them where nothing ran
APP_COLUMNS = ["device", "clock", "status", "error"]
COLUMNS = {"cudnn_engines": [*(f for f in FIELDS if f != "status"), *APP_COLUMNS],
           "cudnn_limits": [*cudnn_plan.ROW_COLS, *APP_COLUMNS]}


def time_interleaved(fns: list, rounds: int, warmup: int) -> list[list[float]]:
    """Each fns[j]() timed once per round (wall time, synchronised before and after: the GPU's
    time), the order rotated every round, after `warmup` calls of each; the rounds' times."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for j in round_order(len(fns), r):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fns[j]()
            torch.cuda.synchronize()
            times[j].append(time.perf_counter() - t0)
    return times


def _summary(times: list[float]) -> dict:
    med = statistics.median(times)
    return {"time_s": med, "noise_frac": (max(times) - min(times)) / med if med > 0 else 0.0,
            "rounds": len(times)}


def execute_kernel(
    call: KernelCall,
    kernel: str,
    divisions: list[cudnn_plan.Division],
    graphs: dict[int, KernelGraph],
    rounds: int,
    warmup: int,
) -> dict[cudnn_plan.Division, dict]:
    """Every division of one kernel run by engine id, checked against PyTorch's kernel and against
    the exact (float64) result (max relative errors; PyTorch's own distance from it beside), then
    timed in interleaved rounds sharing one workspace at their largest need.
    Per division: {"time_s", "noise_frac", "rounds", "max_rel_err", "err_fp64", "default_err_fp64"}."""
    if not divisions:
        return {}
    # an engine missing at a size is left to run_division, which names it
    need = max((graphs[b].plans[graphs[b].by_name[e]][1] for d in divisions for e, b in d
                if b in graphs and e in graphs[b].by_name), default=0)
    workspace = torch.empty(max(need, 1), dtype=torch.uint8, device=call.x.device)
    reference = call.run_division(kernel, [(DEFAULT["cuda"], call.batch)])
    truth = exact(call, kernel)
    default_err = rel_err(reference, truth)
    out = {}
    for d in divisions:
        got, _ = run_division(call, kernel, list(d), graphs, workspace)
        out[d] = distances(got, reference, truth, default_err)
    del got, reference, truth
    fns = [lambda d=d: run_division(call, kernel, list(d), graphs, workspace) for d in divisions]
    for d, times in zip(divisions, time_interleaved(fns, rounds, warmup), strict=True):
        out[d].update(_summary(times))
    return out


def runnable_rows(table: pd.DataFrame, graphs: dict) -> pd.DataFrame:
    """The ok rows, one per engine name and (layer, kernel, micro-batch): where a graph lists one
    engine twice (two heuristics modes), the plan index its name runs by (KernelGraph.by_name)."""
    ok = table[table["status"] == "ok"]
    keep = [graphs[r.layer][(r.kernel, int(r.micro_batch))].by_name.get(r.engine) == r.plan_index
            for r in ok.itertuples(index=False)]
    return ok[keep].reset_index(drop=True)


def run_network(
    network_name: str,
    batch_size: int,
    image_size: int,
    deepbench_scale: float,
    policies: list[str],
    repeats: int,
    warmup: int,
    exec_repeats: int,
    limits_mib: list[float],
    tf32: bool,
    seed: int,
    deepbench_layers: str = "subset",
    screen_ratio: float | None = None,
) -> dict:
    """One network's engine table, its plans under every limit, each executed and timed against
    its baseline: {"cudnn_engines": rows, "cudnn_limits": rows, "meta": {...}}. `deepbench_layers`:
    which DeepBench layers (workloads.deepbench); `screen_ratio`: cudnn.bench's (None: every engine
    timed `repeats` rounds)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the cuDNN engines study needs CUDA: torch sees no GPU (microbatch.cudnn.engines)")
    binding()  # a missing or too old cuDNN frontend fails here, naming the package
    layers = network(network_name, image_size, deepbench_scale, deepbench_layers)
    planned = cudnn_plan.planned_policies(policies)
    sizes = sorted(set().union(*(policy_sizes(p, batch_size) for p in planned), {batch_size}))
    largest = max(v for v, _ in cudnn_plan.limit_settings(limits_mib)) * MiB
    t0 = time.perf_counter()
    calls, graphs, bench = {}, {}, []
    for i, ly in enumerate(layers):
        calls[ly.name] = KernelCall(ly, batch_size, "cuda", seed=seed + i)
        rows, graphs[ly.name] = benchmark_layer(calls[ly.name], sizes, repeats, warmup, largest, tf32,
                                                screen_ratio=screen_ratio)
        bench += [{**r, "network": network_name, "batch_size": batch_size, "image_size": image_size}
                  for r in rows]
    bench_s = time.perf_counter() - t0
    table = pd.DataFrame(bench)
    ok = runnable_rows(table, graphs)
    if ok.empty:
        raise RuntimeError(f"{network_name}: no cuDNN plan ran in the engine table "
                           f"({table['reason'].dropna().head(1).tolist()})")
    counts = {(ly.name, k): ly.count for ly in layers for k in KERNELS}
    rows, configs = cudnn_plan.plan_network(ok, network_name, batch_size, planned, limits_mib, counts)
    t1 = time.perf_counter()
    measured = {}
    for (layer, kernel), divisions in cudnn_plan.distinct_divisions(configs).items():
        by_size = {b: g for (k, b), g in graphs[layer].items() if k == kernel}
        for d, m in execute_kernel(calls[layer], kernel, divisions, by_size, exec_repeats, warmup).items():
            measured[((layer, kernel), d)] = m
    exec_s = time.perf_counter() - t1
    limit_rows = cudnn_plan.attach_measured(rows, configs, measured)
    meta = {"device": "cuda", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": library_record(), "clock": "wall (synchronised)", "bench_s": bench_s, "exec_s": exec_s}
    del calls, graphs
    torch.cuda.empty_cache()
    return {"cudnn_engines": bench, "cudnn_limits": limit_rows, "meta": meta}
