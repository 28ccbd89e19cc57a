"""Spatial scaling study: halo-exchange partitioned Conv3d, CosmoFlow-like hybrid training, analysis."""


def task_units(cfg: dict) -> int:
    """Cores each task reserves: the largest run's ranks x threads, so no two timed runs overlap."""
    from hpcdl.spatial.runs import expand

    block = cfg["spatial"]
    return max(p["ranks"] for p in expand(block)) * block["threads_per_rank"]
