"""Rank functions only the tests launch
(hpcdl.platform.kit.rank_runtime.launch.run_ranks("rank_probes:<name>", ...)): fault probes and the
layer-level exactness check. conftest.py puts tests/ on the ranks' PYTHONPATH."""

from __future__ import annotations

import copy
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from hpcdl.common.layers import padding_for
from hpcdl.platform.kit.rank_runtime.placement import current
from hpcdl.studies.spatial.devices import where
from hpcdl.studies.spatial.exactness import rel_err, sum_over_layout, world_layout
from hpcdl.studies.spatial.model import SpatialConv3d
from hpcdl.studies.spatial.partition import split_sizes

# what the launcher imports before forking the ranks (rank_runtime.forked); a module nothing else here
# imports, so modules_loaded can tell the preload happened
RANK_PRELOAD = ("xml.dom.minidom",)


def modules_loaded(names: list[str]) -> dict:
    """Whether each of `names` was imported when this rank's function started."""
    return {name: name in sys.modules for name in names}


def sleep_for(seconds: float) -> float:
    """Sleep, then return the seconds slept (a launch that outlives its timeout)."""
    time.sleep(seconds)
    return seconds


def environment(names: list[str]) -> dict:
    """The values of `names` in this rank's environment (None where unset)."""
    return {name: os.environ.get(name) for name in names}


def die_on_rank(victim: int = 1) -> dict:
    """Rank `victim` exits abruptly before a collective; the others must not hang."""
    if dist.get_rank() == victim:
        os._exit(3)
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"rank": dist.get_rank()}


def raise_on_rank(victim: int = 1) -> dict:
    """Rank `victim` raises before a collective: its traceback must reach the caller."""
    if dist.get_rank() == victim:
        raise RuntimeError(f"rank {victim} gives up")
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"rank": dist.get_rank()}


def conv_cases(cases: list[dict], grid: tuple[int, int] = (0, 1)) -> list[dict]:
    """One SpatialConv3d per case over all ranks (grid (0, 1) = world along depth), on the rank's
    compute device, from values drawn on the host."""
    torch.set_default_dtype(torch.float64)
    place = current()
    dev = torch.device(place.compute)
    grid = (dist.get_world_size(), 1) if grid[0] == 0 else tuple(grid)
    layout = world_layout(grid)
    out = []
    for i, c in enumerate(cases):
        torch.manual_seed(1000 + i)
        k, s = c["kernel"], c["stride"]
        p = padding_for(k, c["padding"])
        ref = nn.Conv3d(c["cin"], c["cout"], k, stride=s, padding=p).to(dev)
        x = torch.randn(c.get("n", 2), c["cin"], c["depth"], c["height"], c["width"]).to(dev)
        x.requires_grad_(True)
        y = ref(x)
        g = torch.randn(y.shape).to(dev)
        y.backward(g)
        conv = copy.deepcopy(ref)
        conv.zero_grad()
        in_sizes = (split_sizes(c["depth"], grid[0]), split_sizes(c["height"], grid[1]))
        sc = SpatialConv3d(conv, layout, in_sizes, tag=16 * i)
        (cd, ch) = layout.coords
        d0, h0 = sum(in_sizes[0][:cd]), sum(in_sizes[1][:ch])
        od, oh = sc.out_sizes
        o0, p0 = sum(od[:cd]), sum(oh[:ch]) if grid[1] > 1 else 0
        oh_n = oh[ch] if grid[1] > 1 else oh[0]
        xs = x.detach()[:, :, d0:d0 + in_sizes[0][cd], h0:h0 + in_sizes[1][ch]].clone().requires_grad_(True)
        ys = sc(xs)
        ref_slab = y.detach()[:, :, o0:o0 + od[cd], p0:p0 + oh_n]
        ys.backward(g[:, :, o0:o0 + od[cd], p0:p0 + oh_n])
        gw = sum_over_layout(conv.weight.grad.clone(), layout)
        gb = sum_over_layout(conv.bias.grad.clone(), layout)
        out.append({**c, "rank": dist.get_rank(), "err_out": rel_err(ys.detach(), ref_slab),
                    "err_grad_input": rel_err(xs.grad, x.grad[:, :, d0:d0 + in_sizes[0][cd],
                                                             h0:h0 + in_sizes[1][ch]]),
                    "err_grad_weight": rel_err(gw, ref.weight.grad),
                    "err_grad_bias": rel_err(gb, ref.bias.grad), **where(place)})
    return out
