"""The calibration's compute microbenchmarks, timed as the model runs them, layer by layer at the
study's layer shapes and slab fractions: the halo window's copies, conv3d with bias + LeakyReLU,
max-pool, dense layers, forward+backward, and zero_grad + Adam step over the model's parameter
tensors, with the rest of a step's activations streamed through the caches between a layer's forward
and backward (untimed); and the cost of the fresh pages a step's largest feature maps take from the
OS (map, first-touch, unmap), timed on its own (hpcdl.studies.spatial.calibration.microbench).
"""

from __future__ import annotations

import functools
import mmap

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from hpcdl.common.layers import flops, layer_key, numel
from hpcdl.studies.spatial.calibration.timing import best, fastest_quartile, slowest
from hpcdl.studies.spatial.devices import now
from hpcdl.studies.spatial.model import LEAK, partitioned_conv3d, single_layout, window
from hpcdl.studies.spatial.partition import plan_axis
from hpcdl.studies.spatial.perfmodel.oracle import fresh_bytes


def _layer_fn(L: dict, batch: int, frac_d: float, input_grad: bool = True, device="cpu"):
    """The forward of layer L on a slab with frac_d of its depth, run as the model runs it.

    Conv: the halo window (the slab plus its halo planes, built by concatenation; its backward
    scatters the gradient back), conv3d with bias and LeakyReLU; pool: window and max-pool; on the
    whole volume (fraction 1: one rank, or data parallel) the plain padded conv / pool, as those run;
    dense: linear with bias (+ LeakyReLU). On one rank the halo planes are the zero padding of
    the slab's edges, the same planes a middle rank receives, so the copies are the same.
    `input_grad` is False for the network's first layer: training needs no gradient of the data.
    Every tensor is on `device`, the rank's compute device.
    Returns (forward closure returning the output, units, depth fraction actually timed).
    """
    if L["kind"] == "dense":
        x = torch.randn(batch, L["fin"], requires_grad=True, device=device)
        w = torch.randn(L["fout"], L["fin"], requires_grad=True, device=device)
        b = torch.randn(L["fout"], requires_grad=True, device=device)

        def fwd():
            y = F.linear(x, w, b)
            return F.leaky_relu(y, LEAK) if L.get("act") else y
        return fwd, flops(L) * batch, 1.0
    c, d, h, w_ = L["in"]
    k, s = L["kernel"], L["stride"]
    d_loc = max(k, int(round(d * frac_d)))
    if L["kind"] == "pool":
        d_loc = max(s, d_loc // s * s)  # a slab of whole pooling windows, as the study's splits are
    plans = (plan_axis((d_loc,), k, s, L["pad"], L["name"]), None)
    layout = single_layout()
    x = torch.randn(batch, c, d_loc, h, w_, requires_grad=input_grad, device=device)
    if L["kind"] == "conv":
        wt = torch.randn(L["cout"], c, k, k, k, requires_grad=True, device=device)
        bias = torch.randn(L["cout"], requires_grad=True, device=device)

        if d_loc == d:  # the whole volume: a run with no spatial split runs the plain conv (no window)
            def fwd():
                return F.leaky_relu(F.conv3d(x, wt, bias, stride=s, padding=L["pad"]), LEAK)
        else:
            def fwd():
                return F.leaky_relu(partitioned_conv3d(x, wt, bias, s, L["pad"], plans, layout, tag=0), LEAK)
    elif d_loc == d:
        def fwd():
            return F.max_pool3d(x, k, s)
    else:
        def fwd():
            return F.max_pool3d(window(x, plans, layout, 0), k, s)
    return fwd, flops(L) * batch * d_loc / d, d_loc / d


def activation_bytes(spec: list[dict], batch: int) -> int:
    """Bytes of the activations one training step writes in the forward and reads back in the backward."""
    return sum(_nbytes(L, batch, 1.0) for L in spec)


def _best_fwd_bwd(fwd, evict: torch.Tensor | None, repeats: int, together: bool = False,
                  device="cpu") -> float:
    """Fastest quartile of forward + backward seconds, with `evict` rewritten (untimed) in between.

    In a training step the rest of the network's activations pass through the caches between a
    layer's forward and its backward, so the backward reads what the forward saved from further
    away than a layer timed alone would: `evict` is that traffic. The output's gradient is a
    dense tensor, just written, as the next layer's backward hands it over. `together`, `device`:
    as timing.best.
    """
    grad = torch.randn_like(fwd())
    times = []
    for i in range(repeats + 1):
        if together:
            dist.barrier()
        t0 = now(device)
        y = fwd()
        t1 = now(device)
        if evict is not None:
            evict.add_(1.0)
        grad.mul_(1.0)
        t2 = now(device)
        y.backward(grad)
        t3 = now(device)
        if i:  # the first is a warm-up: allocator, kernels
            times.append((t1 - t0) + (t3 - t2))
    if together:
        times = slowest(times)
    return fastest_quartile(times)


def _nbytes(L: dict, batch: int, frac: float) -> int:
    """Bytes of layer L's own activations on the slab (they are what its timing keeps warm)."""
    if L["kind"] not in ("conv", "pool"):
        return 0
    return int(numel(L["out"]) * (2 if L["kind"] == "conv" else 1) * batch * 4 * frac)


def _touch_fresh(nbytes: int) -> None:
    """Map, first-touch (one byte a page) and unmap anonymous memory: the page faults, zeroing and
    unmapping a large tensor costs when the allocator takes fresh pages from the OS for it."""
    m = mmap.mmap(-1, nbytes)
    a = np.frombuffer(m, dtype=np.uint8)
    a[::mmap.PAGESIZE] = 1
    del a
    m.close()


def _warm_allocator(nbytes: int) -> None:
    """Allocate and free one large block so glibc's adaptive mmap/trim thresholds rise above the
    step's tensors: the layer timings then carry no page faults (those are timed on their own)."""
    torch.empty(max(1, min(nbytes, 32 * 2 ** 20) // 4)).fill_(0.0)


def _param_shapes(spec: list[dict]) -> list[tuple[int, ...]]:
    shapes = []
    for L in spec:
        if L["kind"] == "conv":
            shapes += [(L["cout"], L["cin"], L["kernel"], L["kernel"], L["kernel"]), (L["cout"],)]
        elif L["kind"] == "dense":
            shapes += [(L["fout"], L["fin"]), (L["fout"],)]
    return shapes


def optimizer_step_fn(shapes: list[tuple[int, ...]], device="cpu"):
    """zero_grad + Adam step over parameters of the model's own shapes (per-tensor costs included)."""
    params = [torch.nn.Parameter(torch.randn(s, device=device)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=device)
    opt = torch.optim.Adam(params, lr=1e-3)

    def fn():
        opt.zero_grad(set_to_none=False)
        opt.step()
    return fn, sum(p.numel() for p in params)


def compute_timings(specs: list[tuple[list[dict], int]], fractions: list[float], repeats: int,
                    together: bool = False, device="cpu") -> list[dict]:
    """Every conv/pool/dense layer of the specs at each slab fraction, and the optimizer step, on
    `device` (the fresh pages' cost is the host's: glibc's heap).

    With `together` every rank of the group must call this with the same arguments.
    """
    concurrent = dist.get_world_size() if together else 1
    rows = []
    _warm_allocator(2 * max(activation_bytes(spec, batch) for spec, batch in specs))
    evict = torch.zeros(max(activation_bytes(spec, batch) for spec, batch in specs) // 4, device=device)
    for spec, batch in specs:
        for L in spec:
            if L["kind"] not in ("conv", "pool", "dense"):
                continue
            for frac in (fractions if L["kind"] != "dense" else [1.0]):
                fwd, units, got = _layer_fn(L, batch, frac, input_grad=L is not spec[0], device=device)
                # the step's other activations, on a slab of the same fraction
                n = max(0, int(activation_bytes(spec, batch) * got) - _nbytes(L, batch, got)) // 4
                t = _best_fwd_bwd(fwd, evict[:n] if n else None, repeats, together, device)
                rows.append({"kind": L["kind"], "layer": L["name"], "key": layer_key(L), "batch": batch,
                             "fraction": frac, "concurrent": concurrent, "units": units, "time_s": t})
    sizes = {int(fresh_bytes(spec, batch)) for spec, batch in specs}
    for nbytes in sorted(sizes | {4 * max(sizes)}):
        n = max(mmap.PAGESIZE, nbytes)
        rows.append({"kind": "fault", "units": n, "concurrent": concurrent,
                     "time_s": best(functools.partial(_touch_fresh, n), repeats, together)})
    shape_sets = [_param_shapes(spec) for spec, _ in specs]
    shape_sets.append([s for shapes in shape_sets for s in shapes] * 2)  # a larger model
    for shapes in shape_sets:
        fn, n = optimizer_step_fn(shapes, device)
        rows.append({"kind": "optimizer", "units": n, "concurrent": concurrent,
                     "time_s": best(fn, repeats, together, device)})
    return rows
