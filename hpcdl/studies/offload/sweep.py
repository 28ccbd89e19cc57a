"""Expand the validated `offload:` block into points (plain dicts, one per task), and prepare the
slow-tier directory every point writes to."""

from __future__ import annotations

from pathlib import Path

from hpcdl.studies.offload.slowtier import SlowTierError, check_slow_dir, remove_stale_runs

__all__ = ["SlowTierError", "capacity_points", "prepare_slow_dir", "slow_dir", "strategies", "sweep_points"]

CPU_ONLY_SKIPPED = {"save_on_cpu": "needs CUDA: on CPU the saved tensors are already in host memory"}


def slow_dir(cfg: dict) -> tuple[Path, bool]:
    """The slow-tier directory and whether the study owns it (the default, under results_dir)."""
    value = cfg["offload"]["slow_tier"]["dir"]
    if value is None:
        return Path(cfg["results_dir"]).absolute() / "offload" / "slow", True
    return Path(value).absolute(), False


def prepare_slow_dir(cfg: dict) -> tuple[Path, bool, list[Path]]:
    """The slow-tier directory (created where the study owns it), whether the study owns it, and the
    stale run directories removed from it (an interrupted run's offload files).

    Raises SlowTierError where the directory does not exist.
    """
    slow, owned = slow_dir(cfg)
    if owned:
        slow.mkdir(parents=True, exist_ok=True)
    check_slow_dir(slow)
    return slow, owned, remove_stale_runs(slow)


def _common(cfg: dict, device: str) -> dict:
    b = cfg["offload"]
    return {
        "width": b["model"]["width"],
        "batch": b["model"]["batch"],
        "lr": b["model"]["lr"],
        "seed": b["seed"],
        "device": device,  # resolved once by the app, so a stored point names where it ran
        "slow_dir": str(slow_dir(cfg)[0]),
        "io_mode": b["slow_tier"]["io_mode"],
        "copy_cores": b["slow_tier"]["copy_cores"],
        "bucket_mb": b["optimizer"]["bucket_mb"],
        "foreach": b["optimizer"]["foreach"],
        "fused": b["optimizer"]["fused"],
        "optimizer_in_backward": b["optimizer"]["in_backward"],
        "staging_sets": b["optimizer"]["staging_sets"],
        "prefetch_depth": b["activations"]["prefetch_depth"],
        "write_window": b["activations"]["write_window"],
        "rss_interval_s": b["rss_interval_ms"] / 1000.0,
        "precision": b["precision"],
        "loss_scale": b["loss_scale"],
        "host_adam": b["zero_offload"]["host_adam"],
        "grad_window": b["zero_offload"]["grad_window"],
    }


def strategies(cfg: dict, device: str) -> list[str]:
    """The configured strategies that mean something on the resolved `device` (cpu or cuda)."""
    return [s for s in cfg["offload"]["strategies"] if device == "cuda" or s not in CPU_ONLY_SKIPPED]


def sweep_points(cfg: dict, device: str = "cpu") -> list[dict]:
    """One point per (depth, strategy); each also measures both tiers' bandwidths after its run
    (`tier_probe`, tiers.measure)."""
    b = cfg["offload"]
    probe = {"bytes": int(b["slow_tier"]["probe_mb"] * 2**20), "rounds": b["slow_tier"]["probe_rounds"]}
    return [
        {
            "strategy": s,
            "depth": d,
            "steps": b["steps"],
            "warmup_steps": b["warmup_steps"],
            "budget_mb": None,
            **_common(cfg, device),
            "tier_probe": probe,
        }
        for d in sorted(b["model"]["depths"])
        for s in strategies(cfg, device)
    ]


def capacity_points(cfg: dict, device: str = "cpu") -> list[dict]:
    b = cfg["offload"]
    c = b["capacity"]
    return [
        {
            "spec": {
                "strategy": s,
                "depth": 1,
                "steps": c["trial_steps"],
                "warmup_steps": 0,
                "budget_mb": c["budget_mb"],
                **_common(cfg, device),
            },
            "max_depth": c["max_depth"],
        }
        for s in strategies(cfg, device)
    ]
