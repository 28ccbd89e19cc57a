"""What the hetmem task app's task body runs (tasks/hetmem.py): one application end to end (`run_point`).

On the CPU (`run_app`) it traces the app, simulates the reference, validates the estimator on many
placements at every sampling rate, and places the app's data with the greedy, random and PPO
policies; on CUDA the app's placements are measured on the task's GPU (hpcdl.studies.hetmem.gpu).
`build_estimator` is also what the benchmark and the tests build their estimators with.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from hpcdl.studies.hetmem import agent, gpu, reference
from hpcdl.studies.hetmem.agent import derived_seed
from hpcdl.studies.hetmem.estimator import DifferentialEstimator, sample_misses
from hpcdl.studies.hetmem.layout import Layout, describe, range_pages_for
from hpcdl.studies.hetmem.trace import trace_app

SIMULATED = "simulated"  # the reference's label in every row (this machine has no second memory tier)


def validation_placements(
    layout: Layout, ranges, fractions: list[float], repeats: int, rng: np.random.Generator
) -> list[tuple[str, str, np.ndarray]]:
    """(name, kind, mask): all-fast, all-slow, each object alone in fast memory, random ranges."""
    out = [
        ("all_fast", "bound", np.ones(layout.n_pages, bool)),
        ("all_slow", "bound", np.zeros(layout.n_pages, bool)),
    ]
    out += [(f"object:{n}", "object", layout.mask(fast_objects=[n])) for n in layout.names]
    for frac in fractions:
        for rep in range(repeats):
            chosen = agent.random_policy(ranges, int(frac * layout.n_pages), rng)
            out.append((f"ranges:{frac:g}#{rep}", "random_ranges", layout.ranges_mask(ranges, chosen)))
    return out


def build_estimator(profile, t_fast, t_slow, every: int, seed: int) -> DifferentialEstimator:
    """The estimator from the two runs' PEBS-like samples (each run sampled with its own phase)."""
    runs = [
        sample_misses(
            profile.miss_window,
            profile.miss_page,
            profile.n_windows,
            profile.seq.shape[1],
            every,
            np.random.default_rng(derived_seed(seed, every, run)),
        )
        for run in ("fast", "slow")
    ]
    return DifferentialEstimator.from_runs(runs[0], runs[1], t_fast, t_slow)


def _time_estimates(est: DifferentialEstimator, masks: list[np.ndarray], repeat: int = 20) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        for m in masks:
            est.estimate_one(m)
    return (time.perf_counter() - t0) / (repeat * len(masks))


def run_point(point: dict, block: dict, work_dir: str, seed: int) -> dict:
    """One app point on its device (`point["device"]`, resolved by the task app): `run_app` on the
    CPU, the CUDA path's `gpu.run_app` on cuda. Both return {"trace", "validation", "policies"}."""
    if point.get("device") == "cuda":
        return gpu.run_app(point["name"], block, seed)
    return run_app(point["name"], point["size"], point["iters"], block, work_dir, seed)


def run_app(app: str, size: int, iters: int, block: dict, work_dir: str, seed: int) -> dict:
    work = Path(work_dir)
    log = lambda msg: print(f"[hetmem] {app}: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    trace, tinfo = trace_app(app, size, iters, work, block["valgrind"], block["cc"], block["keep_raw_trace"])
    log(
        f"traced {tinfo['accesses']} accesses, {tinfo['instructions']} instructions "
        f"({tinfo['traced_wall_s']:.1f} s under lackey)"
    )
    layout = Layout(trace.objects)
    profile = reference.simulate(trace, layout, block)
    model = reference.TimingModel.from_config(block)
    bounds = np.stack([np.ones(layout.n_pages, bool), np.zeros(layout.n_pages, bool)])
    win = reference.window_times(profile, model, bounds)
    t_fast, t_slow = win[0], win[1]
    all_fast_s, all_slow_s = float(t_fast.sum()), float(t_slow.sum())
    log(
        f"cache simulation {profile.cache_sim_s:.1f} s; simulated all-fast {all_fast_s * 1e6:.1f} us, "
        f"all-slow {all_slow_s * 1e6:.1f} us over {profile.n_windows} windows"
    )

    ranges = layout.ranges(range_pages_for(layout, block["n_ranges"]))
    placements = validation_placements(
        layout,
        ranges,
        block["validation"]["fractions"],
        block["validation"]["repeats"],
        np.random.default_rng(derived_seed(seed, app, "val")),
    )
    masks = np.stack([m for _, _, m in placements])
    ref, _ = reference.reference_runs(profile, model, masks)
    one_ref_s = min(reference.reference_runs(profile, model, m[None, :])[1] for m in masks[:4])

    validation = []
    for every in sorted({block["sample_every"], *block["sample_sweep"]}):
        est = build_estimator(profile, t_fast, t_slow, every, derived_seed(seed, app))
        estimates = est.estimate(masks)
        one_est_s = _time_estimates(est, list(masks))
        for (name, kind, m), e, r in zip(placements, estimates, ref, strict=True):
            validation.append(
                {
                    "app": app,
                    "placement": name,
                    "kind": kind,
                    "sample_every": every,
                    "fast_fraction": float(m.mean()),
                    "reference": SIMULATED,
                    "est_runtime_s": float(e),
                    "ref_runtime_s": float(r),
                    "error": float((e - r) / r),
                    "estimate_s": one_est_s,
                    "reference_s": one_ref_s,
                    "samples": int(est.counts.sum()),
                }
            )

    policies = _policies(app, layout, ranges, profile, model, t_fast, t_slow, block, seed, log)
    info = {
        "app": app,
        "size": size,
        "iters": iters,
        "objects": len(layout.names),
        "object_names": " ".join(layout.names),
        "footprint_bytes": layout.footprint_bytes,
        "windows": profile.n_windows,
        "memory_misses": int(len(profile.miss_window)),
        "cache_sim_s": profile.cache_sim_s,
        "reference": SIMULATED,
        "all_fast_runtime_s": all_fast_s,
        "all_slow_runtime_s": all_slow_s,
        **tinfo,
    }
    return {"trace": info, "validation": validation, "policies": policies}


def _policies(app, layout, ranges, profile, model, t_fast, t_slow, block, seed, log) -> list[dict]:
    ag = block["agent"]
    est = build_estimator(profile, t_fast, t_slow, block["sample_every"], derived_seed(seed, app))
    chosen, train_s = agent.choose_placements(layout, ranges, est, ag, seed, app)
    log(f"PPO trained {ag['timesteps']} steps in {train_s:.1f} s")
    rows = []
    for cap, choices in chosen:
        masks = np.stack([layout.ranges_mask(ranges, c) for c in choices.values()])
        est_rt = est.estimate(masks)
        ref_rt, _ = reference.reference_runs(profile, model, masks)
        for (policy, _), m, e, r in zip(choices.items(), masks, est_rt, ref_rt, strict=True):
            rows.append(
                {
                    "app": app,
                    "capacity": cap,
                    "policy": policy,
                    "fast_fraction": float(m.mean()),
                    "placement": describe(layout, m),
                    "reference": SIMULATED,
                    "est_runtime_s": float(e),
                    "ref_runtime_s": float(r),
                    "all_fast_runtime_s": float(t_fast.sum()),
                    "all_slow_runtime_s": float(t_slow.sum()),
                    "train_s": train_s if policy == "ppo" else 0.0,
                }
            )
    return rows
