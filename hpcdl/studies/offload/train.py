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

The run's settings are a RunSpec (runspec.py), on the device the point carries, resolved once by the
task app; each strategy's slow tier and optimizer come from strategies.py, one step and its times from
step.py, the process's memory from process_memory.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from hpcdl.studies.offload import process_memory
from hpcdl.studies.offload.accounting import BudgetExceeded, FastTier
from hpcdl.studies.offload.activations import SavedActivations
from hpcdl.studies.offload.checks import largest_tensor
from hpcdl.studies.offload.model import build_mlp, make_batch, n_params
from hpcdl.studies.offload.optimizer import OffloadedAdam
from hpcdl.studies.offload.precision import (
    check_finite,
    dtype_of,
    format_sample,
    gather,
    loss_scale_of,
    sample_positions,
)
from hpcdl.studies.offload.process_memory import PeakRss, trim_heap, warm_process
from hpcdl.studies.offload.runspec import RunSpec
from hpcdl.studies.offload.step import one_step, pooled_hidden_fraction, step_times
from hpcdl.studies.offload.strategies import (
    NEEDS_TIER,
    OFFLOADS_ACTIVATIONS,
    STRATEGIES,
    optimizer_for,
    slow_tier,
)
from hpcdl.studies.offload.timeline import CpuClock, CudaClock, Timeline

MEASURED_BY = {True: "torch.cuda.max_memory_allocated", False: "anonymous RSS high-water mark"}


def tier_name(device: str) -> str:
    return "gpu>pinned_host" if device == "cuda" else "ram>file"


RESOLVED = ("cpu", "cuda")


def point_device(spec: RunSpec) -> str:
    """The device the point carries, already resolved: the task app resolves `offload.device` once
    (hpcdl.platform's device mechanism) and every point it makes names the result (sweep.py)."""
    if spec.device not in RESOLVED:
        raise ValueError(f"an offload point's device is {spec.device!r}, not a resolved device "
                         f"({' or '.join(RESOLVED)}): the task app resolves offload.device once and "
                         "every point carries the result (sweep.sweep_points)")
    return spec.device


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
    threads = compute_threads(before, spec.copy_cores, point_device(spec) == "cuda")
    torch.set_num_threads(threads)
    try:
        return _train(spec, keep_weights)
    finally:
        torch.set_num_threads(before)


def _checked_device(spec: RunSpec) -> str:
    """The point's device, once its strategy is known and means something there."""
    if spec.strategy not in STRATEGIES:
        raise ValueError(f"unknown offload strategy {spec.strategy!r}; known: {STRATEGIES}")
    device = point_device(spec)
    if spec.strategy == "save_on_cpu" and device != "cuda":
        raise ValueError(
            "strategy 'save_on_cpu' needs CUDA (on CPU the saved tensors are already on the CPU)"
        )
    return device


def _clean_start(spec: RunSpec, cuda: bool) -> int:
    """Warm the process and clear what earlier runs left; on CUDA the model-free baseline the
    allocator's peak is measured above (0 on CPU, where the RSS at the run's start is)."""
    warm_process()
    if spec.trim_heap:
        trim_heap()
    if not cuda:
        return 0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


@dataclass
class _FastPeak:
    """The fast tier's measured peak: CUDA, torch.cuda.max_memory_allocated above the model-free
    baseline; CPU, the anonymous RSS high-water mark above the run's start."""

    cuda: bool
    cuda_base: int
    rss: PeakRss
    rss0: int

    def now(self) -> int:
        return torch.cuda.max_memory_allocated() - self.cuda_base if self.cuda else self.rss.now() - self.rss0

    def restart(self) -> None:
        self.rss.restart()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()


def _build_model(spec: RunSpec, fast: FastTier, device: str, dtype):
    """The model in the fast tier, its parameters (and each step's new gradients) charged to the
    registry; the sampled positions its final weights are recorded at."""
    fast.check_single(*largest_tensor({"model": {"width": spec.width, "batch": spec.batch}}))
    model = build_mlp(spec.width, spec.depth, spec.seed, device).to(dtype)
    params = list(model.parameters())
    positions = sample_positions(params)

    def charge_grad(p):  # a new gradient tensor each step (zero_grad sets them to None)
        fast.track(p.grad, "gradients")

    for p in params:
        fast.track(p, "parameters")
        p.register_post_accumulate_grad_hook(charge_grad)
    return model, params, positions


@dataclass
class _Run:
    """What a run's steps work on, built by `_train`."""

    spec: RunSpec
    device: str
    dtype: torch.dtype
    scale: float
    budget: int | None
    fast: FastTier
    peak: _FastPeak
    timeline: Timeline
    model: torch.nn.Module
    params: list
    opt: object
    saved: SavedActivations

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def _check_budget(run: _Run) -> None:
    peak = run.peak.now()
    if peak > run.budget:
        raise BudgetExceeded(
            f"fast tier over budget: {MEASURED_BY[run.cuda]} {peak}"
            f" bytes > offload.budget_mb = {run.budget} bytes"
        )


