"""Rank function timing the shuffle study's partial-Q exchange on its own.

The rank target "shuffle_exchange:exchange_throughput" of benchmarks/bench_shuffle.py, which puts
this directory on its ranks' PYTHONPATH.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from hpcdl.platform.task_app import current_placement
from hpcdl.studies.shuffle.exchange import BackgroundExchange, DeviceExchange
from hpcdl.studies.shuffle.exchange_plan import destinations


def exchange_throughput(k: int, repeats: int = 5, seed: int = 0, on: str = "host") -> dict:
    """Time the partial-Q all_to_all of k samples per rank.

    Uses the same plan, payload layout (image, label, id) and exchange classes as training: `on`
    "host" moves CPU tensors over a gloo group of its own (in a background thread), "device" moves
    the rank's CUDA tensors over the default NCCL group. Returns this rank's best time and the bytes
    it sent; also the time of one copy of the same bytes in the same memory (the physical baseline).
    """
    if on not in ("host", "device"):
        raise ValueError(f"on must be host or device, got {on!r}")
    rank, m = dist.get_rank(), dist.get_world_size()
    place = current_placement()
    dev = torch.device(place.compute if on == "device" else "cpu")
    group = dist.new_group(backend="gloo") if on == "host" else None
    dest = destinations(m, k, seed, 0)
    send_counts = np.bincount(dest[rank], minlength=m)
    recv_counts = (dest == rank).sum(axis=1)
    x = torch.randn(k, 1, 28, 28, device=dev)
    y = torch.zeros(k, dtype=torch.int64, device=dev)
    ids = torch.arange(k, dtype=torch.int64, device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    best = float("inf")
    for _ in range(repeats):
        dist.barrier(group=group)        # None: the default group (NCCL, bound to this rank's GPU)
        sync()
        t0 = time.perf_counter()
        if on == "host":
            ex = BackgroundExchange(x, y, ids, send_counts, recv_counts, group, epoch=0)
        else:
            ex = DeviceExchange(x, y, ids, send_counts, recv_counts, epoch=0)
        out, _ = ex.wait(120)
        sync()
        best = min(best, time.perf_counter() - t0)
    nbytes = out.bytes_sent
    copy_best = float("inf")
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for t in (x, y, ids):
            t.clone()
        sync()
        copy_best = min(copy_best, time.perf_counter() - t0)
    return {"rank": rank, "time_s": best, "bytes_sent": nbytes, "memcpy_s": copy_best, "on": on,
            "device": place.label}
