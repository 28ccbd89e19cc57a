"""Where a spatial rank's tensors live, and how a phase on them is timed.

A rank's placement (hpcdl.platform.kit.rank_runtime.placement.current()) puts its model, activations,
halos and gradients on `compute` and the tensors its collectives and send/recv move on `comm`: the
same GPU over NCCL; the host over gloo, for CPU runs and for GPUs shared by several ranks (NCCL
refuses two ranks on one GPU), where halos and gradients are staged through host memory. The backend
follows the tensors' device, never the host, so a CPU tensor never reaches NCCL (`comm_device`).

On the CPU every helper here is the identity (no copy, no synchronisation): a CPU run does exactly
what it did before devices existed. CUDA kernels run asynchronously, so a phase on the GPU is timed
after a synchronisation (`now`) or on the device's own timeline (CUDA events, halo.CommTimers),
never by the host clock alone.
"""

from __future__ import annotations

import time

import torch

from hpcdl.platform import Placement, current_placement


def comm_device(compute: torch.device, place: Placement) -> torch.device:
    """Where tensors computed on `compute` travel: where they are on the CPU; on a GPU, the placement's
    comm device (that GPU over NCCL, the host over gloo)."""
    if compute.type != "cuda":
        return compute
    return torch.device(place.comm)


def comm_for(t: torch.Tensor) -> torch.device:
    return comm_device(t.device, current_placement()) if t.is_cuda else t.device


def to_comm(t: torch.Tensor) -> torch.Tensor:
    """`t` on the device its collective runs on: `t` itself unless it must be staged to the host.
    The copy to the host is synchronous, so the buffer is complete when gloo reads it."""
    where = comm_for(t)
    return t if t.device == where else t.to(where)


def comm_tensor(values, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small tensor of `values` (a timing, a count) to reduce or broadcast over this rank's group."""
    return torch.tensor(values, dtype=dtype, device=current_placement().comm)


def synchronize(device) -> None:
    """Wait for what is queued on a GPU's compute stream (its current stream); nothing on the CPU.

    Not the whole device: a collective still in flight on NCCL's own stream (a bucket's all-reduce
    under the backward) stays in flight; it joins the compute stream where its work is waited for.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def now(device) -> float:
    """The host clock once `device` has finished what was queued on it: a phase timed between two
    calls is the phase's work, not the time to queue it."""
    synchronize(device)
    return time.perf_counter()


def run_label(place: Placement) -> str:
    """Where a launch's ranks ran, the same for each of them (the rank's device index left out)."""
    if place.device == "cpu":
        return "cpu (gloo)"
    if place.shared:
        return "cuda (shared GPU, gloo via host memory)"
    return "cuda (one GPU per rank, nccl)"


def where(place: Placement) -> dict:
    """The columns a rank's rows carry: the device and this rank's placement (e.g. "cuda:1 (nccl)")."""
    return {"device": place.device, "placement": place.label}
