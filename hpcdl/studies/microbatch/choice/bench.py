"""Benchmark every candidate algorithm per kernel and micro-batch size: time and workspace.

Time: the minimum (and, recorded too, the median) of `repeats` calls after `warmup` calls, a layer's
configurations called in interleaved rounds, on the wall clock (CUDA: synchronised around each call;
see `clock` for why never CPU time).
Workspace: the extra peak memory of one call beyond what existed before it (the result buffer is
preallocated outside the call, so what is counted is the algorithm's scratch: oneDNN's reordered
tensors and scratchpad, the native path's im2col columns, channels-last copies of the micro-batch,
the micro-batch result before it is copied into place). CPU: every allocation and free the torch
CPU allocator reports to the profiler (oneDNN's scratchpad goes through it: PyTorch runs oneDNN in
user-scratchpad mode), integrated in time order to a peak. CUDA: torch.cuda.max_memory_allocated
minus memory_allocated before the call (cuDNN's workspace comes from PyTorch's caching allocator).
"""

from __future__ import annotations

import statistics
import time

import torch

from hpcdl.studies.microbatch.choice.algorithms import (
    ALGORITHMS,
    ALL_KERNELS,
    Algorithm,
    KernelCall,
    instrumented,
    unavailable_reason,
)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def clock(device: str):
    """(clock, its name) for timing kernels and plans on `device`: the wall clock (time.perf_counter)
    everywhere, "wall (synchronised)" on CUDA, "wall" on the CPU; every raw table's `clock` column.

    Why not the calling thread's CPU time (this study's clock on one CPU thread before): what a
    micro-batch plan saves or costs is the time training waits for it, and CPU time counts only the
    calling thread's own work: any part of a call run on another thread (a library's helper or pool
    thread) or spent blocked is left out, so it can hide a cost only the wall clock shows; on an
    idle core the two agree. Its one merit, ignoring another process that preempts us on a shared
    machine, is kept by the interleaved rounds and their minimum (`time_rounds`) and by pairing plan
    and default in each round.
    """
    return time.perf_counter, "wall (synchronised)" if device == "cuda" else "wall"


def round_order(n: int, r: int) -> list[int]:
    """Indices 0..n-1 rotated by round r: in interleaved timing no candidate always runs first."""
    return [*range(r % n, n), *range(r % n)]


def time_rounds(fns: list, device: str, repeats: int, warmup: int) -> list[tuple[float, float, float]]:
    """(minimum, median, wall seconds spent) of each fns[j](i) over `repeats` rounds (i counts
    fns[j]'s calls, warm-up included; the wall time counts them all). Each round calls every
    function once, the order rotated each round.

    The minimum is the estimate the planner uses: on a shared machine noise only adds time
    (preemption, another process's cache traffic), so the fastest repeat is the undisturbed one.
    Rounds, not one function's repeats back to back, because a disturbance lasting as long as a
    function's repeats (a slow patch of ~0.1 s) then inflates one repeat of every function instead
    of every repeat of one: ResNet-18's last layer once benchmarked its default at 1.8x its executed
    time that way, and the planner left the default for a configuration that ran slower.
    """
    times, wall = round_times(fns, device, repeats, warmup)
    return [(min(t), statistics.median(t), w) for t, w in zip(times, wall, strict=True)]


def round_times(fns: list, device: str, repeats: int, warmup: int, first_call: int = 0
                ) -> tuple[list[list[float]], list[float]]:
    """time_rounds' measurements before they are summarised: each fns[j]'s time in every round, and
    the wall seconds spent on it. fns[j] is called with its call count, starting at `first_call` (a
    later batch of rounds continues the count, so each call walks on to the next micro-batch offset)."""
    n = len(fns)
    if n == 0:  # every configuration of the layer was skipped
        return [], []
    wall = [0.0] * n
    for j, fn in enumerate(fns):
        w0 = time.perf_counter()
        for i in range(warmup):
            fn(first_call + i)
        _sync(device)
        wall[j] += time.perf_counter() - w0
    times: list[list[float]] = [[] for _ in fns]
    now = clock(device)[0]
    for r in range(repeats):
        for j in round_order(n, r):
            w0 = time.perf_counter()
            t0 = now()
            fns[j](first_call + warmup + r)
            _sync(device)
            times[j].append(now() - t0)
            wall[j] += time.perf_counter() - w0
    return times, wall


