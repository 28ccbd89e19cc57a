"""Rank functions for the two-node Slurm tests (tests/test_slurm.py): where each rank ran, around any
rank target. Importable by the ranks srun starts: the tests put tests/slurm on their PYTHONPATH."""

from __future__ import annotations

import importlib
import os
import socket


def where() -> dict:
    """This rank's node as Slurm, the resolver and the process group see it."""
    import torch.distributed as dist

    from hpcdl.platform.kit.rank_runtime.placement import local_rank_and_world

    host = socket.gethostname()
    local, on_node = local_rank_and_world()
    return {"host": host, "address": socket.gethostbyname(host),   # where gloo binds (its hostname)
            "slurmd_nodename": os.environ.get("SLURMD_NODENAME"),
            "slurm_procid": os.environ.get("SLURM_PROCID"), "slurm_localid": os.environ.get("SLURM_LOCALID"),
            "rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "local_rank": local, "ranks_on_node": on_node, "master_addr": os.environ.get("MASTER_ADDR")}


def located(target: str, kwargs: dict) -> dict:
    """Run `target` ("module:function") with `kwargs` on this rank; return its result and where it ran."""
    module, func = target.split(":")
    return {"where": where(), "result": getattr(importlib.import_module(module), func)(**kwargs)}