def _steps(run: _Run) -> tuple[list, tuple]:
    """Every step trained; the measured ones' (wall time, timeline log), and the last step's batch
    and loss (held by the caller until the run's end, as they were when this loop was inline)."""
    spec, measured, last = run.spec, [], ()
    for step in range(spec.steps):
        if step == spec.warmup_steps and step > 0:
            # the peak, like the times, is of the measured steps: a first step's one-off
            # allocations (library workspaces, the allocator's first mappings) depend on what
            # ran before in the process; what warm-up left resident still counts (above rss0)
            run.peak.restart()
        x, y = make_batch(spec.width, spec.batch, spec.seed, step, run.device)
        wall, log, loss = one_step(run.model, run.opt, run.saved, run.timeline, x.to(run.dtype), y,
                                   spec.strategy, run.cuda, run.scale)
        last = (x, y, loss)
        if spec.precision == "fp16":
            check_finite(loss, run.params, step, spec.precision, run.scale)
        if isinstance(run.opt, torch.optim.Adam) and step == 0:
            for st in run.opt.state.values():  # created by the first step: charge them now
                run.fast.track(st["exp_avg"], "optimizer_state")
                run.fast.track(st["exp_avg_sq"], "optimizer_state")
        if run.budget is not None:
            _check_budget(run)
        if step >= spec.warmup_steps:
            measured.append((wall, log))
    return measured, last


def _settled(run: _Run, tier, measured: list) -> list:
    """Each measured step's times and timeline rows, once every copy the steps issued has completed."""
    run.timeline.stop()  # what follows belongs to no step
    if isinstance(run.opt, OffloadedAdam):
        run.opt.finish()
    if tier is not None:
        tier.sync()
    per_step = []
    for wall, log in measured:
        log.resolve()
        per_step.append((step_times(wall, log), log.rows()))
    return per_step


def _close(opt, tier) -> None:
    if hasattr(opt, "close"):
        opt.close()  # zero_offload: its host buffers live in the tier's run directory
    if tier is not None:
        tier.close()


def _train(spec: RunSpec, keep_weights: bool = False) -> tuple:
    """Train `spec.steps` steps (the first `warmup_steps` unmeasured); the measured record.

    The fast tier's peak is measured: CUDA, torch.cuda.max_memory_allocated above the model-free
    baseline; CPU, the process's anonymous RSS high-water mark above the run's start (sampled every
    rss_interval_s and at each step's end). The tensor registry (accounting.FastTier) is kept beside it
    as a cross-check (`peak_accounted_bytes`). Raises BudgetExceeded when the measured peak goes over
    spec.budget_mb (checked after each step); on CPU the registry also stops a run early when the
    tensors it accounts alone exceed the budget.
    """
    device = _checked_device(spec)
    cuda = device == "cuda"
    dtype = dtype_of(spec.precision)
    scale = loss_scale_of(spec.precision, spec.loss_scale)
    budget = None if spec.budget_mb is None else int(spec.budget_mb * 2**20)
    cuda_base = _clean_start(spec, cuda)
    # the measured peak is the enforced fast-tier measure; on CPU the registry (a lower bound: it
    # misses kernel temporaries and allocator slack) also aborts early a run that cannot fit
    fast = FastTier(None if cuda else budget)
    timeline = Timeline(CudaClock(torch) if cuda else CpuClock())
    tier = None
    rss0 = process_memory.rss_bytes()
    with PeakRss(spec.rss_interval_s) as rss:
        peak = _FastPeak(cuda, cuda_base, rss, rss0)
        model, params, positions = _build_model(spec, fast, device, dtype)
        opt = None
        try:
            if spec.strategy in NEEDS_TIER:
                tier = slow_tier(spec, timeline, device)
            opt = optimizer_for(spec, params, tier, fast, timeline, dtype, scale)
            saved = SavedActivations(
                fast,
                params,
                tier if spec.strategy in OFFLOADS_ACTIVATIONS else None,
                offload=spec.strategy in OFFLOADS_ACTIVATIONS,
                prefetch_depth=spec.prefetch_depth,
                write_window=spec.write_window,
                device=device,
            )
            run = _Run(spec, device, dtype, scale, budget, fast, peak, timeline, model, params, opt, saved)
            measured, _last = _steps(run)
            # the fast tier's measured peak over the steps (what the budget was checked on); the
            # weights' flush and digest after them are not training (peak_rss_bytes covers them)
            peak_fast = peak.now()
            per_step = _settled(run, tier, measured)
            digest = weights_digest(model)
            sample = format_sample(gather(params, positions))
            weights = [p.detach().cpu().clone() for p in params] if keep_weights else None
        finally:
            _close(opt, tier)
    out, tl_rows = _record(spec, device, scale, fast, peak, per_step, peak_fast, digest, sample)
    return (out, tl_rows, weights) if keep_weights else (out, tl_rows)


def _record(spec: RunSpec, device: str, scale: float, fast: FastTier, peak: _FastPeak, per_step: list,
            peak_fast: int, digest: str, sample: str) -> tuple[dict, list]:
    """The run's record, and its median step's timeline rows."""
    cuda = device == "cuda"
    rss, rss0 = peak.rss, peak.rss0
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
        "hidden_frac": pooled_hidden_fraction([r for r, _ in per_step]),
        # each measured step's own fraction, for the claim's interval (space-separated; nan: no transfer)
        "hidden_frac_steps": " ".join(f"{r['hidden_frac']:.6f}" for r, _ in per_step),
        "weights_sha256": digest,
        # the final weights at SAMPLE fixed positions: what the claims compare within the tolerance of
        # tolerance.py where a strategy's update runs other kernels than none's (zero_offload)
        "weights_sample": sample,
    }
    return out, tl_rows
