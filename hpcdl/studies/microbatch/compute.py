"""One network point, what the task app runs: benchmark its kernels (choice.bench), plan with the DP
and the ILP (choice.planning), vet the plans inside the network (choice.vetting), execute them as whole
networks (choice.plan_timing), measure.

Returns plain rows for the raw tables (bench, plans, budget, execution, network_rounds, exactness,
planning, stack_vetting).
The default is the framework's own layer: nn.Conv2d, undivided, default backend, under autograd.
μ-cuDNN's own experiment on cuDNN's engines is the task app's second task: run_cudnn_network.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from hpcdl.studies.microbatch.choice import vetting
from hpcdl.studies.microbatch.choice.algorithms import DEFAULT, FUSED, KERNELS, KernelCall, candidates
from hpcdl.studies.microbatch.choice.bench import benchmark_layer, clock
from hpcdl.studies.microbatch.choice.exact import distances, exact, rel_err
from hpcdl.studies.microbatch.choice.heap import fix_heap_thresholds
from hpcdl.studies.microbatch.choice.plan_timing import execute_network, executor_overhead
from hpcdl.studies.microbatch.choice.planning import NetworkPlanning, label, ok_rows
from hpcdl.studies.microbatch.common.dp import division_text, policy_sizes
from hpcdl.studies.microbatch.common.workloads import ConvLayer, network


def _progress(total: int, desc: str):
    if os.environ.get("HPCDL_PROGRESS", "1") == "0":
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, leave=False, mininterval=1.0)


def exactness_rows(
    kernels, call: KernelCall, algorithms: list[str], device: str, network_name: str
) -> list[dict]:
    """Every candidate, split into micro-batches [1, B-1], against the undivided default and against
    the exact (float64) result, per kernel; the undivided default's own distance from it beside."""
    ref = {k: call.run_division(k, [(DEFAULT[device], call.batch)]) for k in KERNELS}
    ref[FUSED] = (ref["backward_data"], ref["backward_filter"])
    truth = {k: exact(call, k) for k in KERNELS}
    truth[FUSED] = (truth["backward_data"], truth["backward_filter"])
    default_err = {k: rel_err(ref[k], truth[k]) for k in ref}
    rows = []
    for name in algorithms:
        steps = [(name, 1), (name, call.batch - 1)] if call.batch > 1 else [(name, 1)]
        for k in kernels:
            rows.append(
                {
                    "network": network_name,
                    "layer": call.layer.name,
                    "kernel": k,
                    "algorithm": name,
                    "micro_batches": division_text(steps)[0],
                    **distances(call.run_division(k, steps), ref[k], truth[k], default_err[k]),
                }
            )
    return rows


def _kernels(backward_forms) -> tuple[str, ...]:
    """The kernels to benchmark: forward, and the backward forms allowed (the separate pair, fused)."""
    unknown = set(backward_forms) - {"fused", "separate"}
    if unknown or not backward_forms:
        raise ValueError(f"backward_forms {list(backward_forms)}: use 'fused', 'separate' or both")
    return (
        "forward",
        *(("backward_data", "backward_filter") if "separate" in backward_forms else ()),
        *((FUSED,) if "fused" in backward_forms else ()),
    )


def _resolved(device, network_name: str) -> str:
    """The device the task app resolved once (run.device) and put in the point: used as it is, never
    resolved again here."""
    if device not in DEFAULT:
        raise ValueError(f"network point {network_name!r}: device {device!r} is not a resolved device "
                         f"({' or '.join(DEFAULT)}); the point must carry the device the task app resolved")
    return device


