"""Rank functions that compare the partitioned ops and model with their unpartitioned versions.

Every rank builds the same seeded reference (nn.Conv3d / CosmoFlow) on the full input and
the partitioned version on its slab, then reports the relative error of outputs, input
gradients and weight gradients (max |a - b| / max |b|). Both run on the rank's compute device
(its GPU under CUDA, float64 there too), from the same values drawn on the host.
"""

from __future__ import annotations

import copy
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from hpcdl.common.layers import build_spec
from hpcdl.platform import current_placement
from hpcdl.studies.spatial.devices import to_comm, where
from hpcdl.studies.spatial.model import CosmoFlow, SpatialCosmoFlow, make_layout


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max().item()
    return float((a - b).abs().max().item() / (scale if scale > 0 else 1.0))


def world_layout(grid):
    world, rank = dist.get_world_size(), dist.get_rank()
    if grid[0] * grid[1] != world:
        raise ValueError(f"spatial grid {grid[0]}x{grid[1]} needs {grid[0] * grid[1]} ranks, have {world}")
    return make_layout(tuple(grid), tuple(range(world)), dist.group.WORLD if world > 1 else None, rank)


def sum_over_layout(t: torch.Tensor, layout) -> torch.Tensor:
    if layout.size > 1:
        sent = to_comm(t)
        dist.all_reduce(sent, group=layout.group)
        if sent is not t:
            t.copy_(sent)
    return t


def model_case(shape: tuple[int, int, int], model: dict, grid: tuple[int, int] = (0, 1), batch: int = 2,
               die_rank: int | None = None, die_status: int = 3, stall_rank: int | None = None,
               stall_s: float = 0.0) -> dict:
    """Whole CosmoFlow-like model, partitioned vs whole: loss, input grads, every parameter grad.

    Fault tests: `die_rank` exits abruptly (status `die_status`) while its neighbours are in the
    first exchange; `stall_rank` sleeps `stall_s` seconds there instead (a hung peer). With
    die_status 0 the launcher sees no failed rank and leaves the survivors running, so what the
    launch reports is the survivors' own error, not a race with the launcher stopping them.
    """
    torch.set_default_dtype(torch.float64)
    place = current_placement()
    dev = torch.device(place.compute)
    grid = (dist.get_world_size(), 1) if grid[0] == 0 else tuple(grid)
    layout = world_layout(grid)
    torch.manual_seed(7)
    ref = CosmoFlow(build_spec(tuple(shape), model)).to(dev)
    x = torch.randn(batch, 1, *shape).to(dev).requires_grad_(True)
    target = torch.randn(batch, 2).to(dev)
    loss_ref = nn.functional.mse_loss(ref(x), target)
    loss_ref.backward()
    net = copy.deepcopy(ref)
    net.zero_grad()
    sp = SpatialCosmoFlow(net, layout)
    ds, hs = sp.slab()
    xs = x.detach()[:, :, ds, hs].clone().requires_grad_(True)
    if die_rank is not None and dist.get_rank() == die_rank:
        # Let the first exchange start on the others, then vanish mid-forward.
        os._exit(die_status)
    if stall_rank is not None and dist.get_rank() == stall_rank:
        time.sleep(stall_s)
    loss = nn.functional.mse_loss(sp(xs), target)
    loss.backward()
    conv_ids = {id(p) for p in sp.conv_parameters()}
    errs = []
    for p_ref, p in zip(ref.parameters(), net.parameters(), strict=False):
        g = p.grad.clone()
        if id(p) in conv_ids:
            sum_over_layout(g, layout)
        errs.append(rel_err(g, p_ref.grad))
    return {"rank": dist.get_rank(), "err_loss": rel_err(loss.detach(), loss_ref.detach()),
            "err_grad_input": rel_err(xs.grad, x.grad[:, :, ds, hs]), "err_grad_params": max(errs),
            "out_sizes": sp.out_sizes, **where(place), "backend": str(dist.get_backend())}
