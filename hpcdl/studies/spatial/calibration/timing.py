"""How the calibration microbenchmarks turn repeated timings into one number.

A shared machine only adds time, so most timings keep their fastest quartile; a call that sometimes
waits keeps its interquartile mean. Timed `together`, every rank runs at once and the slowest rank
sets each repetition's time.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from hpcdl.studies.spatial.devices import comm_tensor, now


def fastest_quartile(times) -> float:
    """Mean of the fastest quarter (at least one): other processes on a shared machine only add time."""
    t = np.sort(np.asarray(times, float))
    return float(t[:max(1, len(t) // 4)].mean())


def interquartile_mean(times) -> float:
    """Mean of the middle half: the typical cost of a call that sometimes waits, without its tails."""
    t = np.sort(np.asarray(times, float))
    q = len(t) // 4
    return float(t[q:len(t) - q].mean())


def slowest(times: list[float]) -> list[float]:
    """Each repetition's time on the slowest rank of the group."""
    t = comm_tensor(times, torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def best(fn, repeats: int, together: bool = False, device="cpu") -> float:
    """Fastest quartile of fn's seconds (fn's work on `device`, waited for on a GPU).

    `together`: every rank of the group runs fn at the same moment (a barrier before each
    repetition) and the slowest rank sets each repetition's time, as in a spatial run where all
    ranks compute at once on shared cores, caches and memory bandwidth and meet at every halo.
    """
    fn()  # warm-up: allocator, kernels
    times = []
    for _ in range(repeats):
        if together:
            dist.barrier()
        t0 = now(device)
        fn()
        times.append(now(device) - t0)
    if together:
        times = slowest(times)
    return fastest_quartile(times)
