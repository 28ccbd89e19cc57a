"""Checks on the `offload:` block that JSON schema cannot express (no heavy imports here)."""

from __future__ import annotations

import math

from hpcdl.platform import ConfigError


def largest_tensor(block: dict) -> tuple[int, str]:
    """Bytes and name of the largest single tensor the fast tier must hold (fp32)."""
    w, b = block["model"]["width"], block["model"]["batch"]
    return max((4 * w * w, f"the {w}x{w} fp32 weight"), (4 * b * w, f"the {b}x{w} fp32 activation"))


def check(cfg: dict) -> None:
    block = cfg.get("offload")
    if block is None:
        return
    budget = block["capacity"]["budget_mb"] * 2**20
    nbytes, what = largest_tensor(block)
    if budget < nbytes:
        raise ConfigError("offload.capacity.budget_mb", block["capacity"]["budget_mb"],
                          f"a budget of at least the largest single tensor, {what} of "
                          f"{nbytes / 2**20:.3f} MiB ({nbytes} bytes)")
    if block["warmup_steps"] >= block["steps"]:
        raise ConfigError("offload.warmup_steps", block["warmup_steps"],
                          f"fewer than offload.steps ({block['steps']}), or no step is measured")
    scale = block.get("loss_scale", 65536)
    if not (scale >= 1 and math.log2(scale).is_integer()):
        raise ConfigError("offload.loss_scale", scale,
                          "a power of two (fp16's gradients are unscaled exactly)")
    if block["capacity"]["max_depth"] < max(block["model"]["depths"]):
        raise ConfigError("offload.capacity.max_depth", block["capacity"]["max_depth"],
                          f"at least the largest of offload.model.depths ({max(block['model']['depths'])})")
