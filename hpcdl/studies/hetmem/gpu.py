"""The study's CUDA path (compute.run_point runs it when hetmem.device resolves to cuda): real two-tier
placements on the task's GPU, against which the differential estimate is checked on HARDWARE.

Tiers (gpu_tiers): the fast tier is the GPU's own memory (HBM); the slow tier is pinned host memory
mapped into the GPU's address space (zero-copy: with unified addressing the device pointer of a
pinned buffer is its host pointer), so a kernel reading a "slow" object really goes over the host
link. Objects are exposed to torch through `__cuda_array_interface__` (`place`); temporaries torch
allocates inside a step stay in device memory. `check_zero_copy` proves the aliasing before anything
is measured.

Each mini-app (STREAM triad, 3-D stencil, CG, GUPS, an MLP training step; gpu_apps.APPS) is the CPU
kernels' algorithm written in torch, with named objects. Its placements (gpu_placement.placements):
all-fast, all-slow, each object alone in fast memory, and distinct random object subsets. Each
placement is placed afresh and timed here (median of `gpu.repeats` steps after a warm-up). The
estimate is the differential one at object granularity with a single window,
T = s*T_fast + (1-s)*T_slow, s the share of the bytes a step moves that belong to fast objects,
counted from the kernel's operations: no PEBS-like sampler exists for GPU kernels here, so nothing
is sampled (rows say sample_every 1: every byte counted).

What of the CPU path runs here, and why:
  * valgrind traces and the simulated reference do not: their reason to exist is that a CPU node
    has one memory tier; a GPU has two real ones, so the measured times are the reference.
    (The CPU kernels' traces are also no trace of what the GPU runs.)
  * the placement agent does: greedy, random and PPO over the object-granularity estimator (one
    range per object, one window) cost seconds of CPU per app, and each policy's placement is then
    MEASURED on the GPU, so the placement claim is judged on hardware too.
This module measures and builds the rows. torch is imported inside the functions, so the pure parts
(placements, shares, policies, rows) run and are tested without a GPU.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from hpcdl.studies.hetmem.agent import derived_seed
from hpcdl.studies.hetmem.gpu_apps import APPS
from hpcdl.studies.hetmem.gpu_placement import byte_share, describe, estimate, placements, policy_choices
from hpcdl.studies.hetmem.gpu_tiers import check_zero_copy, place

HARDWARE = "hardware: GPU HBM vs mapped pinned host"  # the reference of every row of this path
SAMPLE_EVERY = 1  # shares are counted from the kernels' operations, not sampled


# ---------------------------------------------------------------------------------------- measuring
def _measure(base: dict, step, fast, dev, repeats: int) -> tuple[float, float]:
    """(median seconds of one step, seconds to place the objects) of one placement, placed afresh
    from the same initial values, after one warm-up step (kernel selection, first touch)."""
    import torch

    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    objs = {n: place(v.clone(), n in fast, dev) for n, v in base.items()}
    torch.cuda.synchronize(dev)
    place_s = time.perf_counter() - t0
    step(objs)
    torch.cuda.synchronize(dev)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(objs)
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    del objs
    torch.cuda.empty_cache()
    return float(np.median(times)), place_s


def _time_estimate(moved, fast_sets, t_fast, t_slow, repeat: int = 200) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        for fast in fast_sets:
            estimate(moved, fast, t_fast, t_slow)
    return (time.perf_counter() - t0) / (repeat * len(fast_sets))


def bounds(measured: dict, names) -> tuple[float, float]:
    """(T_fast, T_slow): the measured step times of the all-fast and all-slow placements."""
    return measured[frozenset(names)][0], measured[frozenset()][0]


def validation_rows(app: str, plan, measured: dict, moved: dict, sizes: dict, one_est_s: float) -> list[dict]:
    """One row per validation placement: its estimate beside its measured time (`measured`: fast
    objects -> (median step s, place s)), in the CPU path's columns where they mean the same."""
    t_fast, t_slow = bounds(measured, sizes)
    footprint = sum(sizes.values())
    rows = []
    for label, kind, fast in plan:
        step_s, place_s = measured[fast]
        est = estimate(moved, fast, t_fast, t_slow)
        rows.append({
            "app": app,
            "placement": label,
            "kind": kind,
            "sample_every": SAMPLE_EVERY,
            "fast_fraction": sum(sizes[n] for n in fast) / footprint,
            "reference": HARDWARE,
            "est_runtime_s": est,
            "ref_runtime_s": step_s,
            "error": (est - step_s) / step_s,
            "estimate_s": one_est_s,
            "reference_s": place_s + step_s,  # one hardware run of the placement: place, run once
            "fast_byte_share": byte_share(moved, fast),
            "fast_objects": describe(fast),
            "place_s": place_s,
        })
    return rows


