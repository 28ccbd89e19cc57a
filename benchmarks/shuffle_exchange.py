"""Rank function timing the shuffle study's partial-Q exchange on its own.

The rank target "shuffle_exchange:exchange_throughput" of benchmarks/bench_shuffle.py, which puts
this directory on its ranks' PYTHONPATH.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from hpcdl.studies.shuffle.exchange import BackgroundExchange
from hpcdl.studies.shuffle.exchange_plan import destinations


def exchange_throughput(k: int, repeats: int = 5, seed: int = 0) -> dict:
    """Time the partial-Q all_to_all of k samples per rank.

    Uses the same plan and payload layout as training (image, label, id), on its own group.
    Returns this rank's best time and the bytes it sent; also the time of one memcpy of the
    same bytes in this process (the physical baseline).
    """
    rank, m = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(backend="gloo")
    dest = destinations(m, k, seed, 0)
    send_counts = np.bincount(dest[rank], minlength=m)
    recv_counts = (dest == rank).sum(axis=1)
    x = torch.randn(k, 1, 28, 28)
    y = torch.zeros(k, dtype=torch.int64)
    ids = torch.arange(k, dtype=torch.int64)
    best = float("inf")
    for _ in range(repeats):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        ex = BackgroundExchange(x, y, ids, send_counts, recv_counts, group, epoch=0)
        out, _ = ex.wait(120)
        best = min(best, time.perf_counter() - t0)
    nbytes = out.bytes_sent
    copy_best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for t in (x, y, ids):
            t.clone()
        copy_best = min(copy_best, time.perf_counter() - t0)
    return {"rank": rank, "time_s": best, "bytes_sent": nbytes, "memcpy_s": copy_best}