def run_network(
    network_name: str,
    device: str,
    batch_size: int,
    image_size: int,
    deepbench_scale: float,
    algorithms: list[str] | None,
    policies: list[str],
    repeats: int,
    warmup: int,
    exec_repeats: int,
    budget_fractions: list[float],
    kernel_limit_mib: float | None,
    seed: int,
    backward_forms: tuple[str, ...] | list[str] = ("fused", "separate"),
    switch_margin: float = 0.05,  # microbatch.switch_margin's default
    threads: int | None = None,
    stack_vetting_rounds: int = 0,  # microbatch.stack_vetting_rounds' default
    deepbench_layers: str = "subset",  # microbatch.deepbench_layers' default
) -> dict:
    """`device`: "cpu" or "cuda", as the task app resolved it (sweep.network_points).
    `backward_forms`: how a layer's backward may run: "separate" (backward-data and
    backward-filter kernels, μ-cuDNN's setting), "fused" (PyTorch's one call), or either.
    `switch_margin`: the planners see every configuration but the framework's own (default
    algorithm, undivided, fused backward) at its median benchmarked time, at least that much above
    its fastest, plus the executor's measured per-layer overhead, so a layer leaves the default
    only for a predicted gain above the benchmark's noise and what the executor costs; predictions
    are the fastest benchmarked times plus that overhead once per layer that leaves the default.
    `stack_vetting_rounds` (> 0): every layer a plan moves is timed inside the network in that many
    rounds before the timed ones, and kept at the default unless it gains `switch_margin` there."""
    device = _resolved(device, network_name)  # before anything runs
    if threads:  # fewer torch threads than the task's reserved cores: the rest stay idle
        torch.set_num_threads(threads)
    # identical plans timed one after another differed by 1.7x when glibc's moving mmap threshold
    # gave one of them fresh pages for its gradients on every call
    fix_heap_thresholds()
    kernels = _kernels(backward_forms)
    torch.manual_seed(seed)
    layers = network(network_name, image_size, deepbench_scale, deepbench_layers)
    algs = candidates(device, algorithms)
    default = DEFAULT[device]
    if default not in algs:
        algs = [default, *algs]  # the framework's default is always a candidate: the plan can keep it
    sizes = sorted(set().union(*(policy_sizes(p, batch_size) for p in policies)))
    calls = {ly.name: KernelCall(ly, batch_size, device, seed=seed + i) for i, ly in enumerate(layers)}

    # 1. benchmark every (layer, kernel, algorithm, micro-batch)
    bench, bench_s = _benchmark(network_name, layers, calls, algs, sizes, device, repeats, warmup, kernels)
    planning = NetworkPlanning(network_name, layers, kernels, batch_size, default, policies, switch_margin,
                               kernel_limit_mib, bench, bench_s, ok_rows(bench, default, network_name))
    # what running a layer through the planned executor costs beyond its kernels (none where the
    # plan keeps the default: the executor passes through to nn.Conv2d)
    planning.overhead = {ly.name: executor_overhead(calls[ly.name], device, exec_repeats) for ly in layers}
    # 2. the ILP's speedup vs workspace budget
    budget_rows = planning.budget_rows(budget_fractions)

    # 2b. the plans vetted inside the network stack (vetting.py): a move that does not gain
    # switch_margin there pins its layer to the default and the planners run again
    vetted = vetting.vet(planning.plan_all, calls, planning.keeps_default, device, stack_vetting_rounds,
                         1 + switch_margin)
    (plans_rows, planning_rows), variants = vetted.planned, vetted.variants
    vet_rows = [{"network": network_name, **r} for r in vetted.rows]
    for row in planning_rows:
        row |= {"stack_vetting_s": vetted.seconds, "layers_pinned": len(vetted.pinned)}

    # 3. the default and every distinct plan executed as whole networks in interleaved rounds
    # (plan_timing.execute_network); exactness of every candidate per layer
    units = execute_network(calls, variants, device, exec_repeats)
    exec_rows, round_rows = _execution_rows(planning, units, plans_rows, vetted, exec_repeats)
    return {
        "bench": bench,
        "plans": plans_rows,
        "budget": budget_rows,
        "execution": exec_rows,
        "network_rounds": round_rows,
        "exactness": _exactness(planning, calls, algs, device),
        "planning": planning_rows,
        "stack_vetting": vet_rows,
        "meta": _meta(device, batch_size),
    }


