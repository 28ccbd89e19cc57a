"""The one training run's settings (`RunSpec`): a sweep or capacity point (sweep.py) as train.py takes it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunSpec:
    strategy: str
    width: int
    depth: int
    batch: int
    steps: int
    seed: int = 0
    lr: float = 1e-3
    device: str = "cpu"
    slow_dir: str = "."
    io_mode: str = "page_cache"
    bucket_mb: float = 1.0
    prefetch_depth: int = 2
    write_window: int = 2
    budget_mb: float | None = None
    foreach: bool = True
    fused: bool = False
    optimizer_in_backward: bool = True
    staging_sets: int = 3
    warmup_steps: int = 1
    rss_interval_s: float = 0.002
    trim_heap: bool = True  # gc + malloc_trim first, so that peak RSS starts from a clean heap
    copy_cores: int = 0  # CPU: cores of the task kept for the slow tier's copy threads (compute_threads)
    precision: str = "fp32"  # fp32 | bf16 | fp16 (precision.py)
    loss_scale: float = 65536.0  # fp16 only: the static loss scale (a power of two)
    host_adam: str = "fused"  # zero_offload: torch's CPU Adam on the host (fused | foreach | forloop)
    grad_window: int = 2  # zero_offload on CPU: gradient buckets whose copy to the host may be in flight
