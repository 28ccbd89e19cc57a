"""Hybrid data x spatial training of the CosmoFlow-like model: the function every rank runs.

World = n_data data groups x (pd x ph) spatial ranks. Each data group takes its share of
the global batch; each spatial rank reads only its slab of those samples. Gradients of the
convolutions are summed over the spatial group (each rank saw part of the volume), then
every gradient is averaged over the data group. Per iteration we time I/O, halo exchange,
the gather to the head, the gradient all-reduce, and the rest (compute).

The model, the batch and every activation, halo and gradient live on the rank's compute device
(hpcdl.platform.kit.rank_runtime.placement: its GPU under CUDA). On a GPU each phase boundary waits for
the compute stream (devices.now), so I/O includes the copy to the GPU and compute its kernels; the
halo and gather times are read on the stream's own timeline (halo.CommTimers).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hpcdl.common.layers import build_spec
from hpcdl.platform import current_placement
from hpcdl.studies.spatial.buckets import GradBuckets
from hpcdl.studies.spatial.data import SlabReader
from hpcdl.studies.spatial.devices import now, run_label, to_comm, where
from hpcdl.studies.spatial.groups import hybrid_groups
from hpcdl.studies.spatial.halo import TIMERS
from hpcdl.studies.spatial.load import PhaseLoad
from hpcdl.studies.spatial.model import CosmoFlow, SpatialCosmoFlow

# the rank launcher imports these once before forking the ranks (rank_runtime.forked): an optimizer's
# constructor imports torch._dynamo (about 1 s of CPU), which each rank would otherwise repeat
RANK_PRELOAD = ("torch._dynamo",)

def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _ceiling_head_input(feats: torch.Tensor, full_depth: int) -> torch.Tensor:
    """This slab's features tiled along depth to the whole map's size: the replicated head's input
    without the all-gather (a ceiling run's copy, no communication)."""
    reps = -(-full_depth // feats.shape[2])
    return feats.repeat(1, 1, reps, 1, 1).narrow(2, 0, full_depth)


@dataclass
class _Rank:
    """One rank of a training run: its model on its slab, its optimizer, and how its gradients are reduced."""

    dev: torch.device
    hy: object                     # groups.hybrid_groups: this rank's data index and spatial layout
    reader: SlabReader
    net: CosmoFlow
    sp: SpatialCosmoFlow
    slab: tuple[slice, slice]      # this rank's depth and height slices of the volume
    conv_params: list
    other_params: list
    buckets: GradBuckets | None    # the all-reduce during the backward (overlap), else None
    opt: torch.optim.Optimizer
    communicate: bool
    n_data: int
    slab_net: CosmoFlow | None = None  # a ceiling run's convs on the slab alone
    full_depth: int = 0                # a ceiling run's head input depth


def _build(data_dir: str, n_data: int, grid: tuple[int, int], model: dict, lr: float, seed: int,
           allow_uneven: bool, overlap: bool, bucket_kb: float, communicate: bool) -> _Rank:
    """The rank's model (seeded), its slab, gradient plan and optimizer, on its compute device."""
    dev = torch.device(current_placement().compute)
    hy = hybrid_groups(n_data, tuple(grid))
    reader = SlabReader(data_dir)
    torch.manual_seed(seed)
    net = CosmoFlow(build_spec(reader.shape, model)).to(dev)
    sp = SpatialCosmoFlow(net, hy.layout, allow_uneven=allow_uneven, overlap=overlap)
    ds, hs = sp.slab()
    conv_params = sp.conv_parameters()
    conv_ids = {id(p) for p in conv_params}
    other_params = [p for p in net.parameters() if id(p) not in conv_ids]
    world = dist.get_world_size()
    # conv gradients: summed over the spatial group (each rank saw part of the volume) and averaged
    # over the data groups = the world's sum / n_data; the replicated head: averaged over data groups
    plan = [(other_params[::-1], hy.data_group, 1.0 / n_data, n_data),
            (conv_params[::-1], None, 1.0 / n_data, world)]
    buckets = GradBuckets(plan, int(bucket_kb * 1024)) if communicate and overlap else None
    slab_net, full_depth = None, 0
    if not communicate:
        slab_net = CosmoFlow(build_spec((ds.stop - ds.start, hs.stop - hs.start, reader.shape[2]), model))
        slab_net.convs = net.convs  # the same parameters, run on the slab alone (zero-padded edges)
        full_depth = net.spec[[s["kind"] for s in net.spec].index("gather")]["in"][1]
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    return _Rank(dev, hy, reader, net, sp, (ds, hs), conv_params, other_params, buckets, opt, communicate,
                 n_data, slab_net, full_depth)


def _iteration(r: _Rank, it: int, idx: np.ndarray, probe: PhaseLoad, together: bool = False) -> dict:
    """One timed training step on the samples `idx`: its record (loss, phase times, CPU load).
    Every rank starts a communicating step at once; a ceiling step too where `together`."""
    dev, hy, n_data = r.dev, r.hy, r.n_data
    if dist.get_world_size() > 1 and (r.communicate or together):
        dist.barrier()
    TIMERS.reset()
    probe.start()
    t0 = now(dev)
    xb, yb = r.reader.read(idx, *r.slab)
    x = torch.from_numpy(xb).to(device=dev, dtype=torch.get_default_dtype())
    y = torch.from_numpy(yb).to(device=dev, dtype=torch.get_default_dtype())
    t_io = now(dev) - t0
    r.opt.zero_grad(set_to_none=False)
    if r.buckets is not None:
        r.buckets.start()
    if r.communicate:
        out = r.sp(x)
    else:
        out = r.net.head(_ceiling_head_input(r.slab_net.features(x), r.full_depth))
    loss = nn.functional.mse_loss(out, y)
    loss.backward()
    t1 = now(dev)
    if r.buckets is not None:
        t_ar = r.buckets.finish()
    elif r.communicate:
        _allreduce([p.grad for p in r.conv_params], hy.layout.group, hy.layout.size, 1.0)
        _allreduce([p.grad for p in r.conv_params + r.other_params], hy.data_group, n_data, 1.0 / n_data)
        t_ar = now(dev) - t1
    else:
        t_ar = 0.0
    r.opt.step()
    total = now(dev) - t0
    load = probe.stop()
    TIMERS.settle()  # the GPU's halo and gather spans, ended by now
    comm = TIMERS.seconds["halo"] + TIMERS.seconds["gather"]
    return {"iteration": it, "loss": float(loss.item()), "io_s": t_io,
            "halo_s": TIMERS.seconds["halo"], "gather_s": TIMERS.seconds["gather"],
            "allreduce_s": t_ar, "compute_s": max(total - t_io - comm - t_ar, 0.0),
            "total_s": total, "cpu_s": load["own_cpu_s"],
            "machine_busy_s": load["machine_busy_s"], "steal_s": load["steal_s"]}


def train_run(data_dir: str, n_data: int, grid: tuple[int, int], model: dict, batch_size: int,
              iterations: int, lr: float, seed: int, dtype: str = "float32",
              allow_uneven: bool = True, overlap: bool = True, bucket_kb: float = 64.0,
              communicate: bool = True, paired_ceiling: bool = False, alone_steps: int = 1) -> dict:
    """Train for `iterations` steps; returns this rank's per-iteration records and memory.

    `overlap`: halo exchanges hidden behind the slab's convs, gradient all-reduce in buckets
    of `bucket_kb` during the backward (hpcdl.studies.spatial.overlap, hpcdl.studies.spatial.buckets); False
    runs every exchange and the all-reduce blocking, after the backward.
    `communicate` False is the ceiling run: every rank does its share of the spatial run's
    compute (its slab's convs, the replicated head, the optimizer) as an independent process,
    with no exchange, gather or all-reduce at all.
    `paired_ceiling` also measures that ceiling in this launch, step by step, so that a slow spell
    of the host lands on both sides of the efficiency's ratio (docs/studies/spatial.md): the spatial
    run takes `alone_steps` steps alone (its warm-up; its peak memory is read then, before the
    ceiling's model exists), the ceiling as many alone (its warm-up), then the two alternate, which
    goes first swapping every iteration, each step begun by every rank at once. The ceiling's
    records come back as `ceiling_records`, its peak memory (the spatial model's included) as
    `ceiling_peak_rss_mb`.
    Every record carries this rank's CPU seconds and the machine's busy/stolen CPU seconds over
    the iteration (hpcdl.studies.spatial.load), so the analysis can tell a disturbed phase.
    """
    torch.set_default_dtype(getattr(torch, dtype))
    place = current_placement()
    if batch_size % n_data:
        raise ValueError(f"spatial: global batch {batch_size} is not divisible by {n_data} data groups")
    if paired_ceiling and (not communicate or n_data != 1):
        raise ValueError("spatial: a paired ceiling belongs to a communicating spatial-only run "
                         f"(communicate={communicate}, {n_data} data groups)")
    r = _build(data_dir, n_data, grid, model, lr, seed, allow_uneven, overlap, bucket_kb, communicate)
    order = np.random.default_rng(seed).permutation(len(r.reader))
    local = batch_size // n_data

    def batch(it: int) -> np.ndarray:
        start = (it * batch_size) % len(r.reader)
        idx = np.take(order, range(start, start + batch_size), mode="wrap")
        return idx[r.hy.data_index * local:(r.hy.data_index + 1) * local]

    base = rss_mb()
    probe = PhaseLoad()
    if dist.get_world_size() > 1:
        dist.barrier()
    alone = min(max(alone_steps, 1), iterations) if paired_ceiling else iterations
    records = [_iteration(r, it, batch(it), probe) for it in range(alone)]
    peak = rss_mb()
    gpu = {"gpu_peak_mb": torch.cuda.max_memory_allocated(r.dev) / 2 ** 20} if r.dev.type == "cuda" else {}
    ceiling = {}
    if paired_ceiling:
        c = _build(data_dir, n_data, grid, model, lr, seed, allow_uneven, overlap, bucket_kb, False)
        ceiling_records = [_iteration(c, it, batch(it), probe, together=True) for it in range(alone)]
        for it in range(alone, iterations):
            pair = ((r, records), (c, ceiling_records))
            for run, out in pair if it % 2 == 0 else pair[::-1]:
                out.append(_iteration(run, it, batch(it), probe, together=True))
        ceiling = {"ceiling_records": ceiling_records, "ceiling_peak_rss_mb": rss_mb()}
    ds, hs = r.slab
    return {"rank": dist.get_rank(), "data_index": r.hy.data_index, "spatial_coords": r.hy.layout.coords,
            "slab_depth": ds.stop - ds.start, "slab_height": hs.stop - hs.start,
            "peak_rss_mb": peak, "base_rss_mb": base, "records": records,
            "n_params": sum(p.numel() for p in r.net.parameters()), **where(place),
            "run_placement": run_label(place), "backend": str(dist.get_backend()), **gpu, **ceiling}


def _allreduce(tensors: list[torch.Tensor], group, size: int, scale: float) -> None:
    """Blocking, after the backward: one flat bucket per call."""
    if size == 1:
        if scale != 1.0:
            for t in tensors:
                t.mul_(scale)
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    sent = to_comm(flat)  # staged through the host where ranks share a GPU
    dist.all_reduce(sent, group=group)
    if sent is not flat:
        flat.copy_(sent)
    flat.mul_(scale)
    off = 0
    for t in tensors:
        t.copy_(flat[off:off + t.numel()].view_as(t))
        off += t.numel()
