"""One training run under one offload strategy, measured: the study's unit of work.

    none          everything in the fast tier; torch.optim.Adam (the library baseline)
    optimizer     master weights + Adam moments in the slow tier, streamed in buckets (optimizer.py)
    activations   saved activations packed to the slow tier, prefetched for backward (activations.py)
    both          optimizer + activations
    save_on_cpu   CUDA only: torch.autograd.graph.save_on_cpu(pin_memory=True), the library's
                  activation offload, with torch.optim.Adam
    zero_offload  ZeRO-Offload: parameters and gradients in the training precision in the fast tier,
                  fp32 master weights, Adam's moments and the step on the host (zero.py)

Every strategy trains at `precision` (precision.py): fp32 as always, or bf16 / fp16 with fp32 master
weights and moments wherever the strategy keeps them (`none`: MasterAdam, in the fast tier), so that
each is compared with `none` at its own precision.

Per step the timeline (timeline.py) holds the forward / backward / optimizer phases, every
transfer and every wait; the record gives the median step's phases, and the hidden fraction
pooled over every measured step.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import os
import threading
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hpcdl.platform import resolved_device
from hpcdl.studies.offload.accounting import BudgetExceeded, FastTier
from hpcdl.studies.offload.activations import SavedActivations
from hpcdl.studies.offload.checks import largest_tensor
from hpcdl.studies.offload.model import build_mlp, make_batch, n_params
from hpcdl.studies.offload.optimizer import OffloadedAdam
from hpcdl.studies.offload.precision import (
    MasterAdam,
    check_finite,
    dtype_of,
    format_sample,
    gather,
    loss_scale_of,
    sample_positions,
)
from hpcdl.studies.offload.slowtier import FileTier, PinnedTier
from hpcdl.studies.offload.timeline import CpuClock, CudaClock, Timeline
from hpcdl.studies.offload.zero import ZeroOffloadAdam

STRATEGIES = ("none", "optimizer", "activations", "both", "save_on_cpu", "zero_offload")
OFFLOADS_OPTIMIZER = {"optimizer", "both"}
OFFLOADS_ACTIVATIONS = {"activations", "both"}
NEEDS_TIER = OFFLOADS_OPTIMIZER | OFFLOADS_ACTIVATIONS | {"zero_offload"}
MEASURED_BY = {True: "torch.cuda.max_memory_allocated", False: "anonymous RSS high-water mark"}


def resolve_device(device: str) -> str:
    """The block's `device`, resolved by the platform's one device mechanism (hpcdl.platform.kit.device)."""
    return resolved_device(device, "offload.device")


def tier_name(device: str) -> str:
    return "gpu>pinned_host" if device == "cuda" else "ram>file"


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


def rss_bytes() -> int:
    """The process's anonymous resident bytes now (resident - file-backed/shared, Linux /proc; no psutil,
    so the GPU probe needs only torch). Library code paged in on first use is file-backed and not
    memory the training holds, so it is left out; heap, tensors, thread stacks and arenas count."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * _PAGE


_PAGE = os.sysconf("SC_PAGE_SIZE")


class _PeakRss:
    """The process's resident set sampled on a thread, for the peak during a run."""

    def __init__(self, interval_s: float):
        self.interval = interval_s
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.interval)

    def restart(self) -> None:
        self.peak = rss_bytes()

    def now(self) -> int:
        """The peak so far, this instant included (a step's end: no sample can miss what it holds)."""
        self.peak = max(self.peak, rss_bytes())
        return self.peak

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        return False


_WARM = []


def _warm_process() -> None:
    """One Adam step on a 4-element tensor, once per process: torch.optim's first step imports modules
    (tens of MiB of Python objects) that would otherwise count as the memory of whichever run is first
    in a worker process."""
    if not _WARM:
        p = torch.nn.Parameter(torch.zeros(4))
        opt = torch.optim.Adam([p])
        p.sum().backward()
        opt.step()
        _WARM.append(True)


