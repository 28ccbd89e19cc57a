"""Microbenchmarks that calibrate the oracle on this machine (run on 2 ranks by the study).

Ping-pong between ranks 0 and 1 over the process group's backend gives (alpha, beta), and the
same sizes through all-reduce, all-gather and a two-sided exchange give the constants of the
collectives as this backend runs them; while
rank 1 waits, rank 0 times conv3d+activation, max-pool and dense layers forward+backward at
the study's layer shapes and slab fractions, an Adam step, and slab reads from the GRF cache.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from hpcdl.spatial.arch import flops, layer_key, n_params
from hpcdl.spatial.data import SlabReader
from hpcdl.spatial.model import LEAK


def fastest_quartile(times) -> float:
    """Mean of the fastest quarter (at least one): other processes on a shared machine only add time."""
    t = np.sort(np.asarray(times, float))
    return float(t[:max(1, len(t) // 4)].mean())


def _best(fn, repeats: int) -> float:
    fn()  # warm-up: allocator, kernels
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return fastest_quartile(times)


def pingpong(sizes_bytes: list[int], repeats: int) -> list[dict]:
    rank = dist.get_rank()
    rows = []
    for n in sizes_bytes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32)
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if i:
                times.append(time.perf_counter() - t0)
        rows.append({"kind": "pingpong", "size_bytes": buf.numel() * 4,
                     "time_s": fastest_quartile(times) / 2})
    return rows


def _exchange(buf: torch.Tensor, recv: torch.Tensor, peer: int | None) -> None:
    if peer is None:
        return
    works = [dist.irecv(recv, src=peer, tag=7), dist.isend(buf, dst=peer, tag=7)]
    for w in works:
        w.wait()


def collectives(sizes_bytes: list[int], repeats: int) -> list[dict]:
    """gloo all-reduce, all-gather and a two-sided exchange (isend/irecv both ways, as a halo) on
    this group: the oracle's collective and halo constants, same alpha-beta form as ping-pong."""
    world, rank = dist.get_world_size(), dist.get_rank()
    peer = 1 - rank if rank < 2 else None
    rows = []
    for n in sizes_bytes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32)
        recv = torch.empty_like(buf)
        outs = [torch.empty_like(buf) for _ in range(world)]
        ops = (("allreduce", functools.partial(dist.all_reduce, buf), buf.numel() * 4),
               ("allgather", functools.partial(dist.all_gather, outs, buf), buf.numel() * 4 * world),
               ("exchange", functools.partial(_exchange, buf, recv, peer), buf.numel() * 4))
        for kind, fn, size in ops:
            times = []
            for i in range(repeats + 1):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                if i:
                    times.append(time.perf_counter() - t0)
            rows.append({"kind": kind, "size_bytes": size, "ranks": world, "time_s": fastest_quartile(times)})
    return rows


def _layer_fn(L: dict, batch: int, frac_d: float, input_grad: bool = True):
    """A fwd+bwd closure for layer L on a slab with frac_d of its depth.

    `input_grad` is False for the network's first layer: training needs no gradient of the data.
    """
    if L["kind"] == "dense":
        x = torch.randn(batch, L["fin"], requires_grad=True)
        w = torch.randn(L["fout"], L["fin"], requires_grad=True)
        return (lambda: F.linear(x, w).sum().backward()), flops(L) * batch
    c, d, h, w_ = L["in"]
    d_loc = max(L["kernel"], int(round(d * frac_d)))
    x = torch.randn(batch, c, d_loc, h, w_, requires_grad=input_grad)
    if L["kind"] == "conv":
        wt = torch.randn(L["cout"], c, L["kernel"], L["kernel"], L["kernel"], requires_grad=True)

        def fn():
            F.leaky_relu(F.conv3d(x, wt, padding=L["pad"], stride=L["stride"]), LEAK).sum().backward()
        units = flops(L) * batch * d_loc / d
    else:
        def fn():
            F.max_pool3d(x, L["kernel"], L["stride"]).sum().backward()
        units = flops(L) * batch * d_loc / d
    return fn, units


def layer_timings(specs: list[tuple[list[dict], int]], fractions: list[float], repeats: int) -> list[dict]:
    rows = []
    for spec, batch in specs:
        for L in spec:
            if L["kind"] not in ("conv", "pool", "dense"):
                continue
            for frac in (fractions if L["kind"] != "dense" else [1.0]):
                fn, units = _layer_fn(L, batch, frac, input_grad=L is not spec[0])
                rows.append({"kind": L["kind"], "layer": L["name"], "key": layer_key(L), "batch": batch,
                             "fraction": frac,
                             "units": units, "time_s": _best(fn, repeats)})
    return rows


def optimizer_timings(param_counts: list[int], repeats: int) -> list[dict]:
    rows = []
    for n in param_counts:
        p = torch.nn.Parameter(torch.randn(n))
        p.grad = torch.randn(n)
        opt = torch.optim.Adam([p], lr=1e-3)
        rows.append({"kind": "optimizer", "units": n, "time_s": _best(opt.step, repeats)})
    return rows


def io_timings(data_dir: str, batch: int, fractions: list[float], repeats: int) -> list[dict]:
    reader = SlabReader(data_dir)
    d = reader.shape[0]
    rows = []
    for frac in fractions:
        n_d = max(1, int(round(d * frac)))
        idx = np.arange(min(batch, len(reader)))
        t = _best(lambda idx=idx, n_d=n_d: reader.read(idx, slice(0, n_d), slice(None)), repeats)
        nbytes = len(idx) * n_d * reader.shape[1] * reader.shape[2] * 4
        rows.append({"kind": "io", "units": nbytes, "batch": len(idx), "time_s": t})
    return rows


def calibrate_rank(specs: list[tuple[list[dict], int]], data_dir: str, sizes_bytes: list[int],
                   fractions: list[float], repeats: int) -> list[dict]:
    """Every rank joins the ping-pong; rank 0 alone runs the compute timings (others wait)."""
    torch.set_default_dtype(torch.float32)
    rows = (pingpong(sizes_bytes, repeats) + collectives(sizes_bytes, repeats)
            if dist.get_world_size() > 1 else [])
    if dist.get_rank() == 0:
        rows += layer_timings(specs, fractions, repeats)
        counts = sorted({sum(n_params(L) for L in spec) for spec, _ in specs})
        rows += optimizer_timings(counts + [max(counts) * 4], repeats)
        rows += io_timings(data_dir, max(b for _, b in specs), fractions, repeats)
    if dist.get_world_size() > 1:
        dist.barrier()
    return rows
