"""The executed plans against the framework's default (nn.Conv2d, undivided, default backend, under
autograd): every plan and the default run as a whole network's conv layers (every forward, then
every backward) in interleaved rounds, the planned executor's own overhead per layer, each moved
layer's speedup inside the network (what vetting.py vets plans on), and the output and gradient
errors relative to the default and to the float64 result (exact.distances).
"""

from __future__ import annotations

import statistics

import torch
from torch import nn

from hpcdl.studies.microbatch.choice.algorithms import ALGORITHMS, DEFAULT, FUSED, KERNELS, KernelCall
from hpcdl.studies.microbatch.choice.bench import clock, round_order
from hpcdl.studies.microbatch.choice.exact import distances, exact
from hpcdl.studies.microbatch.choice.execute import LayerPlan, MicroBatchedConv2d
from hpcdl.studies.microbatch.common.workloads import ConvLayer


def _conv_module(layer: ConvLayer, weight: torch.Tensor) -> nn.Conv2d:
    conv = nn.Conv2d(
        layer.cin,
        layer.cout,
        (layer.kh, layer.kw),
        stride=layer.stride,
        padding=(layer.pad_h, layer.pad_w),
        bias=False,
    ).to(weight.device)
    with torch.no_grad():
        conv.weight.copy_(weight)
    return conv


def _fwd_bwd(module: nn.Module, x: torch.Tensor, gy: torch.Tensor, device: str):
    x.grad = None
    module.weight.grad = None
    now = clock(device)[0]
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = now()
    y = module(x)
    y.backward(gy)
    if device == "cuda":
        torch.cuda.synchronize()
    return now() - t0, y.detach(), x.grad, module.weight.grad


def executor_overhead(call: KernelCall, device: str, repeats: int) -> float:
    """Seconds the planned executor adds to a layer's forward+backward whatever its plan: the
    default configuration run through MicroBatchedConv2d's own path vs the plain nn.Conv2d, fastest
    of interleaved rounds (the autograd Function, the kernel calls' set-up, the backend contexts)."""
    conv = _conv_module(call.layer, call.weight)
    plan = {"forward": [(DEFAULT[device], call.batch)], FUSED: [(DEFAULT[device], call.batch)]}
    wrapped = MicroBatchedConv2d(_conv_module(call.layer, call.weight), plan, call.layer.name,
                                 passthrough=False)
    times = _interleaved(call, {"plain": conv, "wrapped": wrapped}, device, repeats)
    return max(0.0, min(times["wrapped"]) - min(times["plain"]))


def _interleaved(call: KernelCall, modules: dict[str, nn.Module], device: str, repeats: int) -> dict:
    """Seconds of every module's forward+backward on the layer's input, `repeats` rounds after one
    warm-up round, the order rotated each round so no module always runs first."""
    x = call.x.clone().requires_grad_(True)
    times = {v: [] for v in modules}
    names = list(modules)
    for r in range(repeats + 1):
        for v in (names[j] for j in round_order(len(names), r)):
            with ALGORITHMS[DEFAULT[device]].context():  # the default runs as the framework does
                dt, *_ = _fwd_bwd(modules[v], x, call.grad_out, device)
            if r:
                times[v].append(dt)
    return times


def network_stack(calls: dict[str, KernelCall], plan: dict[str, LayerPlan] | None) -> list:
    """[(call, modules)] in network order, one module per conv the network runs (a layer's count),
    each with its own copy of the layer's filter: plain nn.Conv2d for the default (plan None), else
    the planned layer, which passes through to nn.Conv2d where its plan keeps the default."""
    stack = []
    for name, call in calls.items():
        convs = [_conv_module(call.layer, call.weight) for _ in range(call.layer.count)]
        if plan is not None:
            convs = [MicroBatchedConv2d(c, plan[name], name) for c in convs]
        stack.append((call, convs))
    return stack


class _Marks:
    """Time stamps between one pass's calls without synchronising: CUDA events, else the clock."""

    def __init__(self, device: str):
        self.cuda, self.now, self.at = device == "cuda", clock(device)[0], []

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.at.append(ev)
        else:
            self.at.append(self.now())

    def spans(self) -> list[float]:
        """Seconds between consecutive marks (CUDA: call after synchronising)."""
        if self.cuda:
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.at, self.at[1:], strict=False)]
        return [b - a for a, b in zip(self.at, self.at[1:], strict=False)]


def network_pass(stack: list, device: str, keep: bool = False) -> tuple[float, list[float], list]:
    """One training step's conv work: the forward of every conv in network order, then their
    backwards in reverse order, every activation alive until its backward, as in a network.

    Returns the seconds of the whole pass, each layer's seconds (its convs' forwards and backwards
    summed) and, with `keep`, each layer's first conv's (output, input grad, weight grad)."""
    for _, mods in stack:
        for m in mods:
            m.weight.grad = None
    now, marks, runs = clock(device)[0], _Marks(device), []
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = now()
    with ALGORITHMS[DEFAULT[device]].context():  # the default runs as the framework does by default
        marks.mark()
        for i, (call, mods) in enumerate(stack):
            for m in mods:
                x = call.x.detach().requires_grad_(True)
                runs.append((i, x, m(x), m))
                marks.mark()
        for i, _, y, _ in reversed(runs):
            y.backward(stack[i][0].grad_out)
            marks.mark()
    if device == "cuda":
        torch.cuda.synchronize()
    total = now() - t0
    spans, per_layer = marks.spans(), [0.0] * len(stack)
    for j, (i, *_) in enumerate(runs):
        per_layer[i] += spans[j] + spans[-1 - j]  # its forward, and its backward (run in reverse)
    kept = []
    if keep:
        first = {}
        for i, x, y, m in runs:
            first.setdefault(i, (y.detach(), x.grad, m.weight.grad))
        kept = [first[i] for i in range(len(stack))]
    return total, per_layer, kept


