"""Tiny rank functions that check a launch works end to end (used by tests and the Slurm check)."""

from __future__ import annotations

import os
import socket


def allreduce_sum(value: float = 1.0) -> dict:
    """Every rank contributes `value * (rank + 1)`; returns what this rank saw."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value * (dist.get_rank() + 1)], dtype=torch.float64)
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": float(t.item()),
            "host": socket.gethostname(), "slurm_procid": os.environ.get("SLURM_PROCID"),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID")}


def environment(names: list[str]) -> dict:
    """The values of `names` in this rank's environment (None where unset)."""
    return {name: os.environ.get(name) for name in names}


def die_on_rank(victim: int = 1) -> dict:
    """Rank `victim` exits abruptly before a collective; the others must not hang."""
    import torch
    import torch.distributed as dist

    if dist.get_rank() == victim:
        os._exit(3)
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"rank": dist.get_rank()}


def raise_on_rank(victim: int = 1) -> dict:
    """Rank `victim` raises before a collective: its traceback must reach the caller."""
    import torch
    import torch.distributed as dist

    if dist.get_rank() == victim:
        raise RuntimeError(f"rank {victim} gives up")
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"rank": dist.get_rank()}
