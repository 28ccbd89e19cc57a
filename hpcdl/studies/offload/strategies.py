"""What each offload strategy builds (train.py runs them): the strategies and what they offload, the
slow tier they offload to (`slow_tier`) and their optimizer (`optimizer_for`)."""

from __future__ import annotations

import torch

from hpcdl.studies.offload.accounting import FastTier
from hpcdl.studies.offload.optimizer import OffloadedAdam
from hpcdl.studies.offload.precision import MasterAdam
from hpcdl.studies.offload.runspec import RunSpec
from hpcdl.studies.offload.slowtier import FileTier, PinnedTier
from hpcdl.studies.offload.timeline import Timeline
from hpcdl.studies.offload.zero import ZeroOffloadAdam

STRATEGIES = ("none", "optimizer", "activations", "both", "save_on_cpu", "zero_offload")
OFFLOADS_OPTIMIZER = {"optimizer", "both"}
OFFLOADS_ACTIVATIONS = {"activations", "both"}
NEEDS_TIER = OFFLOADS_OPTIMIZER | OFFLOADS_ACTIVATIONS | {"zero_offload"}


def slow_tier(spec: RunSpec, timeline: Timeline, device: str):
    """The slow tier the strategies offload to: pinned host memory under CUDA, files on the CPU."""
    return (
        PinnedTier(timeline, torch.device(device))
        if device == "cuda"
        else FileTier(spec.slow_dir, timeline, spec.io_mode)
    )


def optimizer_for(spec: RunSpec, params, tier, fast: FastTier, timeline: Timeline, dtype, scale: float):
    """The strategy's optimizer: offloaded (optimizer, both), ZeRO-Offload's, or in the fast tier."""
    # both slow-tier optimizers stream the same buckets through the same tier and registry
    streamed = (params, tier, fast, timeline, int(spec.bucket_mb * 2**20), spec.lr)
    if spec.strategy in OFFLOADS_OPTIMIZER:
        return OffloadedAdam(*streamed, foreach=spec.foreach, fused=spec.fused,
                             in_backward=spec.optimizer_in_backward, staging_sets=spec.staging_sets,
                             loss_scale=scale)
    if spec.strategy == "zero_offload":
        return ZeroOffloadAdam(*streamed, host_adam=spec.host_adam, loss_scale=scale,
                               grad_window=spec.grad_window)
    if dtype != torch.float32:  # mixed precision: fp32 masters and moments in the fast tier
        return MasterAdam(params, fast, spec.lr, foreach=spec.foreach, fused=spec.fused, loss_scale=scale)
    return torch.optim.Adam(
        params, lr=spec.lr, foreach=False if spec.fused else spec.foreach, fused=spec.fused
    )