def _benchmark(network_name: str, layers: list[ConvLayer], calls: dict[str, KernelCall], algs: list[str],
               sizes: list[int], device: str, repeats: int, warmup: int,
               kernels: tuple[str, ...]) -> tuple[list[dict], float]:
    """Every layer's benchmark rows (choice.bench), each naming the network, and the seconds they took."""
    t0 = time.perf_counter()
    bar = _progress(len(layers) * len(kernels) * len(algs) * len(sizes), f"{network_name} benchmark")
    bench = []
    for ly in layers:
        bench += benchmark_layer(calls[ly.name], algs, sizes, device, repeats, warmup, bar, kernels)
    if bar is not None:
        bar.close()
    bench_s = time.perf_counter() - t0
    for r in bench:
        r["network"] = network_name
    return bench, bench_s


def _execution_rows(planning: NetworkPlanning, units: dict, plans_rows: list[dict], vetted: vetting.Vetted,
                    exec_repeats: int) -> tuple[list[dict], list[dict]]:
    """The executed units as rows: every round of every distinct plan beside the default's same round,
    and per variant and layer its measured share of the whole-network runs beside its prediction."""
    network_name, default_unit = planning.network_name, units["default"]
    exec_rows, round_rows = [], []
    for pid, unit in units.items():
        if pid == "default":
            continue
        round_rows += [
            {"network": network_name, "plan_id": pid, "variants": " ".join(unit["variants"]), "round": r,
             "plan_time_s": t, "default_time_s": td, "exec_repeats": exec_repeats}
            for r, (t, td) in enumerate(zip(unit["times"], default_unit["times"], strict=True))
        ]
        for variant in unit["variants"]:
            policy, planner = variant.split("/")
            exec_rows += [
                {
                    "network": network_name,
                    "policy": policy,
                    "planner": planner,
                    "layer": ly.name,
                    "count": ly.count,
                    "plan_id": pid,
                    "keeps_default": planning.keeps_default(vetted.variants[variant][ly.name]),
                    "pinned_by_vetting": ly.name in vetted.pinned,
                    # one conv's time inside the whole-network runs (its count's share), median of rounds
                    "measured_time_s": statistics.median(unit["layer_times"][ly.name]) / ly.count,
                    "measured_default_time_s":
                        statistics.median(default_unit["layer_times"][ly.name]) / ly.count,
                    "predicted_time_s": sum(
                        r["predicted_time_s"] for r in plans_rows
                        if (r["layer"], r["policy"], r["planner"]) == (ly.name, policy, planner)
                    ),
                    "predicted_default_time_s": _predicted_default(planning, ly),
                    **unit["errors"][ly.name],
                    "exec_repeats": exec_repeats,
                }
                for ly in planning.layers
            ]
    return exec_rows, round_rows


def _predicted_default(planning: NetworkPlanning, ly: ConvLayer) -> float:
    return sum(planning.default_cfg[label(ly.name, k)][0] for k in planning.default_kernels)


def _exactness(planning: NetworkPlanning, calls: dict[str, KernelCall], algs: list[str],
               device: str) -> list[dict]:
    """exactness_rows of every layer, over the candidates that ran on it."""
    rows = []
    bar = _progress(len(planning.layers), f"{planning.network_name} exactness")
    for ly in planning.layers:
        rows += exactness_rows(
            planning.kernels,
            calls[ly.name],
            [a for a in algs if any(r["algorithm"] == a and r["layer"] == ly.name for r in planning.ok)],
            device,
            planning.network_name,
        )
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return rows


def _meta(device: str, batch_size: int) -> dict:
    return {
        "device": device,
        "clock": clock(device)[1],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch_size": batch_size,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "",
    }


def run_cudnn_network(**point) -> dict:
    """μ-cuDNN's own experiment on one network (cuDNN's engines by id under workspace limits, CUDA
    only): the task body's one call, delegated to cudnn.study, which imports the cuDNN frontend."""
    from hpcdl.studies.microbatch.cudnn import study

    return study.run_network(**point)
