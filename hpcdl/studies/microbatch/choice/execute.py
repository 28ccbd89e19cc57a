"""Executing a plan: a drop-in Conv2d that runs each kernel with its chosen micro-batches and algorithms.

`MicroBatchedConv2d` holds the layer's weight (and bias) like nn.Conv2d; a plan gives, per kernel,
the micro-batches as [(algorithm, size), ...]. Forward runs the forward division; backward runs the
backward-data division for the input gradient and the backward-filter division for the weight
gradient (micro-batch weight gradients summed), through the same `KernelCall.run` the benchmark
timed. `microbatch_network` swaps a module's Conv2d layers for planned ones, in place.
"""

from __future__ import annotations

import torch
from torch import nn

from hpcdl.studies.microbatch.choice.algorithms import DEFAULT, FUSED, KernelCall
from hpcdl.studies.microbatch.common.workloads import ConvLayer

# kernel -> [(algorithm, micro-batch size), ...], kernels: forward, and either the fused backward
# ("backward") or backward_data + backward_filter
LayerPlan = dict[str, list[tuple[str, int]]]


def layer_of(conv: nn.Conv2d, name: str, height: int, width: int) -> ConvLayer:
    if (
        conv.groups != 1
        or conv.dilation != (1, 1)
        or conv.stride[0] != conv.stride[1]
        or conv.padding_mode != "zeros"
        or isinstance(conv.padding, str)
    ):
        raise ValueError(
            f"layer {name}: only groups=1, dilation 1, square stride and explicit zero padding are planned"
        )
    return ConvLayer(
        name,
        conv.in_channels,
        conv.out_channels,
        height,
        width,
        *conv.kernel_size,
        conv.stride[0],
        *conv.padding,
    )


def scaled_plan(plan: LayerPlan, batch: int) -> LayerPlan:
    """The plan for another batch size: micro-batches as planned while they fit, the rest in one more."""
    out = {}
    for kernel, steps in plan.items():
        got, left = [], batch
        for alg, size in steps:
            if left == 0:
                break
            take = min(size, left)
            got.append((alg, take))
            left -= take
        if left:
            got.append((steps[-1][0], left))
        out[kernel] = got
    return out


class _MicroBatchedConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer, plan, weights):
        call = KernelCall(
            layer, x.shape[0], x.device.type, seed=None, x=x.detach(), weight=weight.detach(), weights=weights
        )
        if sum(b for _, b in plan["forward"]) != x.shape[0]:
            plan = scaled_plan(plan, x.shape[0])
        y = call.run_division("forward", plan["forward"])
        if bias is not None:
            y += bias.detach().view(1, -1, 1, 1)
        ctx.call, ctx.plan, ctx.has_bias = call, plan, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad_out):
        call, plan = ctx.call, ctx.plan
        call.grad_out = grad_out.contiguous()
        if FUSED in plan:  # one convolution_backward call per micro-batch gives both gradients
            gx, gw = call.run_division(FUSED, plan[FUSED])
        else:
            gx = (
                call.run_division("backward_data", plan["backward_data"]) if ctx.needs_input_grad[0] else None
            )
            need_w = ctx.needs_input_grad[1]
            gw = call.run_division("backward_filter", plan["backward_filter"]) if need_w else None
        gb = grad_out.sum((0, 2, 3)) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None


class MicroBatchedConv2d(nn.Module):
    """A Conv2d that runs its forward, backward-data and backward-filter kernels as planned."""

    def __init__(self, conv: nn.Conv2d, plan: LayerPlan, name: str = "conv", passthrough: bool = True):
        super().__init__()
        backward = [FUSED] if plan.get(FUSED) else ["backward_data", "backward_filter"]
        missing = [k for k in ["forward", *backward] if not plan.get(k)]
        if missing:
            raise ValueError(f"layer {name}: the plan has no division for {missing}")
        self.weight, self.bias = conv.weight, conv.bias
        self.conv, self.plan, self.name, self.passthrough = conv, plan, name, passthrough
        self._weights: dict = {}  # the filter per memory format, kept while the weight is unchanged

    def is_default(self, batch: int, device: str) -> bool:
        """Whether the layer runs as the framework runs it: undivided, default algorithm, fused backward."""
        return all(self.plan.get(k) == [(DEFAULT[device], batch)] for k in ("forward", FUSED))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.passthrough and self.is_default(x.shape[0], x.device.type):
            return self.conv(x)  # transparent where the plan keeps the default, as μ-cuDNN passes through
        layer = layer_of(self.conv, self.name, x.shape[2], x.shape[3])
        return _MicroBatchedConv.apply(x, self.weight, self.bias, layer, self.plan, self._weights)


def microbatch_network(module: nn.Module, plans: dict[str, LayerPlan]) -> nn.Module:
    """Replace every Conv2d named in `plans` (by its module path) with its planned MicroBatchedConv2d."""
    named = dict(module.named_modules())
    unknown = [n for n in plans if not isinstance(named.get(n), nn.Conv2d)]
    if unknown:
        raise ValueError(
            f"no Conv2d named {unknown} in the module; Conv2d layers: "
            f"{[n for n, m in named.items() if isinstance(m, nn.Conv2d)]}"
        )
    for path, plan in plans.items():
        parent_path, _, attr = path.rpartition(".")
        parent = named[parent_path] if parent_path else module
        setattr(parent, attr, MicroBatchedConv2d(named[path], plan, path))
    return module
