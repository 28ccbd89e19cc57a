"""Exactness: each kernel's exact result (the same convolution in float64 on the call's own tensors
and device) and the distances every check records (against the undivided default and against
the exact result).

The exactness checks measure every candidate, plan and the undivided default against it, so that a
difference between two fp32 results can be placed: on the H200 of 2026-11-27 cuDNN's fp32
backward-filter of AlexNet's conv2 differed from PyTorch's default by 1.2 % of its largest element,
the same engine undivided included, which comparing the two alone cannot attribute to either.
"""

from __future__ import annotations

import torch

from hpcdl.studies.microbatch.choice.algorithms import FUSED, KernelCall


def rel_err(got, want) -> float:
    """max |got - want| / max |want|: relative to the tensor's scale (elementwise would divide by ~0);
    for pairs of tensors (the fused backward's gradients), the worse of the two."""
    if isinstance(want, tuple):
        return max(rel_err(g, w) for g, w in zip(got, want, strict=True))
    got, want = got.detach(), want.detach()
    scale = float(want.abs().max())
    return float((got - want).abs().max()) / (scale if scale > 0 else 1.0)


def distances(got, default, truth, default_err: float | None = None) -> dict:
    """A result against the undivided default (max_rel_err) and the exact result (err_fp64), with the
    default's own distance from that (default_err_fp64; pass it where it is already known)."""
    return {"max_rel_err": rel_err(got, default), "err_fp64": rel_err(got, truth),
            "default_err_fp64": rel_err(default, truth) if default_err is None else default_err}


def exact(call: KernelCall, kernel: str):
    """`kernel` on the call's whole mini-batch in float64 (for the fused backward: the pair of
    gradients), by whatever backend runs doubles there: no fp32 engine, TF32 or reduced precision."""
    if kernel == FUSED:
        return exact(call, "backward_data"), exact(call, "backward_filter")
    x, w = call.x.double(), call.weight.double()
    if kernel == "forward":
        return torch.ops.aten.convolution(x, w, None, *call.args)
    gy = call.grad_out.double()
    mask = {"backward_data": [True, False, False], "backward_filter": [False, True, False]}
    if kernel not in mask:
        raise ValueError(f"unknown kernel {kernel!r}; known: forward, {', '.join(mask)}, {FUSED}")
    grads = torch.ops.aten.convolution_backward(gy, x, w, None, *call.args, mask[kernel])
    return grads[0] if kernel == "backward_data" else grads[1]
