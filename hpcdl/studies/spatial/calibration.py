"""Microbenchmarks that calibrate the oracle on this machine (run on 2 ranks by the study).

Ping-pong between ranks 0 and 1 over the process group's backend gives (alpha, beta), and the
same sizes through all-reduce, all-gather and a two-sided exchange give the constants of the
collectives as this backend runs them. Compute is timed as the model runs it, layer by
layer at the study's layer shapes and slab fractions: the halo window's copies, conv3d with
bias + LeakyReLU, max-pool, dense layers, forward+backward, and zero_grad + Adam step over the
model's parameter tensors; first on rank 0 alone (the other rank waits), then on every rank at
once with the slowest rank timed (contention for cores, cache and memory bandwidth, and the skew
every halo exchange waits for). Between a layer's forward and backward the rest of the step's
activations are streamed through the caches (untimed), as in a training step. The layer timings
run with the allocator warmed (no page faults); the cost of the fresh pages a step's largest
feature maps take from the OS is timed on its own (map, first-touch, unmap). Slab reads from
the GRF cache give the I/O cost.

Everything runs where the study's ranks run (hpcdl.platform.rank_runtime.placement): the layers on
the rank's compute device, the collectives' buffers on its comm device. On a GPU each timing waits
for the compute stream at both ends (devices.now), and I/O includes the copy to the GPU, as a
training step's does. (Fitting the oracle to a GPU at paper scale is another matter: #26.)
"""

from __future__ import annotations

import functools
import mmap
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from hpcdl.common.layers import flops, layer_key, numel
from hpcdl.platform.rank_runtime.placement import current
from hpcdl.studies.spatial.data import SlabReader
from hpcdl.studies.spatial.devices import comm_tensor, now, synchronize, where
from hpcdl.studies.spatial.load import PhaseLoad, other_load_cores
from hpcdl.studies.spatial.model import LEAK, partitioned_conv3d, single_layout, window
from hpcdl.studies.spatial.partition import plan_axis
from hpcdl.studies.spatial.perfmodel.oracle import fresh_bytes


