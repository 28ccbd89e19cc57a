"""Which Optuna studies one configuration runs, in order.

- grid-<w>w for each w in hpo.grid.workers: the PDML'19 grid, one task per configuration (no
  chunking, no pruning), with w concurrent workers; the elapsed times give the scaling figure.
  With hpo.grid.repeats > 1 the grid is timed again, round-robin (every worker count of repeat 0,
  then of repeat 1, ...) so a burst of load on the machine hits one repeat's pair, not one worker
  count in every repeat; repeat r > 0 is grid-<w>w-r<r>, a timing repeat only (no test accuracy,
  left out of the tables that pick a best trial or a baseline).
- <s> for each sampler in hpo.compare_samplers (plus hpo.sampler): the model-based search
  without pruning; curves for the best-so-far figure and the pruning baseline.
- <sampler>-<pruner>: the configured sampler with the configured pruner on the same budget.

On CUDA every trial task holds a GPU of its own, so a grid on w workers is a grid on w GPUs:
`check_gpu_workers` refuses, before anything runs, a worker count larger than the GPUs the local
backend can hand out (its pool, task_runtime.gpus.gpu_pool), rather than time w "workers" that
queue for fewer GPUs. Under COMPSs the runtime's own GPU resources bound the concurrency (the
app cannot see them); grid_scaling's busy_workers then shows the concurrency actually reached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class StudyPlan:
    name: str
    kind: str  # "grid" or "search"
    sampler: str
    pruner: str
    n_trials: int
    workers: int  # concurrent trials (local cores = workers x computing_units)
    max_in_flight: int  # trials submitted before the driver waits on the oldest
    chunk_epochs: int  # epochs per task; pruning decisions happen between chunks
    device: str = "cpu"  # where every trial trains (hpo.device, resolved): on cuda one GPU per worker
    units: int = 1  # cores each trial task holds (hpo.computing_units, resolved)
    repeat: int = 0  # the grid's timing repeat (hpo.grid.repeats); 0 for the searches


def grid_study(workers: int, repeat: int = 0) -> str:
    """The grid study's name: repeat 0 keeps grid-<w>w (the journals and the pruning baseline name it)."""
    return f"grid-{workers}w" + (f"-r{repeat}" if repeat else "")


def grid_repeats(grid: dict) -> int:
    """How many times the grid is timed at each worker count (1 where the key is absent)."""
    return int(grid.get("repeats", 1))


def grid_size(grid: dict) -> int:
    return math.prod(len(grid[k]) for k in ("optimizer", "batch_size", "epochs"))


def plan_studies(hpo: dict, backend: str = "local", device: str = "cpu", units: int = 1) -> list[StudyPlan]:
    plans: list[StudyPlan] = []
    on = {"device": device, "units": int(units)}
    grid = hpo["grid"]
    n_grid = grid_size(grid)
    max_grid_epochs = max(grid["epochs"])
    for r in range(grid_repeats(grid)):  # round-robin: a repeat's worker counts run back to back
        for w in grid["workers"]:
            # Locally the backend's core count enforces w workers, so submit the whole grid at once
            # (PDML'19: one task per point). Under COMPSs the resources are fixed: cap in-flight tasks at w.
            in_flight = n_grid if backend == "local" else w
            plans.append(StudyPlan(grid_study(w, r), "grid", "grid", "none", n_grid, w, in_flight,
                                   max_grid_epochs, repeat=r, **on))
    search_workers = int(hpo["workers"])
    in_flight = max(int(hpo["max_in_flight"]), search_workers)
    baselines = list(dict.fromkeys([*hpo["compare_samplers"], hpo["sampler"]]))
    max_epochs = int(hpo["space"]["epochs"]["high"])
    for s in baselines:
        if s == "grid":
            continue  # the grid baseline is the grid-<w>w study above
        plans.append(StudyPlan(s, "search", s, "none", int(hpo["n_trials"]), search_workers, in_flight,
                               max_epochs, **on))
    if hpo["pruner"] != "none":
        s = hpo["sampler"]
        kind = "grid" if s == "grid" else "search"
        n = n_grid if s == "grid" else int(hpo["n_trials"])
        plans.append(StudyPlan(f"{s}-{hpo['pruner']}", kind, s, hpo["pruner"], n, search_workers, in_flight,
                               int(hpo["chunk_epochs"]), **on))
    return plans


def check_grid_pool(hpo: dict) -> None:
    """hpo.grid.train_limit may shrink the grid's image pool below the searches', never grow it: a
    ConfigError naming it where it exceeds hpo.data.train_limit (Snakemake merges configs/default.yaml
    under every config file, so a smaller config can inherit the laptop's 12000)."""
    from hpcdl.platform import ConfigError

    grid_limit, data_limit = hpo["grid"].get("train_limit"), hpo["data"]["train_limit"]
    if grid_limit is not None and data_limit is not None and grid_limit > data_limit:
        raise ConfigError(
            "hpo.grid.train_limit", grid_limit,
            f"null or at most hpo.data.train_limit ({data_limit}): the grid's pool is a slice of the "
            "searches'")


def grid_data(data, grid: dict):
    """The data spec (compute.DataSpec) the grid's trials train on: hpo.grid.train_limit images where
    it is set (a timing grid need not train on the searches' whole pool), else the searches' own."""
    limit = grid.get("train_limit")
    return data if limit is None else replace(data, train_limit=int(limit))


def check_gpu_workers(hpo: dict, device: str, pool: list[str], pool_env: str) -> None:
    """On CUDA with the local backend's GPU pool `pool` (set by `pool_env`, else the visible GPUs):
    every grid worker count must have a GPU per worker; a ConfigError naming hpo.grid.workers and the
    pool otherwise. Nothing to check on the CPU."""
    from hpcdl.platform import ConfigError

    if device != "cuda":
        return
    workers = list(hpo["grid"]["workers"])
    if any(w > len(pool) for w in workers):
        fits = [w for w in workers if w <= len(pool)]
        raise ConfigError(
            "hpo.grid.workers", workers,
            f"worker counts <= {len(pool)}: on cuda each concurrent trial holds a GPU of its own and the "
            f"local GPU pool has {len(pool)} ({','.join(pool) or 'none'}; {pool_env} or the visible GPUs), "
            f"so a grid on w workers needs w GPUs (e.g. hpo.grid.workers: {fits or [1]}; or hpo.device: cpu)")


def pruning_baseline(hpo: dict) -> tuple[str, str] | None:
    """(unpruned study, pruned study) compared by the pruning claim, or None without a pruner."""
    if hpo["pruner"] == "none":
        return None
    s = hpo["sampler"]
    base = grid_study(max(hpo["grid"]["workers"])) if s == "grid" else s
    return base, f"{s}-{hpo['pruner']}"
