"""Expand the validated `microbatch:` block into network points (plain dicts, one task each)."""

from __future__ import annotations

# What a network point takes from the block as it is (besides its network and the resolved device).
POINT_KEYS = ("batch_size", "image_size", "deepbench_scale", "deepbench_layers", "algorithms", "policies",
              "repeats", "warmup", "exec_repeats", "budget_fractions", "kernel_limit_mib", "seed",
              "backward_forms", "switch_margin", "threads", "stack_vetting_rounds")


def network_points(cfg: dict, device: str = "cpu") -> list[dict]:
    """One point per network, on the resolved `device` (the app resolves it once: a stored point names
    where it ran, so a CPU result is never reused for a CUDA run)."""
    b = cfg["microbatch"]
    return [{"network_name": net, "device": device, **{k: b[k] for k in POINT_KEYS}} for net in b["networks"]]


def cudnn_points(cfg: dict, device: str) -> list[dict]:
    """One point per network of μ-cuDNN's own experiment (hpcdl.studies.microbatch.cudnn.study;
    microbatch.cudnn.networks, or microbatch.networks), each under its own limits
    (cudnn.plan.network_limits_mib): none unless `device` (resolved) is cuda and
    microbatch.cudnn.engines is true."""
    from hpcdl.studies.microbatch.cudnn.engines import enabled
    from hpcdl.studies.microbatch.cudnn.plan import cudnn_networks, network_limits_mib

    b = cfg["microbatch"]
    if not enabled(b, device):
        return []
    return [
        {
            "network_name": net,
            "batch_size": b["batch_size"],
            "image_size": b["image_size"],
            "deepbench_scale": b["deepbench_scale"],
            "deepbench_layers": b.get("deepbench_layers", "subset"),
            "policies": b["policies"],
            "repeats": b["repeats"],
            "warmup": b["warmup"],
            "exec_repeats": b["exec_repeats"],
            "limits_mib": network_limits_mib(b, net),
            "screen_ratio": b["cudnn"].get("screen_ratio"),
            "tf32": b["cudnn"]["tf32"],
            "seed": b["seed"],
        }
        for net in cudnn_networks(b)
    ]
