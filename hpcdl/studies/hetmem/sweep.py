"""Expand the validated `hetmem:` block into points (one per mini-app) and the settings every app's
task computes from."""

from __future__ import annotations

# keys of the block only the analysis reads, or that only say where/how tasks run (`tuned`: the
# platform's notes on tuned keys, shown with the claims)
NOT_COMPUTED = (
    "runtime", "computing_units", "apps", "error_ceiling", "speedup_floor", "bound_tolerance", "tuned"
)


def app_points(cfg: dict, device: str = "cpu") -> list[dict]:
    """One point per configured app: {"name", "size", "iters"}, as the config gives it; on cuda with
    "device": "cuda" too, so a stored CPU result is never reused for a GPU run (or the reverse), while
    the CPU points' keys stay what they were before the CUDA path existed."""
    apps = list(cfg["hetmem"]["apps"])
    return apps if device == "cpu" else [{**a, "device": device} for a in apps]


def compute_block(cfg: dict, device: str = "cpu") -> dict:
    """The block without NOT_COMPUTED: what `compute.run_app` (or, on cuda, `gpu.run_app`) reads, and so
    what a point's key covers. The `gpu` settings are read only on cuda, so they are no part of a CPU
    point's key."""
    drop = NOT_COMPUTED + (("gpu",) if device == "cpu" else ())
    return {k: v for k, v in cfg["hetmem"].items() if k not in drop}
