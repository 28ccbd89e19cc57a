"""Rank functions of the checkpoint tests (run_ranks("checkpoint_rank_probes:<name>", ...));
conftest.py puts tests/ on the ranks' PYTHONPATH."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from hpcdl.studies.checkpoint import saver


def async_dcp_saves_beside_collectives(root: str, saves: int = 3, reduces: int = 20) -> dict:
    """Each rank checkpoints its own state with an async DCP saver while its main thread keeps
    all-reducing on the default group (training's collectives): every checkpoint must be this
    rank's state at its save, whole in this rank's own directory."""
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = {"w": torch.full((64, 32), float(rank)), "step": torch.tensor(0)}
    mine = Path(root) / f"rank-{rank}"
    ck = saver.AsyncCheckpointer(mine, "dcp")
    ck.prepare(flat)
    wants = []
    for i in range(saves):
        wants.append({k: v.clone() for k, v in flat.items()})
        ck.save(flat, f"step-{i}")
        for _ in range(reduces):  # while the persist runs in the background
            t = torch.ones(1)
            dist.all_reduce(t)
            flat["w"].add_(t)
        flat["step"].add_(1)
    ck.wait()
    mismatched = []
    for i, want in enumerate(wants):
        back = saver.load(mine / f"step-{i}")
        mismatched += [f"step-{i}:{k}" for k in want if not torch.equal(back[k], want[k])]
    return {"rank": rank, "world": world, "mismatched": mismatched,
            "entries": sorted(p.name for p in mine.iterdir()),  # staging leftovers included
            "w_after": float(flat["w"][0, 0])}
