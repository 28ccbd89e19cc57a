"""Check that a rank launch works end to end, here or inside a Slurm allocation.

    python -m hpcdl ranks-probe [N [DEVICE]]   # N ranks (default 2) all-reduce on DEVICE (cpu, cuda,
                                              # auto; default cpu); prints what each saw

Exits 1 when a rank saw a wrong sum. The Slurm test (tests/slurm/ranks_probe.py) runs the same probe.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def allreduce_sum(value: float = 1.0) -> dict:
    """Every rank contributes `value * (rank + 1)`; returns what this rank saw."""
    import torch
    import torch.distributed as dist

    from hpcdl.platform.kit.rank_runtime.placement import current

    place = current()
    # the tensor lives where this rank's collectives move data: its GPU over NCCL, host memory over gloo
    t = torch.tensor([value * (dist.get_rank() + 1)], dtype=torch.float64, device=place.comm)
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": float(t.item()),
            "host": socket.gethostname(), "slurm_procid": os.environ.get("SLURM_PROCID"),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "backend": str(dist.get_backend()),
            "compute": place.compute, "tensor_device": str(t.device)}


def main(argv: list[str] | None = None) -> int:
    from hpcdl.platform.kit.device import resolve
    from hpcdl.platform.kit.rank_runtime.launch import run_ranks

    args = sys.argv[1:] if argv is None else argv
    n = int(args[0]) if args else 2
    device = resolve(args[1] if len(args) > 1 else "cpu", "ranks-probe device")
    results = run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", n, {"value": 1.0},
                        timeout_s=120, device=device)
    expected = n * (n + 1) / 2
    for r in results:
        print(json.dumps(r))
    bad = [r["rank"] for r in results if r["sum"] != expected]
    print(f"{n} ranks: {'OK' if not bad else f'wrong sum on ranks {bad}'} (expected {expected:g})")
    return 1 if bad else 0