def _trim_heap() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def weights_digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():  # as bytes (numpy has no bfloat16); fp32 digests are as before
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def compute_threads(available: int, copy_cores: int, cuda: bool) -> int:
    """Intra-op threads the training runs on. On CPU `copy_cores` of the task's cores are left to the
    slow tier's copy threads, as a GPU's copies run on its copy engines, not on its SMs: compute
    threads on every core would make each copy wait for a time slice, and the hidden fraction would
    measure the OS scheduler's choices (0.11-0.92 between steps of one run on 2 cores), not overlap."""
    if cuda or copy_cores <= 0:
        return available
    return max(1, available - copy_cores)


def train(spec: RunSpec, keep_weights: bool = False) -> tuple:
    """`_train` on `compute_threads` intra-op threads (restored after); the record names them."""
    before = torch.get_num_threads()
    threads = compute_threads(before, spec.copy_cores, resolve_device(spec.device) == "cuda")
    torch.set_num_threads(threads)
    try:
        return _train(spec, keep_weights)
    finally:
        torch.set_num_threads(before)


def _train(spec: RunSpec, keep_weights: bool = False) -> tuple:
    """Train `spec.steps` steps (the first `warmup_steps` unmeasured); the measured record.

    The fast tier's peak is measured: CUDA, torch.cuda.max_memory_allocated above the model-free
    baseline; CPU, the process's anonymous RSS high-water mark above the run's start (sampled every
    rss_interval_s and at each step's end). The tensor registry (accounting.FastTier) is kept beside it
    as a cross-check (`peak_accounted_bytes`). Raises BudgetExceeded when the measured peak goes over
    spec.budget_mb (checked after each step); on CPU the registry also stops a run early when the
    tensors it accounts alone exceed the budget.
    """
    if spec.strategy not in STRATEGIES:
        raise ValueError(f"unknown offload strategy {spec.strategy!r}; known: {STRATEGIES}")
    device = resolve_device(spec.device)
    cuda = device == "cuda"
    if spec.strategy == "save_on_cpu" and not cuda:
        raise ValueError(
            "strategy 'save_on_cpu' needs CUDA (on CPU the saved tensors are already on the CPU)"
        )
    dtype = dtype_of(spec.precision)
    scale = loss_scale_of(spec.precision, spec.loss_scale)
    budget = None if spec.budget_mb is None else int(spec.budget_mb * 2**20)
    _warm_process()
    if spec.trim_heap:
        _trim_heap()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        cuda_base = torch.cuda.memory_allocated()
    # the measured peak is the enforced fast-tier measure; on CPU the registry (a lower bound: it
    # misses kernel temporaries and allocator slack) also aborts early a run that cannot fit
    fast = FastTier(None if cuda else budget)
    timeline = Timeline(CudaClock(torch) if cuda else CpuClock())
    tier = None
    rss0 = rss_bytes()
    with _PeakRss(spec.rss_interval_s) as rss:
        fast.check_single(*largest_tensor({"model": {"width": spec.width, "batch": spec.batch}}))
        model = build_mlp(spec.width, spec.depth, spec.seed, device).to(dtype)
        params = list(model.parameters())
        positions = sample_positions(params)

        def charge_grad(p):  # a new gradient tensor each step (zero_grad sets them to None)
            fast.track(p.grad, "gradients")

        for p in params:
            fast.track(p, "parameters")
            p.register_post_accumulate_grad_hook(charge_grad)
        opt = None
        try:
            if spec.strategy in NEEDS_TIER:
                tier = (
                    PinnedTier(timeline, torch.device(device))
                    if cuda
                    else FileTier(spec.slow_dir, timeline, spec.io_mode)
                )
            if spec.strategy in OFFLOADS_OPTIMIZER:
                opt = OffloadedAdam(
                    params,
                    tier,
                    fast,
                    timeline,
                    int(spec.bucket_mb * 2**20),
                    spec.lr,
                    foreach=spec.foreach,
                    fused=spec.fused,
                    in_backward=spec.optimizer_in_backward,
                    staging_sets=spec.staging_sets,
                    loss_scale=scale,
                )
            elif spec.strategy == "zero_offload":
                opt = ZeroOffloadAdam(
                    params,
                    tier,
                    fast,
                    timeline,
                    int(spec.bucket_mb * 2**20),
                    spec.lr,
                    host_adam=spec.host_adam,
                    loss_scale=scale,
                    grad_window=spec.grad_window,
                )
            elif dtype != torch.float32:  # mixed precision: fp32 masters and moments in the fast tier
                opt = MasterAdam(params, fast, spec.lr, foreach=spec.foreach, fused=spec.fused,
                                 loss_scale=scale)
            else:
                opt = torch.optim.Adam(
                    params, lr=spec.lr, foreach=False if spec.fused else spec.foreach, fused=spec.fused
                )
            saved = SavedActivations(
                fast,
                params,
                tier if spec.strategy in OFFLOADS_ACTIVATIONS else None,
                offload=spec.strategy in OFFLOADS_ACTIVATIONS,
                prefetch_depth=spec.prefetch_depth,
                write_window=spec.write_window,
                device=device,
            )
            measured = []
            for step in range(spec.steps):
                if step == spec.warmup_steps and step > 0:
                    # the peak, like the times, is of the measured steps: a first step's one-off
                    # allocations (library workspaces, the allocator's first mappings) depend on what
                    # ran before in the process; what warm-up left resident still counts (above rss0)
                    rss.restart()
                    if cuda:
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                x, y = make_batch(spec.width, spec.batch, spec.seed, step, device)
                wall, log, loss = _one_step(model, opt, saved, timeline, x.to(dtype), y, spec.strategy, cuda,
                                            scale)
                if spec.precision == "fp16":
                    check_finite(loss, params, step, spec.precision, scale)
                if isinstance(opt, torch.optim.Adam) and step == 0:
                    for st in opt.state.values():  # created by the first step: charge them now
                        fast.track(st["exp_avg"], "optimizer_state")
                        fast.track(st["exp_avg_sq"], "optimizer_state")
                if budget is not None:
                    peak = torch.cuda.max_memory_allocated() - cuda_base if cuda else rss.now() - rss0
                    if peak > budget:
                        raise BudgetExceeded(
                            f"fast tier over budget: {MEASURED_BY[cuda]} {peak}"
                            f" bytes > offload.budget_mb = {budget} bytes"
                        )
                if step >= spec.warmup_steps:
                    measured.append((wall, log))
            # the fast tier's measured peak over the steps (what the budget was checked on); the
            # weights' flush and digest after them are not training (peak_rss_bytes covers them)
            peak_fast = torch.cuda.max_memory_allocated() - cuda_base if cuda else rss.now() - rss0
            timeline.stop()  # what follows belongs to no step
            if isinstance(opt, OffloadedAdam):
                opt.finish()
            if tier is not None:
                tier.sync()
            per_step = []
            for wall, log in measured:  # every copy a step issued has completed now
                log.resolve()
                per_step.append((_record(wall, log), log.rows()))
            digest = weights_digest(model)
            sample = format_sample(gather(params, positions))
            weights = [p.detach().cpu().clone() for p in params] if keep_weights else None
        finally:
            if hasattr(opt, "close"):
                opt.close()  # zero_offload: its host buffers live in the tier's run directory
            if tier is not None:
                tier.close()
    # the median step (by step time), whole: its phases add up to its step time
    med, tl_rows = (
        sorted(per_step, key=lambda r: r[0]["step_s"])[(len(per_step) - 1) // 2] if per_step else ({}, [])
    )
    n = n_params(spec.width, spec.depth)
    out = {
        "strategy": spec.strategy,
        "precision": spec.precision,
        "loss_scale": scale,
        "device": device,
        "tier": tier_name(device),
        "io_mode": spec.io_mode if not cuda else "pinned",
        "width": spec.width,
        "depth": spec.depth,
        "batch": spec.batch,
        "n_params": n,
        "steps": spec.steps,
        "measured_steps": len(per_step),
        "compute_threads": torch.get_num_threads(),  # in effect while it trained (train())
        # measured (what the claims judge); the registry's peak is the cross-check
        "peak_fast_bytes": peak_fast,
        "peak_measured_by": MEASURED_BY[cuda],
        "peak_accounted_bytes": fast.peak,
        **{f"peak_{k}_bytes": v for k, v in sorted(fast.peak_by_kind.items())},
        # the model's state in the fast tier (parameters, gradients, masters, optimizer state and
        # staging; no activations) at its peak, per parameter: e.g. 16 for none at fp32
        "fast_state_peak_bytes": fast.state_peak,
        "fast_bytes_per_param": fast.state_peak / n,
        "peak_rss_bytes": rss.peak,
        "peak_extra_rss_bytes": rss.peak - rss0,
        **{k: v for k, v in med.items() if k != "step"},
        "hidden_frac": _pooled_hidden_fraction([r for r, _ in per_step]),
        # each measured step's own fraction, for the claim's interval (space-separated; nan: no transfer)
        "hidden_frac_steps": " ".join(f"{r['hidden_frac']:.6f}" for r, _ in per_step),
        "weights_sha256": digest,
        # the final weights at SAMPLE fixed positions: what the claims compare within the tolerance of
        # tolerance.py where a strategy's update runs other kernels than none's (zero_offload)
        "weights_sample": sample,
    }
    return (out, tl_rows, weights) if keep_weights else (out, tl_rows)


def _pooled_hidden_fraction(records: list[dict]) -> float:
    """1 - exposed / transfer time summed over every measured step: one step holds a few dozen
    transfers, so its own fraction swings with one late copy; the pooled one is what a run hides."""
    total = sum(r["transfer_s"] for r in records)
    if not records or total <= 0:
        return float("nan")
    return min(1.0, max(0.0, 1.0 - sum(r["exposed_transfer_s"] for r in records) / total))


def _one_step(model, opt, saved, tl: Timeline, x, y, strategy, cuda, scale: float = 1.0):
    """One training step; its wall time, its timeline log (resolved later) and its loss. Below fp32
    the loss is computed in fp32 (the output cast up, as autocast does) and, under fp16, scaled."""
    stream = torch.cuda.current_stream() if cuda else None
    log = tl.start()
    saved.begin_step()
    wall0 = time.perf_counter()
    hooks = torch.autograd.graph.save_on_cpu(pin_memory=True) if strategy == "save_on_cpu" else saved.hooks()
    with tl.phase("forward", stream):
        with hooks:
            out = model(x)
            loss = F.mse_loss(out, y) if out.dtype == torch.float32 else F.mse_loss(out.float(), y.float())
    with tl.phase("backward", stream):
        if isinstance(opt, OffloadedAdam):
            opt.prefetch()
        (loss if scale == 1.0 else loss * scale).backward()
    with tl.phase("optimizer", stream):
        opt.step()
        opt.zero_grad()
    saved.end_step()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - wall0, log, loss.detach()


def _record(wall: float, log) -> dict:
    """A step's times: each phase without the waits inside it, the exposed and total transfer time."""
    waits = [s for s in log.spans if s.lane == "wait"]
    phases = {
        s.kind: s for s in log.spans if s.lane == "compute" and s.kind in ("forward", "backward", "optimizer")
    }

    updates = [s for s in log.spans if s.lane == "compute" and s.kind == "optimizer_update"]

    def inside(spans, ph):
        return sum(w.end_s - w.start_s for w in spans if w.start_s >= ph.start_s and w.end_s <= ph.end_s)

    def compute_in(ph):
        return ph.end_s - ph.start_s - inside(waits, ph)

    # bucket updates run inside backward (optimizer in_backward): they count as optimizer time
    in_bwd = inside(updates, phases["backward"])
    hidden = log.hidden_fraction()
    return {
        "step_s": wall,
        "forward_s": compute_in(phases["forward"]),
        "backward_s": compute_in(phases["backward"]) - in_bwd,
        "optimizer_s": compute_in(phases["optimizer"]) + in_bwd,
        "exposed_transfer_s": log.exposed_s(),
        "transfer_s": log.transfer_s(),
        "hidden_frac": float("nan") if hidden is None else hidden,
        "bytes_to_slow": log.bytes("to_slow"),
        "bytes_from_slow": log.bytes("from_slow"),
    }
