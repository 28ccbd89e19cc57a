"""Hybrid data x spatial process groups: world = n_data groups of (pd x ph) spatial ranks.

Spatial groups are contiguous ranks (on a cluster they land inside one node, where the
halo traffic is); data groups take one rank from each spatial group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from hpcdl.studies.spatial.model import Layout, make_layout


@dataclass
class Hybrid:
    n_data: int
    data_index: int
    layout: Layout
    data_group: object
    data_ranks: tuple[int, ...]


def hybrid_groups(n_data: int, grid: tuple[int, int]) -> Hybrid:
    """Create every spatial and data group (all ranks must call this, in the same order)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    n_spatial = grid[0] * grid[1]
    if n_data * n_spatial != world:
        raise ValueError(f"world size {world} != data groups {n_data} x spatial grid {grid[0]}x{grid[1]}")
    mine_s = mine_d = None
    for g in range(n_data):
        ranks = tuple(range(g * n_spatial, (g + 1) * n_spatial))
        grp = dist.new_group(list(ranks))
        if rank in ranks:
            mine_s = (grp, ranks, g)
    for s in range(n_spatial):
        ranks = tuple(range(s, world, n_spatial))
        grp = dist.new_group(list(ranks))
        if rank in ranks:
            mine_d = (grp, ranks)
    layout = make_layout(grid, mine_s[1], mine_s[0], rank)
    return Hybrid(n_data, mine_s[2], layout, mine_d[0], mine_d[1])