def policy_rows(app: str, choices, measured: dict, moved: dict, sizes: dict, train_s: float) -> list[dict]:
    """One row per (capacity, policy): the chosen objects' estimate and MEASURED time."""
    t_fast, t_slow = bounds(measured, sizes)
    footprint = sum(sizes.values())
    return [{
        "app": app,
        "capacity": cap,
        "policy": policy,
        "fast_fraction": sum(sizes[n] for n in fast) / footprint,
        "placement": describe(fast),
        "reference": HARDWARE,
        "est_runtime_s": estimate(moved, fast, t_fast, t_slow),
        "ref_runtime_s": measured[fast][0],
        "all_fast_runtime_s": t_fast,
        "all_slow_runtime_s": t_slow,
        "train_s": train_s if policy == "ppo" else 0.0,
    } for cap, policy, fast in choices]


def trace_row(app: str, g: dict, sizes: dict, moved: dict, plan, measured: dict, gpu_name: str) -> dict:
    """The app's traces.csv row on the GPU: sizes, the bounds, and the cost of one hardware run."""
    t_fast, t_slow = bounds(measured, sizes)
    runs = [measured[f] for _, _, f in plan]
    return {
        "app": app,
        "scale": g["scale"],
        "repeats": g["repeats"],
        "objects": len(sizes),
        "object_names": " ".join(sizes),
        "footprint_bytes": sum(sizes.values()),
        "moved_bytes_per_step": sum(moved.values()),
        "placements_measured": len(measured),
        "reference": HARDWARE,
        "all_fast_runtime_s": t_fast,
        "all_slow_runtime_s": t_slow,
        # one real run of a placement: place its objects in their tiers and run the step once
        "native_run_s": float(np.median([p + s for s, p in runs])),
        "native_compute_s": float(np.median([s for s, _ in runs])),
        "zero_copy_verified": True,
        "gpu": gpu_name,
    }


def run_app(app: str, block: dict, seed: int) -> dict:
    """One app on the task's GPU: every validation placement and every policy's placement measured,
    each beside its estimate. Returns {"trace", "validation", "policies"} rows as the CPU path does."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"hetmem {app}: the CUDA path needs a GPU and torch sees none")
    dev = torch.device("cuda", torch.cuda.current_device())
    if not check_zero_copy(dev):
        raise RuntimeError("pinned host memory is not visible to the GPU through its host pointer "
                           "(no unified addressing): no slow tier to place objects in")
    g = block["gpu"]
    log = lambda msg: print(f"[hetmem] {app} (cuda): {msg}", file=sys.stderr, flush=True)  # noqa: E731
    base, step, moved = APPS[app](g["scale"])
    sizes = {n: v.numel() * v.element_size() for n, v in base.items()}
    measured: dict[frozenset, tuple[float, float]] = {}

    def measure(fast: frozenset) -> None:
        if fast not in measured:
            measured[fast] = _measure(base, step, fast, dev, g["repeats"])

    rng = np.random.default_rng(derived_seed(seed, app, "val"))
    plan = placements(list(base), g["random_placements"], rng)
    for _, _, fast in plan:
        measure(fast)
    t_fast, t_slow = bounds(measured, sizes)
    log(f"{len(plan)} placements measured; all-fast {t_fast * 1e3:.3f} ms, all-slow {t_slow * 1e3:.3f} ms")
    one_est_s = _time_estimate(moved, [f for _, _, f in plan], t_fast, t_slow)
    validation = validation_rows(app, plan, measured, moved, sizes, one_est_s)

    choices, train_s = policy_choices(sizes, moved, t_fast, t_slow, block["agent"], seed, app)
    log(f"PPO trained {block['agent']['timesteps']} steps in {train_s:.1f} s")
    for _, _, fast in choices:
        measure(fast)
    policies = policy_rows(app, choices, measured, moved, sizes, train_s)
    info = trace_row(app, g, sizes, moved, plan, measured, torch.cuda.get_device_name(dev))
    return {"trace": info, "validation": validation, "policies": policies}
