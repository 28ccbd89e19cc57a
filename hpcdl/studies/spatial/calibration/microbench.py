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

This module runs the sections on every rank (`calibrate_rank`) and times the I/O; the
communication microbenchmarks are comm_timings', the compute ones compute_timings', and how
repeated timings become one number timing's.

Everything runs where the study's ranks run (hpcdl.platform.kit.rank_runtime.placement): the layers on
the rank's compute device, the collectives' buffers on its comm device. On a GPU each timing waits
for the compute stream at both ends (devices.now), and I/O includes the copy to the GPU, as a
training step's does. (Fitting the oracle to a GPU at paper scale is another matter: #26.)
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from hpcdl.platform import current_placement
from hpcdl.studies.spatial.calibration.comm_timings import collectives, pingpong
from hpcdl.studies.spatial.calibration.compute_timings import compute_timings
from hpcdl.studies.spatial.calibration.timing import best
from hpcdl.studies.spatial.data import SlabReader
from hpcdl.studies.spatial.devices import comm_tensor, where
from hpcdl.studies.spatial.load import PhaseLoad, other_load_cores


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
        t = best(lambda idx=idx, n_d=n_d: _read_to(reader, idx, n_d, device), repeats, device=device)
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
    place = current_placement()
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
