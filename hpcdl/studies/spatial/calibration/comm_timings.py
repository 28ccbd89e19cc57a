"""The calibration's communication microbenchmarks: ping-pong between ranks 0 and 1 gives (alpha,
beta), and the same sizes through all-reduce, all-gather and a two-sided exchange give the constants
of the collectives as this group's backend runs them (hpcdl.studies.spatial.calibration.microbench).
"""

from __future__ import annotations

import functools
import time

import torch
import torch.distributed as dist

from hpcdl.platform import current_placement
from hpcdl.studies.spatial.calibration.timing import fastest_quartile, interquartile_mean
from hpcdl.studies.spatial.devices import comm_tensor, now, synchronize


def pingpong(sizes_bytes: list[int], repeats: int) -> list[dict]:
    rank = dist.get_rank()
    comm = torch.device(current_placement().comm)
    rows = []
    for n in sizes_bytes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32, device=comm)
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            t0 = now(comm)
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if i:
                times.append(now(comm) - t0)
        rows.append({"kind": "pingpong", "size_bytes": buf.numel() * 4,
                     "time_s": fastest_quartile(times) / 2})
    return rows


def _exchange(buf: torch.Tensor, recv: torch.Tensor, peer: int | None) -> None:
    if peer is None:
        return
    if buf.is_cuda:  # NCCL: one group call, as the halo's (hpcdl.studies.spatial.halo.post)
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, recv, peer, tag=7),
                                        dist.P2POp(dist.isend, buf, peer, tag=7)])
    else:
        works = [dist.irecv(recv, src=peer, tag=7), dist.isend(buf, dst=peer, tag=7)]
    for w in works:
        w.wait()


def _gap_work(seconds: float, device="cpu"):
    """A fixed amount of matmul work lasting about `seconds` on rank 0, the same on every rank; on a
    GPU each product is counted once done, and the work returns once its kernels are."""
    a = torch.randn(128, 128, device=device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.05:
        a @ a
        synchronize(device)
        n += 1
    count = comm_tensor([max(1, round(seconds * n / (time.perf_counter() - t0)))])
    dist.broadcast(count, 0)

    def work():
        for _ in range(int(count)):
            a @ a
        synchronize(device)
    return work


def collectives(sizes_bytes: list[int], repeats: int, gap_s: float = 0.0) -> list[dict]:
    """gloo all-reduce, all-gather and a two-sided exchange (isend/irecv both ways, as a halo) on
    this group: the oracle's collective and halo constants, same alpha-beta form as ping-pong.

    In a training step every collective follows a stretch of compute (a layer's forward or
    backward), and there it costs more than back to back: the ranks arrive apart (jitter of that
    compute) and a rank blocked in the receive must be woken. With `gap_s` > 0 each timed call
    follows `gap_s` of the same compute on every rank, and the interquartile mean of 6 x `repeats`
    calls is the row's time (the fastest would hide exactly that cost; single calls on a shared
    machine vary several-fold, hence the many repetitions, cheap at these sizes)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    peer = 1 - rank if rank < 2 else None
    place = current_placement()
    comm = torch.device(place.comm)
    gap = _gap_work(gap_s, place.compute) if gap_s > 0 else None
    reps = 6 * repeats if gap else repeats
    rows = []
    for n in sizes_bytes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32, device=comm)
        recv = torch.empty_like(buf)
        outs = [torch.empty_like(buf) for _ in range(world)]
        ops = (("allreduce", functools.partial(dist.all_reduce, buf), buf.numel() * 4),
               ("allgather", functools.partial(dist.all_gather, outs, buf), buf.numel() * 4 * world),
               ("exchange", functools.partial(_exchange, buf, recv, peer), buf.numel() * 4))
        for kind, fn, size in ops:
            times = []
            for i in range(reps + 1):
                dist.barrier()
                if gap:
                    gap()
                t0 = now(comm)
                fn()
                if i:
                    times.append(now(comm) - t0)
            t = interquartile_mean(times) if gap else fastest_quartile(times)
            rows.append({"kind": kind, "size_bytes": size, "ranks": world, "time_s": t, "gap_s": gap_s})
    return rows
