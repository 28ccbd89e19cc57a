"""CosmoFlow-like 3D CNN, run whole (reference) or spatially partitioned with halo exchange.

`CosmoFlow` owns the parameters and runs the unpartitioned forward. `SpatialCosmoFlow` wraps
the same parameters and runs the forward on this rank's slab (partitioned along depth and
optionally height); at the boundary to the dense head the slabs are all-gathered, so the
head runs replicated on every spatial rank and its gradient needs no spatial reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hpcdl.common.layers import conv_out
from hpcdl.studies.spatial.devices import to_comm
from hpcdl.studies.spatial.halo import TIMERS, Line, halo_exchange
from hpcdl.studies.spatial.overlap import overlapped_conv3d
from hpcdl.studies.spatial.partition import AxisPlan, plan_axis, split_sizes

LEAK = 0.2


class CosmoFlow(nn.Module):
    """The reference network: conv3d+LeakyReLU(+maxpool) blocks, flatten, dense head."""

    def __init__(self, spec: list[dict]):
        super().__init__()
        self.spec = spec
        self.convs = nn.ModuleList(nn.Conv3d(s["cin"], s["cout"], s["kernel"], stride=s["stride"],
                                             padding=s["pad"]) for s in spec if s["kind"] == "conv")
        self.dense = nn.ModuleList(nn.Linear(s["fin"], s["fout"]) for s in spec if s["kind"] == "dense")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        convs = iter(self.convs)
        for s in self.spec:
            if s["kind"] == "conv":
                x = F.leaky_relu(next(convs)(x), LEAK)
            elif s["kind"] == "pool":
                x = F.max_pool3d(x, s["kernel"], s["stride"])
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for lin, s in zip(self.dense, [s for s in self.spec if s["kind"] == "dense"], strict=False):
            x = lin(x)
            if s["act"]:
                x = F.leaky_relu(x, LEAK)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@dataclass
class Layout:
    """Where this rank sits: spatial grid (pd x ph) over depth x height, lines to its neighbours."""

    grid: tuple[int, int]
    coords: tuple[int, int]
    depth_line: Line
    height_line: Line
    group: object  # spatial process group (None on one rank)
    group_ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.grid[0] * self.grid[1]


def make_layout(grid: tuple[int, int], spatial_ranks: tuple[int, ...], group, my_rank: int) -> Layout:
    """Spatial rank i sits at (i // ph, i % ph): depth-major, so depth neighbours differ by ph."""
    pd, ph = grid
    i = spatial_ranks.index(my_rank)
    cd, ch = divmod(i, ph)
    depth = Line(tuple(spatial_ranks[d * ph + ch] for d in range(pd)), cd)
    height = Line(tuple(spatial_ranks[cd * ph + h] for h in range(ph)), ch)
    return Layout((pd, ph), (cd, ch), depth, height, group, tuple(spatial_ranks))


def single_layout() -> Layout:
    me = dist.get_rank() if dist.is_initialized() else 0
    return Layout((1, 1), (0, 0), Line((me,), 0), Line((me,), 0), None, (me,))


def window(x: torch.Tensor, plans, layout: Layout, tag: int) -> torch.Tensor:
    """Exchange depth halos, then height halos of the depth-extended block (which fills corners)."""
    pdp, php = plans
    x = halo_exchange(x, pdp, layout.depth_line, 2, tag=tag)
    if php is not None:
        x = halo_exchange(x, php, layout.height_line, 3, tag=tag + 2)
    return x


def partitioned_conv3d(x, weight, bias, stride: int, pad: int, plans, layout: Layout, tag: int,
                       overlap: bool = False):
    """Conv3d on a slab: halo window, then a local conv with padding only on unpartitioned axes.

    `overlap` (depth-only partitions): the exchange is hidden behind the slab's compute
    (hpcdl.studies.spatial.overlap); with height partitioned too the exchange blocks.
    """
    def blocking():
        w = window(x, plans, layout, tag)
        pad_h = 0 if plans[1] is not None else pad
        return F.conv3d(w, weight, bias, stride=stride, padding=(0, pad_h, pad))
    if overlap and plans[1] is None and len(layout.depth_line.ranks) > 1:
        return overlapped_conv3d(x, weight, bias, stride, pad, plans[0], layout.depth_line, tag, blocking)
    return blocking()


class SpatialConv3d(nn.Module):
    """An nn.Conv3d (cubic kernel/stride, 'same'/'valid'/int padding) on depth(/height) slabs.

    `in_sizes` are the global slab sizes along depth and height; `out_sizes` tells the next
    layer how the output is partitioned.
    """

    def __init__(self, conv: nn.Conv3d, layout: Layout, in_sizes: tuple[tuple[int, ...], tuple[int, ...]],
                 tag: int = 0, overlap: bool = True):
        super().__init__()
        self.overlap = overlap
        k, s, p = conv.kernel_size[0], conv.stride[0], conv.padding[0]
        if len({*conv.kernel_size}) != 1 or len({*conv.stride}) != 1 or len({*conv.padding}) != 1:
            raise ValueError("SpatialConv3d supports cubic kernel, stride and padding only")
        self.conv, self.layout, self.tag = conv, layout, tag
        self.k, self.s, self.p = k, s, p
        d_plan = plan_axis(in_sizes[0], k, s, p, "conv (depth)")
        h_plan = plan_axis(in_sizes[1], k, s, p, "conv (height)") if layout.grid[1] > 1 else None
        self.plans = (d_plan, h_plan)
        self.out_sizes = (d_plan.out_sizes,
                          h_plan.out_sizes if h_plan else (conv_out(sum(in_sizes[1]), k, s, p),))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return partitioned_conv3d(x, self.conv.weight, self.conv.bias, self.s, self.p, self.plans,
                                  self.layout, self.tag, self.overlap)


class _Gather(torch.autograd.Function):
    """Slabs -> the full feature map on every spatial rank; backward keeps this rank's block.

    The backward is exact because every spatial rank runs the same head on the same gathered
    features, so each holds the same full gradient and needs only its own block of it.
    """

    @staticmethod
    def forward(ctx, x, layout: Layout, d_sizes, h_sizes):
        ctx.block = (layout.coords, d_sizes, h_sizes)
        if layout.size == 1:
            return x
        t0 = TIMERS.start(x.device)
        n, c, _, _, w = x.shape
        md, mh = max(d_sizes), max(h_sizes)
        padded = x.new_zeros((n, c, md, mh, w))
        padded[:, :, :x.shape[2], :x.shape[3]] = x
        padded = to_comm(padded)  # staged through the host where ranks share a GPU
        bufs = [torch.empty_like(padded) for _ in range(layout.size)]
        dist.all_gather(bufs, padded, group=layout.group)
        pd, ph = layout.grid
        rows = []
        for cd in range(pd):
            rows.append(torch.cat([bufs[cd * ph + ch][:, :, :d_sizes[cd], :h_sizes[ch]] for ch in range(ph)],
                                  dim=3))
        out = torch.cat(rows, dim=2)
        if out.device != x.device:
            out = out.to(x.device)
        TIMERS.stop("gather", t0)
        return out

    @staticmethod
    def backward(ctx, grad):
        (cd, ch), d_sizes, h_sizes = ctx.block
        d0, h0 = sum(d_sizes[:cd]), sum(h_sizes[:ch])
        return grad[:, :, d0:d0 + d_sizes[cd], h0:h0 + h_sizes[ch]].contiguous(), None, None, None


class SpatialCosmoFlow(nn.Module):
    """Runs `net` on this rank's slab; plans every layer's exchange once from the global shape."""

    def __init__(self, net: CosmoFlow, layout: Layout, allow_uneven: bool = True, overlap: bool = True):
        super().__init__()
        self.net, self.layout, self.overlap = net, layout, overlap
        first = net.spec[0]["in"]
        pd, ph = layout.grid
        d_sizes = split_sizes(first[1], pd, "depth", allow_uneven)
        h_sizes = split_sizes(first[2], ph, "height", allow_uneven)
        self.in_sizes = (d_sizes, h_sizes)
        self.plans: list[tuple[AxisPlan, AxisPlan | None] | None] = []
        for s in net.spec:
            if s["kind"] in ("conv", "pool"):
                pdp = plan_axis(d_sizes, s["kernel"], s["stride"], s["pad"], f"{s['name']} (depth)")
                php = (plan_axis(h_sizes, s["kernel"], s["stride"], s["pad"], f"{s['name']} (height)")
                       if ph > 1 else None)
                self.plans.append((pdp, php))
                d_sizes = pdp.out_sizes
                h_sizes = php.out_sizes if php else (s["out"][2],)
            else:
                self.plans.append(None)
        self.out_sizes = (d_sizes, h_sizes)

    def slab(self) -> tuple[slice, slice]:
        """Global depth and height ranges of this rank's input block."""
        (cd, ch), (ds, hs) = self.layout.coords, self.in_sizes
        d0, h0 = sum(ds[:cd]), sum(hs[:ch])
        return slice(d0, d0 + ds[cd]), slice(h0, h0 + hs[ch])

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout.size == 1:  # one rank: the plain network (no window copies), the fair baseline
            return self.net.features(x)
        convs = iter(self.net.convs)
        for i, (s, plans) in enumerate(zip(self.net.spec, self.plans, strict=False)):
            if s["kind"] == "conv":
                conv = next(convs)
                x = partitioned_conv3d(x, conv.weight, conv.bias, s["stride"], s["pad"], plans,
                                       self.layout, tag=8 * i, overlap=self.overlap)
                x = F.leaky_relu(x, LEAK)
            elif s["kind"] == "pool":
                x = F.max_pool3d(window(x, plans, self.layout, 8 * i), s["kernel"], s["stride"])
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = _Gather.apply(self.features(x), self.layout, *self.out_sizes)
        return self.net.head(feats)

    def conv_parameters(self) -> list[nn.Parameter]:
        return list(self.net.convs.parameters())
