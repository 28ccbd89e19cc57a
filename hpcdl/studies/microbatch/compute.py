"""One network point, what the task app runs: benchmark its kernels, plan with the DP and the ILP,
execute the plans as whole networks (plan_timing), measure.

Returns plain rows for the raw tables (bench, plans, budget, execution, network_rounds, exactness,
planning, stack_vetting).
The default is the framework's own layer: nn.Conv2d, undivided, default backend, under autograd.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from hpcdl.studies.microbatch import ilp, vetting
from hpcdl.studies.microbatch.algorithms import (
    DEFAULT,
    FUSED,
    KERNELS,
    KernelCall,
    candidates,
    resolve_device,
)
from hpcdl.studies.microbatch.bench import benchmark_layer, clock
from hpcdl.studies.microbatch.dp import (
    KernelDP,
    WorkspaceError,
    challenger_prices,
    division_text,
    policy_sizes,
)
from hpcdl.studies.microbatch.exact import distances, exact, rel_err
from hpcdl.studies.microbatch.heap import fix_heap_thresholds
from hpcdl.studies.microbatch.plan_timing import execute_network, executor_overhead
from hpcdl.studies.microbatch.workloads import network

MiB = 2**20


def _label(layer: str, kernel: str) -> str:
    return f"{layer}/{kernel}"


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
    """`backward_forms`: how a layer's backward may run: "separate" (backward-data and
    backward-filter kernels, μ-cuDNN's setting), "fused" (PyTorch's one call), or either.
    `switch_margin`: the planners see every configuration but the framework's own (default
    algorithm, undivided, fused backward) at its median benchmarked time, at least that much above
    its fastest, plus the executor's measured per-layer overhead, so a layer leaves the default
    only for a predicted gain above the benchmark's noise and what the executor costs; predictions
    are the fastest benchmarked times plus that overhead once per layer that leaves the default.
    `stack_vetting_rounds` (> 0): every layer a plan moves is timed inside the network in that many
    rounds before the timed ones, and kept at the default unless it gains `switch_margin` there."""
    if threads:  # fewer torch threads than the task's reserved cores: the rest stay idle
        torch.set_num_threads(threads)
    # identical plans timed one after another differed by 1.7x when glibc's moving mmap threshold
    # gave one of them fresh pages for its gradients on every call
    fix_heap_thresholds()
    unknown = set(backward_forms) - {"fused", "separate"}
    if unknown or not backward_forms:
        raise ValueError(f"backward_forms {list(backward_forms)}: use 'fused', 'separate' or both")
    fused_ok, separate_ok = "fused" in backward_forms, "separate" in backward_forms
    kernels = (
        "forward",
        *(("backward_data", "backward_filter") if separate_ok else ()),
        *((FUSED,) if fused_ok else ()),
    )
    device = resolve_device(device)
    torch.manual_seed(seed)
    layers = network(network_name, image_size, deepbench_scale, deepbench_layers)
    algs = candidates(device, algorithms)
    default = DEFAULT[device]
    if default not in algs:
        algs = [default, *algs]  # the framework's default is always a candidate: the plan can keep it
    sizes = sorted(set().union(*(policy_sizes(p, batch_size) for p in policies)))
    calls = {ly.name: KernelCall(ly, batch_size, device, seed=seed + i) for i, ly in enumerate(layers)}

    # 1. benchmark every (layer, kernel, algorithm, micro-batch)
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
    # candidates: rows where the forced backend really ran, and the framework's default as it dispatches
    ok = [r for r in bench if r["status"] == "ok" and (r["forced_ok"] or r["algorithm"] == default)]
    if not any(r["algorithm"] == default for r in ok):
        raise RuntimeError(
            f"{network_name}: the default algorithm {default} did not run: "
            f"{[r['reason'] for r in bench if r['algorithm'] == default][:1]}"
        )
    table, typical = {}, {}  # (fastest repeat, workspace); the median repeat
    for r in ok:
        key = (r["algorithm"], r["micro_batch"])
        lab = _label(r["layer"], r["kernel"])
        table.setdefault(lab, {})[key] = (r["time_s"], float(r["workspace_bytes"]))
        typical.setdefault(lab, {})[key] = r["time_median_s"]
    counts = {_label(ly.name, k): ly.count for ly in layers for k in kernels}
    default_cfg = {lab: tab[(default, batch_size)] for lab, tab in table.items()}
    # the framework's default layer: forward, then the fused backward (autograd's one call); priced
    # as the separate pair when only that form is benchmarked (μ-cuDNN's three kernels)
    default_kernels = ("forward", FUSED) if fused_ok else KERNELS

    # what running a layer through the planned executor costs beyond its kernels (none where the
    # plan keeps the default: the executor passes through to nn.Conv2d)
    overhead = {ly.name: executor_overhead(calls[ly.name], device, exec_repeats) for ly in layers}

    def priced(lab: str) -> dict:
        layer_name, kernel = lab.split("/")
        incumbent = (default, batch_size) if kernel in default_kernels else None
        return challenger_prices(table[lab], typical[lab], incumbent, switch_margin, overhead[layer_name])

    def benchmarked(lab: str, steps: list[tuple[str, int]]) -> float:
        return sum(table[lab][step][0] for step in steps)
    runs_by_default = [_label(ly.name, k) for ly in layers for k in default_kernels]
    default_total_ws = sum(counts[lab] * default_cfg[lab][1] for lab in runs_by_default)
    default_time = sum(counts[lab] * default_cfg[lab][0] for lab in runs_by_default)

    # speedup vs workspace budget (ILP), as fractions of the default's total workspace: what the
    # benchmarked times allow (every layer, no margin, none pinned), so solved once whatever vetting pins
    sweep_groups = (
        [tuple(_label(ly.name, k) for k in (FUSED, "backward_data", "backward_filter")) for ly in layers]
        if fused_ok and separate_ok
        else []
    )
    budget_rows, sweep_s = [], {}
    for policy in policies:
        sweep_fronts = {lab: KernelDP(tab, batch_size, policy).front() for lab, tab in table.items()}
        t2 = time.perf_counter()
        budgets = [f * default_total_ws for f in budget_fractions]
        sweep = ilp.network_front(sweep_fronts, counts, budgets, sweep_groups)
        sweep_s[policy] = time.perf_counter() - t2
        for f, row in zip(sorted(budget_fractions), sweep, strict=True):
            budget_rows.append(
                {
                    "network": network_name,
                    "policy": policy,
                    "budget_fraction": f,
                    "budget_bytes": row["budget_bytes"],
                    "feasible": row["feasible"],
                    "predicted_time_s": row["time_s"],
                    "default_predicted_time_s": default_time,
                    "predicted_speedup": default_time / row["time_s"] if row["feasible"] else float("nan"),
                    "workspace_bytes": row["workspace_bytes"],
                    "solve_s": row["solve_s"],
                    "reason": row.get("reason", ""),
                }
            )

    def keeps_default(plan: dict) -> bool:
        return all(plan.get(k) == [(default, batch_size)] for k in ("forward", FUSED))

    def plan_all(pinned: frozenset[str]) -> tuple[tuple[list, list], dict]:
        """Both planners under every policy; a layer in `pinned` is offered only the framework's
        own configuration of the kernels the default runs (its separate backward pair is not on
        offer), so every plan keeps the default there. Returns (the plans and planning rows) and
        {layer: {variant: layer plan}}."""
        plan_table = {}
        for lab in table:
            layer_name, kernel = lab.split("/")
            if layer_name not in pinned:
                plan_table[lab] = priced(lab)
            elif kernel in default_kernels:
                plan_table[lab] = {(default, batch_size): table[lab][(default, batch_size)]}
        groups = (
            [tuple(_label(ly.name, k) for k in (FUSED, "backward_data", "backward_filter"))
             for ly in layers if ly.name not in pinned]
            if fused_ok and separate_ok
            else []
        )

        plans_rows, planning_rows = [], []
        exec_plans: dict[str, dict[str, dict]] = {ly.name: {} for ly in layers}
        for policy in policies:
            t1 = time.perf_counter()
            dps = {  # a pinned layer offers only the undivided default: no policy can divide it
                lab: KernelDP(tab, batch_size, "undivided" if lab.split("/")[0] in pinned else policy,
                              label=f"layer {lab.split('/')[0]} ({lab.split('/')[1]})")
                for lab, tab in plan_table.items()
            }
            fronts = {lab: dp.front() for lab, dp in dps.items()}
            dp_s = time.perf_counter() - t1

            # DP per kernel: each kernel under its own limit (default: the default algorithm's workspace);
            # a layer's backward runs fused or as the separate pair, whichever the DP finds faster
            def limit(lab):
                return kernel_limit_mib * MiB if kernel_limit_mib is not None else default_cfg[lab][1]

            dp_choice = {}
            for ly in layers:
                fwd = _label(ly.name, "forward")
                dp_choice[fwd] = dps[fwd].best(limit(fwd))[0]
                fused, bd, bf = (_label(ly.name, k) for k in (FUSED, "backward_data", "backward_filter"))
                options, errors = [], []
                try:
                    if fused_ok:
                        i = dps[fused].best(limit(fused))
                        options.append((i[1], {fused: i[0]}))
                except WorkspaceError as exc:
                    errors.append(exc)
                try:
                    if separate_ok and bd in dps:  # a pinned layer's separate pair is not on offer
                        i, j = dps[bd].best(limit(bd)), dps[bf].best(limit(bf))
                        options.append((i[1] + j[1], {bd: i[0], bf: j[0]}))
                except WorkspaceError as exc:
                    errors.append(exc)
                if not options:
                    raise errors[0]
                dp_choice.update(min(options, key=lambda o: o[0])[1])
            # ILP over the network under the default's total workspace ("the same memory footprint")
            headline = ilp.solve(fronts, counts, default_total_ws, groups)
            for planner, choice in (("dp", dp_choice), ("ilp", headline.choice)):
                for lab, idx in choice.items():
                    layer_name, kernel = lab.split("/")
                    steps = dps[lab].division(idx)
                    sizes_text, algs_text = division_text(steps)
                    t, ws = benchmarked(lab, steps), float(fronts[lab].workspace[idx])
                    exec_plans[layer_name].setdefault(f"{policy}/{planner}", {})[kernel] = steps
                    plans_rows.append(
                        {
                            "network": network_name,
                            "policy": policy,
                            "planner": planner,
                            "layer": layer_name,
                            "count": counts[lab],
                            "kernel": kernel,
                            "micro_batches": sizes_text,
                            "algorithms": algs_text,
                            "n_micro_batches": len(steps),
                            "largest_micro_batch": max(b for _, b in steps),
                            "predicted_time_s": t,
                            "workspace_bytes": ws,
                            "default_time_s": default_cfg[lab][0],
                            "default_workspace_bytes": default_cfg[lab][1],
                            "executor_overhead_s": 0.0,
                        }
                    )
                # a layer that leaves the default pays the executor's overhead once (on its forward row)
                for ly in layers:
                    keeps = keeps_default(exec_plans[ly.name][f"{policy}/{planner}"])
                    row = next(r for r in plans_rows if (r["policy"], r["planner"], r["layer"], r["kernel"])
                               == (policy, planner, ly.name, "forward"))
                    row["executor_overhead_s"] = 0.0 if keeps else overhead[ly.name]
                    row["predicted_time_s"] += row["executor_overhead_s"]
            policy_bench_s = sum(
                r["bench_wall_s"]
                for r in bench
                if r.get("bench_wall_s") and r["micro_batch"] in policy_sizes(policy, batch_size)
            )
            planning_rows.append(
                {
                    "network": network_name,
                    "policy": policy,
                    "bench_s": policy_bench_s,
                    "bench_total_s": bench_s,
                    "dp_s": dp_s,
                    "ilp_solve_s": headline.solve_s,
                    "ilp_sweep_s": sweep_s[policy],
                    "front_points": int(sum(len(f.time_s) for f in fronts.values())),
                    "kernels": len(fronts),
                    "default_workspace_bytes": default_total_ws,
                    "ilp_workspace_bytes": headline.workspace_bytes,
                }
            )
        return (plans_rows, planning_rows), exec_plans

    # 2b. the plans vetted inside the network stack (vetting.py): a move that does not gain
    # switch_margin there pins its layer to the default and the planners run again
    vetted = vetting.vet(plan_all, calls, keeps_default, device, stack_vetting_rounds, 1 + switch_margin)
    (plans_rows, planning_rows), variants = vetted.planned, vetted.variants
    vet_rows = [{"network": network_name, **r} for r in vetted.rows]
    for row in planning_rows:
        row |= {"stack_vetting_s": vetted.seconds, "layers_pinned": len(vetted.pinned)}

    # 3. the default and every distinct plan executed as whole networks in interleaved rounds
    # (plan_timing.execute_network); exactness of every candidate per layer
    units = execute_network(calls, variants, device, exec_repeats)
    default_unit = units["default"]
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
            for ly in layers:
                keeps = keeps_default(variants[variant][ly.name])
                exec_rows.append(
                    {
                        "network": network_name,
                        "policy": policy,
                        "planner": planner,
                        "layer": ly.name,
                        "count": ly.count,
                        "plan_id": pid,
                        "keeps_default": keeps,
                        "pinned_by_vetting": ly.name in vetted.pinned,
                        # one conv's time inside the whole-network runs (its count's share), median of rounds
                        "measured_time_s": statistics.median(unit["layer_times"][ly.name]) / ly.count,
                        "measured_default_time_s":
                            statistics.median(default_unit["layer_times"][ly.name]) / ly.count,
                        "predicted_time_s": sum(
                            r["predicted_time_s"] for r in plans_rows
                            if (r["layer"], r["policy"], r["planner"]) == (ly.name, policy, planner)
                        ),
                        "predicted_default_time_s":
                            sum(default_cfg[_label(ly.name, k)][0] for k in default_kernels),
                        **unit["errors"][ly.name],
                        "exec_repeats": exec_repeats,
                    }
                )
    exact_rows = []
    bar = _progress(len(layers), f"{network_name} exactness")
    for ly in layers:
        exact_rows += exactness_rows(
            kernels,
            calls[ly.name],
            [a for a in algs if any(r["algorithm"] == a and r["layer"] == ly.name for r in ok)],
            device,
            network_name,
        )
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    meta = {
        "device": device,
        "clock": clock(device)[1],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch_size": batch_size,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "",
    }
    return {
        "bench": bench,
        "plans": plans_rows,
        "budget": budget_rows,
        "execution": exec_rows,
        "network_rounds": round_rows,
        "exactness": exact_rows,
        "planning": planning_rows,
        "stack_vetting": vet_rows,
        "meta": meta,
    }


def run_cudnn_network(**point) -> dict:
    """μ-cuDNN's own experiment on one network (cuDNN's engines by id under workspace limits, CUDA
    only): the task body's one call, delegated to cudnn_study, which imports the cuDNN frontend."""
    from hpcdl.studies.microbatch import cudnn_study

    return cudnn_study.run_network(**point)