def cpu_peak_extra_bytes(events) -> int:
    """Peak bytes allocated during a profiled call beyond what it leaves allocated (its result):
    the allocator's events integrated in time order."""
    events = [e for e in events if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return int(peak - max(live, 0))


def cuda_peak_extra_bytes(fn) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    res = fn()
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - base  # the result of an undivided call is output, not workspace
    del res
    return int(torch.cuda.max_memory_allocated() - base - kept)


def _skipped(base: dict, kernel: str, name: str, sizes: list[int], why: str) -> list[dict]:
    return [
        {
            **base,
            "kernel": kernel,
            "algorithm": name,
            "micro_batch": b,
            "status": "skipped",
            "reason": why,
            "backend_ran": "",
            "forced_ok": False,
            "ran": "",
            "time_s": float("nan"),
            "time_median_s": float("nan"),
            "workspace_bytes": -1,
            "bench_wall_s": 0.0,
        }
        for b in sizes
    ]


def benchmark_layer(
    call: KernelCall,
    algorithms: list[str],
    sizes: list[int],
    device: str,
    repeats: int,
    warmup: int,
    progress=None,
    kernels: tuple[str, ...] = ALL_KERNELS,
) -> list[dict]:
    """One row per (kernel, algorithm, micro-batch size); the layer's configurations are timed
    together, in rounds (`time_rounds`).

    Every row records which backend really ran (`backend_ran`) and whether it is the forced one
    (`forced_ok`): PyTorch's CPU dispatcher may run the native path although oneDNN is enabled
    (it prefers it for some small shapes), and no public switch overrides that. An algorithm this
    build or device cannot run at all gives `skipped` rows with the reason.
    """
    rows = []
    base = {"layer": call.layer.name, "count": call.layer.count}
    configs = []  # (kernel, algorithm, micro-batch, its call, what ran, workspace, wall seconds so far)
    for kernel in kernels:
        out = call.output(kernel)
        for name in algorithms:
            alg: Algorithm = ALGORITHMS[name]
            why = unavailable_reason(alg, device)
            if why is not None:
                rows += _skipped(base, kernel, name, sizes, why)
                continue
            for b in sizes:
                starts = list(range(0, call.batch - b + 1, b)) or [0]

                def once(i=0, b=b, alg=alg, kernel=kernel, out=out, starts=starts):
                    # successive calls walk the batch as the executor does: no call finds its
                    # micro-batch hot in cache from the previous one
                    # the whole batch runs as the executor runs it: no buffer, no copy
                    return call.run(kernel, alg, starts[i % len(starts)], b, None if b == call.batch else out)

                t0 = time.perf_counter()
                try:  # the instrumented call is also the probe: a backend may refuse a shape
                    if device == "cuda":  # cudnn.benchmark's first call tries every algorithm: not recorded
                        once()
                    backend, ran, events = instrumented(call, kernel, alg, b)
                except RuntimeError as exc:  # the backend refused this shape: not a candidate here
                    rows += _skipped(base, kernel, name, [b], f"{type(exc).__name__}: {exc}")
                    continue
                ws = cuda_peak_extra_bytes(once) if device == "cuda" else cpu_peak_extra_bytes(events)
                configs.append((kernel, alg, b, once, backend, ran, ws, time.perf_counter() - t0))
    timed = time_rounds([c[3] for c in configs], device, repeats, warmup)
    for (kernel, alg, b, _, backend, ran, ws, wall), (t, t_med, t_wall) in zip(configs, timed, strict=True):
        rows.append(
            {
                **base,
                "kernel": kernel,
                "algorithm": alg.name,
                "micro_batch": b,
                "status": "ok",
                "reason": "",
                "backend_ran": backend,
                "forced_ok": backend == alg.backend,
                "ran": ran,
                "time_s": t,
                "time_median_s": t_med,
                "workspace_bytes": ws,
                "bench_wall_s": wall + t_wall,
            }
        )
        if progress is not None:
            progress.update(1)
    return rows
