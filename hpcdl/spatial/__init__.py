"""Spatial scaling study: halo-exchange partitioned Conv3d, CosmoFlow-like hybrid training, analysis."""

from hpcdl.study import StudySpec


def _largest_run(cfg: dict) -> int:
    from hpcdl.spatial.runs import expand

    return max(p["ranks"] for p in expand(cfg["spatial"]))


SPEC = StudySpec(
    name="spatial",
    title="Spatial scaling (hybrid data x spatial 3D CNN)",
    raw_tables=("exactness", "calibration", "runs", "iterations", "ranks"),
    tables=("runs", "loss", "exactness", "calibration_fit", "extrapolation", "strategy_choice",
            "paper_predictions"),
    figures=("strong_scaling", "weak_scaling", "efficiency", "oracle_parity", "extrapolation",
             "paper_predictions", "memory", "loss"),
    # the largest run's ranks x threads, so no two timed runs overlap
    task_units=lambda cfg: _largest_run(cfg) * cfg["spatial"]["threads_per_rank"],
    # the batch step starts each run's ranks with srun inside this N-task allocation
    run_resources=lambda cfg: {"mem_mb": 4000, "runtime": 30, "tasks": _largest_run(cfg), "mpi": "srun"},
)
