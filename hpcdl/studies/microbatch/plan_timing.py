"""The executed plans against the framework's default layer (nn.Conv2d, undivided, default backend,
under autograd): forward+backward time in interleaved rounds, the planned executor's own overhead,
and the output and gradient errors relative to the default.
"""

from __future__ import annotations

import statistics

import torch
from torch import nn

from hpcdl.studies.microbatch.algorithms import ALGORITHMS, DEFAULT, FUSED, KernelCall
from hpcdl.studies.microbatch.bench import clock, round_order
from hpcdl.studies.microbatch.execute import MicroBatchedConv2d
from hpcdl.studies.microbatch.workloads import ConvLayer


def rel_err(got, want) -> float:
    """max |got - want| / max |want|: relative to the tensor's scale (elementwise would divide by ~0);
    for pairs of tensors (the fused backward's gradients), the worse of the two."""
    if isinstance(want, tuple):
        return max(rel_err(g, w) for g, w in zip(got, want, strict=True))
    got, want = got.detach(), want.detach()
    scale = float(want.abs().max())
    return float((got - want).abs().max()) / (scale if scale > 0 else 1.0)


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


def execute_layer(call: KernelCall, plans: dict[str, dict], device: str, repeats: int) -> dict[str, dict]:
    """Fastest (and median) fwd+bwd time of the default layer and of every distinct plan, interleaved
    rounds; output and gradient errors against the default.

    Plans that run the same computation are timed once: one that keeps the default passes through to
    nn.Conv2d, so it is the default's own measurement, and equal plans (DP and ILP often agree) share
    one. Timing copies of one computation separately only added noise: identical runs of ResNet-18's
    last layer differed by up to 25 % between rounds. `measured_as` names whose timing a plan has."""
    layer = call.layer
    conv = _conv_module(layer, call.weight)
    modules, measured_as = {"default": conv}, {"default": "default"}
    seen = {}
    for v, p in plans.items():
        m = MicroBatchedConv2d(_conv_module(layer, call.weight), p, layer.name)
        if m.is_default(call.batch, device):
            measured_as[v] = "default"
            continue
        key = tuple(sorted((k, tuple(steps)) for k, steps in p.items()))
        measured_as[v] = seen.setdefault(key, v)
        modules.setdefault(measured_as[v], m)
    x = call.x.clone().requires_grad_(True)
    with ALGORITHMS[DEFAULT[device]].context():  # the default runs as the framework does by default
        _, y0, gx0, gw0 = _fwd_bwd(conv, x, call.grad_out, device)
        ref = (y0.clone(), gx0.clone(), gw0.clone())
    times = _interleaved(call, modules, device, repeats)
    measured = {}
    for v, m in modules.items():
        with ALGORITHMS[DEFAULT[device]].context():
            _, y, gx, gw = _fwd_bwd(m, x, call.grad_out, device)
        measured[v] = {
            "time_s": min(times[v]),
            "time_median_s": statistics.median(times[v]),
            "err_output": rel_err(y, ref[0]),
            "err_grad_input": rel_err(gx, ref[1]),
            "err_grad_weight": rel_err(gw, ref[2]),
        }
    return {v: {**measured[rep], "measured_as": rep} for v, rep in measured_as.items()}
