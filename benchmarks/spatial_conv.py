"""Rank function timing one partitioned Conv3d forward+backward on a fixed global input.

The rank target "spatial_conv:conv_fwd_bwd" of benchmarks/bench_spatial.py, which puts this
directory on its ranks' PYTHONPATH. It runs on the rank's compute device (its GPU under CUDA, timed
once the GPU is done).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hpcdl.platform.task_app import current_placement
from hpcdl.studies.spatial.devices import now
from hpcdl.studies.spatial.halo import TIMERS
from hpcdl.studies.spatial.model import SpatialConv3d, make_layout
from hpcdl.studies.spatial.partition import split_sizes


def conv_fwd_bwd(shape: tuple[int, int, int], cin: int, cout: int, kernel: int, batch: int,
                 repeats: int) -> dict:
    """Median seconds of fwd+bwd of this rank's slab (depth split over all ranks) and its halo part."""
    world, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device(current_placement().compute)
    layout = make_layout((world, 1), tuple(range(world)), dist.group.WORLD if world > 1 else None, rank)
    torch.manual_seed(0)
    conv = nn.Conv3d(cin, cout, kernel, padding=(kernel - 1) // 2).to(dev)
    sizes = split_sizes(shape[0], world)
    sc = SpatialConv3d(conv, layout, (sizes, (shape[1],)))
    x = torch.randn(batch, cin, sizes[rank], shape[1], shape[2]).to(dev).requires_grad_(True)
    totals, halos = [], []
    for i in range(repeats + 1):
        if world > 1:
            dist.barrier()
        TIMERS.reset()
        t0 = now(dev)
        sc(x).sum().backward()
        total = now(dev) - t0
        if i:  # the first call warms up allocator and kernels
            totals.append(total)
            halos.append(TIMERS.settle()["halo"])
    return {"rank": rank, "time_s": float(np.median(totals)), "halo_s": float(np.median(halos)),
            "placement": current_placement().label}
