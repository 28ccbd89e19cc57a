"""Expand the validated `microbatch:` block into network points (plain dicts, one task each)."""

from __future__ import annotations


def network_points(cfg: dict, device: str = "cpu") -> list[dict]:
    """One point per network, on the resolved `device` (the app resolves it once: a stored point names
    where it ran, so a CPU result is never reused for a CUDA run)."""
    b = cfg["microbatch"]
    return [
        {
            "network_name": net,
            "device": device,
            "batch_size": b["batch_size"],
            "image_size": b["image_size"],
            "deepbench_scale": b["deepbench_scale"],
            "algorithms": b["algorithms"],
            "policies": b["policies"],
            "repeats": b["repeats"],
            "warmup": b["warmup"],
            "exec_repeats": b["exec_repeats"],
            "budget_fractions": b["budget_fractions"],
            "kernel_limit_mib": b["kernel_limit_mib"],
            "seed": b["seed"],
            "backward_forms": b["backward_forms"],
            "switch_margin": b["switch_margin"],
            "threads": b["threads"],
        }
        for net in b["networks"]
    ]