def fastest_quartile(times) -> float:
    """Mean of the fastest quarter (at least one): other processes on a shared machine only add time."""
    t = np.sort(np.asarray(times, float))
    return float(t[:max(1, len(t) // 4)].mean())


def interquartile_mean(times) -> float:
    """Mean of the middle half: the typical cost of a call that sometimes waits, without its tails."""
    t = np.sort(np.asarray(times, float))
    q = len(t) // 4
    return float(t[q:len(t) - q].mean())


def _slowest(times: list[float]) -> list[float]:
    """Each repetition's time on the slowest rank of the group."""
    t = comm_tensor(times, torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _best(fn, repeats: int, together: bool = False, device="cpu") -> float:
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
        times = _slowest(times)
    return fastest_quartile(times)


def pingpong(sizes_bytes: list[int], repeats: int) -> list[dict]:
    rank = dist.get_rank()
    comm = torch.device(current().comm)
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
    place = current()
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


def _layer_fn(L: dict, batch: int, frac_d: float, input_grad: bool = True, device="cpu"):
    """The forward of layer L on a slab with frac_d of its depth, run as the model runs it.

    Conv: the halo window (the slab plus its halo planes, built by concatenation; its backward
    scatters the gradient back), conv3d with bias and LeakyReLU; pool: window and max-pool; on the
    whole volume (fraction 1: one rank, or data parallel) the plain padded conv / pool, as those run;
    dense: linear with bias (+ LeakyReLU). On one rank the halo planes are the zero padding of
    the slab's edges, the same planes a middle rank receives, so the copies are the same.
    `input_grad` is False for the network's first layer: training needs no gradient of the data.
    Every tensor is on `device`, the rank's compute device.
    Returns (forward closure returning the output, units, depth fraction actually timed).
    """
    if L["kind"] == "dense":
        x = torch.randn(batch, L["fin"], requires_grad=True, device=device)
        w = torch.randn(L["fout"], L["fin"], requires_grad=True, device=device)
        b = torch.randn(L["fout"], requires_grad=True, device=device)

        def fwd():
            y = F.linear(x, w, b)
            return F.leaky_relu(y, LEAK) if L.get("act") else y
        return fwd, flops(L) * batch, 1.0
    c, d, h, w_ = L["in"]
    k, s = L["kernel"], L["stride"]
    d_loc = max(k, int(round(d * frac_d)))
    if L["kind"] == "pool":
        d_loc = max(s, d_loc // s * s)  # a slab of whole pooling windows, as the study's splits are
    plans = (plan_axis((d_loc,), k, s, L["pad"], L["name"]), None)
    layout = single_layout()
    x = torch.randn(batch, c, d_loc, h, w_, requires_grad=input_grad, device=device)
    if L["kind"] == "conv":
        wt = torch.randn(L["cout"], c, k, k, k, requires_grad=True, device=device)
        bias = torch.randn(L["cout"], requires_grad=True, device=device)

        if d_loc == d:  # the whole volume: a run with no spatial split runs the plain conv (no window)
            def fwd():
                return F.leaky_relu(F.conv3d(x, wt, bias, stride=s, padding=L["pad"]), LEAK)
        else:
            def fwd():
                return F.leaky_relu(partitioned_conv3d(x, wt, bias, s, L["pad"], plans, layout, tag=0), LEAK)
    elif d_loc == d:
        def fwd():
            return F.max_pool3d(x, k, s)
    else:
        def fwd():
            return F.max_pool3d(window(x, plans, layout, 0), k, s)
    return fwd, flops(L) * batch * d_loc / d, d_loc / d


def activation_bytes(spec: list[dict], batch: int) -> int:
    """Bytes of the activations one training step writes in the forward and reads back in the backward."""
    return sum(_nbytes(L, batch, 1.0) for L in spec)


def _best_fwd_bwd(fwd, evict: torch.Tensor | None, repeats: int, together: bool = False,
                  device="cpu") -> float:
    """Fastest quartile of forward + backward seconds, with `evict` rewritten (untimed) in between.

    In a training step the rest of the network's activations pass through the caches between a
    layer's forward and its backward, so the backward reads what the forward saved from further
    away than a layer timed alone would: `evict` is that traffic. The output's gradient is a
    dense tensor, just written, as the next layer's backward hands it over. `together`, `device`:
    as `_best`.
    """
    grad = torch.randn_like(fwd())
    times = []
    for i in range(repeats + 1):
        if together:
            dist.barrier()
        t0 = now(device)
        y = fwd()
        t1 = now(device)
        if evict is not None:
            evict.add_(1.0)
        grad.mul_(1.0)
        t2 = now(device)
        y.backward(grad)
        t3 = now(device)
        if i:  # the first is a warm-up: allocator, kernels
            times.append((t1 - t0) + (t3 - t2))
    if together:
        times = _slowest(times)
    return fastest_quartile(times)


def _nbytes(L: dict, batch: int, frac: float) -> int:
    """Bytes of layer L's own activations on the slab (they are what its timing keeps warm)."""
    if L["kind"] not in ("conv", "pool"):
        return 0
    return int(numel(L["out"]) * (2 if L["kind"] == "conv" else 1) * batch * 4 * frac)


def _touch_fresh(nbytes: int) -> None:
    """Map, first-touch (one byte a page) and unmap anonymous memory: the page faults, zeroing and
    unmapping a large tensor costs when the allocator takes fresh pages from the OS for it."""
    m = mmap.mmap(-1, nbytes)
    a = np.frombuffer(m, dtype=np.uint8)
    a[::mmap.PAGESIZE] = 1
    del a
    m.close()


def _warm_allocator(nbytes: int) -> None:
    """Allocate and free one large block so glibc's adaptive mmap/trim thresholds rise above the
    step's tensors: the layer timings then carry no page faults (those are timed on their own)."""
    torch.empty(max(1, min(nbytes, 32 * 2 ** 20) // 4)).fill_(0.0)


def _param_shapes(spec: list[dict]) -> list[tuple[int, ...]]:
    shapes = []
    for L in spec:
        if L["kind"] == "conv":
            shapes += [(L["cout"], L["cin"], L["kernel"], L["kernel"], L["kernel"]), (L["cout"],)]
        elif L["kind"] == "dense":
            shapes += [(L["fout"], L["fin"]), (L["fout"],)]
    return shapes


def optimizer_step_fn(shapes: list[tuple[int, ...]], device="cpu"):
    """zero_grad + Adam step over parameters of the model's own shapes (per-tensor costs included)."""
    params = [torch.nn.Parameter(torch.randn(s, device=device)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=device)
    opt = torch.optim.Adam(params, lr=1e-3)

    def fn():
        opt.zero_grad(set_to_none=False)
        opt.step()
    return fn, sum(p.numel() for p in params)


def compute_timings(specs: list[tuple[list[dict], int]], fractions: list[float], repeats: int,
                    together: bool = False, device="cpu") -> list[dict]:
    """Every conv/pool/dense layer of the specs at each slab fraction, and the optimizer step, on
    `device` (the fresh pages' cost is the host's: glibc's heap).

    With `together` every rank of the group must call this with the same arguments.
    """
    concurrent = dist.get_world_size() if together else 1
    rows = []
    _warm_allocator(2 * max(activation_bytes(spec, batch) for spec, batch in specs))
    evict = torch.zeros(max(activation_bytes(spec, batch) for spec, batch in specs) // 4, device=device)
    for spec, batch in specs:
        for L in spec:
            if L["kind"] not in ("conv", "pool", "dense"):
                continue
            for frac in (fractions if L["kind"] != "dense" else [1.0]):
                fwd, units, got = _layer_fn(L, batch, frac, input_grad=L is not spec[0], device=device)
                # the step's other activations, on a slab of the same fraction
                n = max(0, int(activation_bytes(spec, batch) * got) - _nbytes(L, batch, got)) // 4
                t = _best_fwd_bwd(fwd, evict[:n] if n else None, repeats, together, device)
                rows.append({"kind": L["kind"], "layer": L["name"], "key": layer_key(L), "batch": batch,
                             "fraction": frac, "concurrent": concurrent, "units": units, "time_s": t})
    sizes = {int(fresh_bytes(spec, batch)) for spec, batch in specs}
    for nbytes in sorted(sizes | {4 * max(sizes)}):
        n = max(mmap.PAGESIZE, nbytes)
        rows.append({"kind": "fault", "units": n, "concurrent": concurrent,
                     "time_s": _best(functools.partial(_touch_fresh, n), repeats, together)})
    shape_sets = [_param_shapes(spec) for spec, _ in specs]
    shape_sets.append([s for shapes in shape_sets for s in shapes] * 2)  # a larger model
    for shapes in shape_sets:
        fn, n = optimizer_step_fn(shapes, device)
        rows.append({"kind": "optimizer", "units": n, "concurrent": concurrent,
                     "time_s": _best(fn, repeats, together, device)})
    return rows


def _read_to(reader: SlabReader, idx, n_d: int, device: torch.device):
    """A slab read as a training step reads it: onto the GPU where the ranks compute on one."""
    block = reader.read(idx, slice(0, n_d), slice(None))
    if device.type == "cuda":
        return torch.from_numpy(block[0]).to(device), torch.from_numpy(block[1]).to(device)
    return block


def io_timings(data_dir: str, batch: int, fractions: list[float], repeats: int, device="cpu") -> list[dict]:
    reader = SlabReader(data_dir)
    device = torch.device(device)
    d = reader.shape[0]
    rows = []
    for frac in fractions:
        n_d = max(1, int(round(d * frac)))
        idx = np.arange(min(batch, len(reader)))
        t = _best(lambda idx=idx, n_d=n_d: _read_to(reader, idx, n_d, device), repeats, device=device)
        nbytes = len(idx) * n_d * reader.shape[1] * reader.shape[2] * 4
        rows.append({"kind": "io", "units": nbytes, "batch": len(idx), "time_s": t})
    return rows


def _section(fn, world: int) -> tuple[list[dict], dict]:
    """Run one calibration section on every rank; returns rank 0's rows and {"other_cpu_s",
    "section_s"}: the CPU seconds other processes took meanwhile (machine busy + steal - every
    rank's own CPU, hpcdl.studies.spatial.load) and the section's wall seconds."""
    if world > 1:
        dist.barrier()
    probe = PhaseLoad()
    probe.start()
    rows = fn()
    if world > 1:
        dist.barrier()
    got = probe.stop()
    own = comm_tensor([got["own_cpu_s"]], torch.float64)
    if world > 1:
        dist.all_reduce(own)
    other = other_load_cores(got["machine_busy_s"], got["steal_s"], float(own), got["wall_s"]) * got["wall_s"]
    return rows, {"other_cpu_s": other, "section_s": got["wall_s"]}


def calibrate_rank(specs: list[tuple[list[dict], int]], data_dir: str, sizes_bytes: list[int],
                   fractions: list[float], repeats: int, comm_gap_s: float = 0.0) -> list[dict]:
    """Every rank joins the ping-pong and collectives; rank 0 alone times compute and I/O while the
    others wait (`concurrent` 1), then every rank times the same compute at once (`concurrent` =
    ranks: the contended rate of runs that keep several cores busy). Each row carries its section's
    `other_cpu_s` (CPU seconds taken from outside the run) and `section_s` (wall seconds), and where
    it was measured (`device`, `placement`)."""
    torch.set_default_dtype(torch.float32)
    world, rank = dist.get_world_size(), dist.get_rank()
    place = current()
    dev = torch.device(place.compute)
    sections = []
    if world > 1:
        sections.append(lambda: (pingpong(sizes_bytes, repeats)
                                 + collectives(sizes_bytes, repeats, comm_gap_s)))
    sections.append(lambda: (compute_timings(specs, fractions, repeats, device=dev)
                             + io_timings(data_dir, max(b for _, b in specs), fractions, repeats, dev))
                    if rank == 0 else [])
    if world > 1:
        sections.append(lambda: compute_timings(specs, fractions, repeats, together=True, device=dev))
    rows = []
    for fn in sections:
        got, load = _section(fn, world)
        rows += [{**r, **load, **where(place)} for r in got]
    return rows if rank == 0 else []
