"""Expand the validated `hetmem:` block into points (one per mini-app) and the settings every app's
task computes from."""

from __future__ import annotations

# keys of the block only the analysis reads, or that only say where/how tasks run (`tuned`: the
# platform's notes on tuned keys, shown with the claims)
NOT_COMPUTED = (
    "runtime", "computing_units", "apps", "error_ceiling", "speedup_floor", "bound_tolerance", "tuned"
)


def app_points(cfg: dict) -> list[dict]:
    """One point per configured app: {"name", "size", "iters"}, as the config gives it."""
    return list(cfg["hetmem"]["apps"])


def compute_block(cfg: dict) -> dict:
    """The block without NOT_COMPUTED: what `compute.run_app` reads, and so what a point's key covers."""
    return {k: v for k, v in cfg["hetmem"].items() if k not in NOT_COMPUTED}
