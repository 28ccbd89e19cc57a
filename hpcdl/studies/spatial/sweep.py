"""The spatial study's sweep: every scaling run of the config (`expand`), and the part of the
`spatial:` block each unit of work reads (its task's input and its stored result's key)."""

from __future__ import annotations


def run_shape(kind: str, grid: int, layout: list[int]) -> tuple[int, int, int]:
    """Global grid of a run: fixed for strong/ceiling/hybrid/train; weak grows depth/height with its ranks."""
    _, pd, ph = layout
    if kind == "weak":
        return (grid * pd, grid * ph, grid)
    return (grid, grid, grid)


def expand(block: dict) -> list[dict]:
    """Every scaling run of the config, in a fixed order (ids are stable for tests and tables).

    With `repeats` > 1 the whole list is run again (round robin), so a burst of load from other
    processes hits one repeat of a run, not all of them; the train run is not repeated.
    """
    points = []
    for kind in ("strong", "weak", "hybrid"):
        for layout in block[kind]["layouts"]:
            d, pd, ph = layout
            points.append({"run": f"{kind}-d{d}x{pd}x{ph}", "kind": kind, "layout": list(layout),
                           "ranks": d * pd * ph, "shape": list(run_shape(kind, block[kind]["grid"], layout)),
                           "batch_size": block["batch_size"] * (d if kind == "weak" else 1),
                           "iterations": block["iterations"]})
    if block.get("ceiling", True):
        # the machine's own ceiling for each multi-rank strong layout: the same per-rank compute as
        # independent processes, all at once, with no communication (train_run(communicate=False))
        for p in [p for p in points if p["kind"] == "strong" and p["ranks"] > 1 and p["layout"][0] == 1]:
            points.append({**p, "run": p["run"].replace("strong", "ceiling"), "kind": "ceiling"})
    points = [{**p, "repeat": r} for r in range(block["repeats"]) for p in points]
    t = block["train"]
    d, pd, ph = t["layout"]
    points.append({"run": f"train-d{d}x{pd}x{ph}", "kind": "train", "layout": list(t["layout"]),
                   "ranks": d * pd * ph, "shape": list(run_shape("train", t["grid"], t["layout"])),
                   "batch_size": t["batch_size"], "iterations": t["iterations"], "repeat": 0})
    return points


# What each unit of work reads from the `spatial:` block. Its task receives only that part, and
# the point store keys the unit's stored result by it (hpcdl.platform.points): editing a sweep list,
# `repeats`, `warmup`, the extrapolation or the machine recomputes no stored result, and a unit
# that starts reading another key fails with a KeyError instead of reusing a stale result.
def run_block(block: dict) -> dict:
    return {k: block[k] for k in ("seed", "dtype", "n_samples", "grf", "model", "lr", "allow_uneven",
                                  "threads_per_rank", "run_timeout_s", "halo_timeout_s", "overlap",
                                  "bucket_kb")}


def calibration_block(block: dict) -> dict:
    return {**{k: block[k] for k in ("seed", "n_samples", "grf", "model", "batch_size", "calibration",
                                     "threads_per_rank", "run_timeout_s")},
            "strong": {"grid": block["strong"]["grid"]}, "weak": {"grid": block["weak"]["grid"]}}


def exactness_block(block: dict) -> dict:
    return {**{k: block[k] for k in ("model", "run_timeout_s", "halo_timeout_s")},
            "exactness": {"shape": block["exactness"]["shape"]}}