def plan_key(plan: dict[str, LayerPlan]) -> tuple:
    """Equal for plans that run the same computation in every layer."""
    return tuple((name, tuple(sorted((k, tuple(steps)) for k, steps in p.items())))
                 for name, p in sorted(plan.items()))


def _units(calls: dict[str, KernelCall], plans: dict[str, dict[str, LayerPlan]]) -> dict:
    """{"default": unit, plan_id: unit}, one unit per distinct plan (named by its first variant),
    each with its variants and its network stack."""
    units = {"default": {"variants": [], "stack": network_stack(calls, None)}}
    ids = {}
    for variant, plan in plans.items():
        pid = ids.setdefault(plan_key(plan), variant)
        if pid == variant:
            units[pid] = {"variants": [], "stack": network_stack(calls, plan)}
        units[pid]["variants"].append(variant)
    return units


def _time_rounds(units: dict, layers: list[str], device: str, rounds: int, keep_last: bool) -> dict:
    """Run every unit's stack once per round, `rounds` rounds after one warm-up round, the order
    rotated; fills each unit's "times" and "layer_times" {layer: [per round]} and, with
    `keep_last`, returns what the last round computed per unit (each layer's first conv's output
    and gradients)."""
    names = list(units)
    for u in units.values():
        u["times"], u["layer_times"] = [], {ly: [] for ly in layers}
    kept = {}
    for r in range(rounds + 1):
        for name in (names[j] for j in round_order(len(names), r)):
            # the last round also keeps the outputs it computes anyway: no extra pass for the errors
            total, per_layer, kept[name] = network_pass(units[name]["stack"], device,
                                                        keep=keep_last and r == rounds)
            if r:  # round 0 warms every unit up
                units[name]["times"].append(total)
                for ly, t in zip(layers, per_layer, strict=True):
                    units[name]["layer_times"][ly].append(t)
    return kept


def in_stack_speedups(calls: dict[str, KernelCall], plans: dict[str, dict[str, LayerPlan]],
                      moved: dict[str, set[str]], device: str, rounds: int) -> list[dict]:
    """Each moved layer's speedup inside the network: every distinct plan and the default run as
    whole networks in `rounds` interleaved rounds (as `execute_network` times them), and for each
    layer in `moved[variant]` the median of the default's in-network time of that layer over the
    median of the plan's. A kernel benchmarked alone and warm can be faster than the default there
    and slower among the network's other layers; this is what a plan is vetted on before it runs
    the timed rounds. Rows: plan_id, variants, layer, in_stack_default_s, in_stack_plan_s,
    in_stack_speedup, rounds."""
    units = _units(calls, plans)
    layers = list(calls)
    _time_rounds(units, layers, device, rounds, keep_last=False)
    default_median = {ly: statistics.median(t) for ly, t in units["default"]["layer_times"].items()}
    rows = []
    for pid, unit in units.items():
        if pid == "default":
            continue
        for ly in sorted(set().union(*(moved[v] for v in unit["variants"])), key=layers.index):
            plan_s = statistics.median(unit["layer_times"][ly])
            rows.append({"plan_id": pid, "variants": " ".join(unit["variants"]), "layer": ly,
                         "in_stack_default_s": default_median[ly], "in_stack_plan_s": plan_s,
                         "in_stack_speedup": default_median[ly] / plan_s, "rounds": rounds})
    return rows


def execute_network(calls: dict[str, KernelCall], plans: dict[str, dict[str, LayerPlan]], device: str,
                    rounds: int) -> dict:
    """Time the default network and every distinct plan as whole networks (`network_pass`):
    `rounds` interleaved rounds after one warm-up round, each round running every one once, the
    order rotated; a plan's time is compared with the default's of the same round.

    Plans that are equal in every layer (policies and planners often agree) are one unit, named by
    the first variant that has it; a plan that keeps the default in every layer is a unit of its
    own too (its run is timed, never the default's time copied). Returns {"default": unit, plan_id:
    unit}, a unit: {"variants", "times" [per round], "layer_times" {layer: [per round]},
    "errors" {layer: {err_output, err_grad_input, err_grad_weight} against the default, the same
    with _fp64 against the float64 result, and default_err_*_fp64 the default's own}}."""
    units = _units(calls, plans)
    layers = list(calls)
    kept = _time_rounds(units, layers, device, rounds, keep_last=True)
    ref = kept["default"]
    truth = [tuple(exact(calls[ly], k) for k in KERNELS) for ly in layers]
    for name, u in units.items():
        del u["stack"]
        u["errors"] = {ly: _layer_errors(g, w, t)
                       for ly, g, w, t in zip(layers, kept[name], ref, truth, strict=True)}
    return units


ERROR_COLUMNS = ("err_output", "err_grad_input", "err_grad_weight")  # forward, backward_data, _filter


def _layer_errors(got, default, truth) -> dict:
    """One layer's output and gradients against the default's (err_*), against the exact result
    (err_*_fp64), and the default's own distance from it (default_err_*_fp64)."""
    out = {}
    for i, col in enumerate(ERROR_COLUMNS):
        d = distances(got[i], default[i], truth[i])
        out |= {col: d["max_rel_err"], f"{col}_fp64": d["err_fp64"],
                f"default_{col}_fp64": d["default_err_fp64"]}
    return out
