"""The study's units of work, each a plain function a task body calls once.

A scaling run = one rank launch (hpcdl.runtime.launch.run_ranks) of hpcdl.spatial.train.train_run
on data x depth x height ranks; it returns one summary row and per-rank, per-iteration rows.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hpcdl.layers import build_spec
from hpcdl.runtime.launch import run_ranks
from hpcdl.spatial.data import ensure_dataset

TRAIN = "hpcdl.spatial.train:train_run"


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
# the point store keys the unit's stored result by it (hpcdl.points): editing a sweep list,
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


def dataset_for(block: dict, resources_dir: str, shape) -> Path:
    g = block["grf"]
    return ensure_dataset(resources_dir, tuple(shape), block["n_samples"], block["seed"],
                          tuple(g["amplitude"]), tuple(g["ns"]))


def _env(block: dict) -> None:
    os.environ["HPCDL_HALO_TIMEOUT_S"] = str(block["halo_timeout_s"])


def run_point(point: dict, block: dict, resources_dir: str) -> dict:
    """Launch one scaling run; returns {"summary": row, "iterations": rows, "ranks": per-rank rows}."""
    _env(block)
    data_dir = dataset_for(block, resources_dir, point["shape"])
    d, pd, ph = point["layout"]
    t0 = time.time()
    results = run_ranks(TRAIN, point["ranks"], {
        "data_dir": str(data_dir), "n_data": d, "grid": (pd, ph), "model": block["model"],
        "batch_size": point["batch_size"], "iterations": point["iterations"], "lr": block["lr"],
        "seed": block["seed"], "dtype": block["dtype"], "allow_uneven": block["allow_uneven"],
        "overlap": block["overlap"], "bucket_kb": block["bucket_kb"],
        "communicate": point["kind"] != "ceiling"},
        timeout_s=block["run_timeout_s"], threads_per_rank=block["threads_per_rank"])
    wall = time.time() - t0
    iters, ranks = [], []
    for res in results:
        for rec in res["records"]:
            iters.append({"run": point["run"], "repeat": point["repeat"], "rank": res["rank"], **rec})
        ranks.append({"run": point["run"], "repeat": point["repeat"], "rank": res["rank"],
                      "data_index": res["data_index"],
                      "slab_depth": res["slab_depth"], "slab_height": res["slab_height"],
                      "peak_rss_mb": res["peak_rss_mb"], "base_rss_mb": res["base_rss_mb"],
                      "peak_delta_mb": res["peak_rss_mb"] - res["base_rss_mb"], "n_params": res["n_params"]})
    summary = {**{k: v for k, v in point.items() if k not in ("layout", "shape")},
               "data": d, "depth_ranks": pd, "height_ranks": ph,
               "depth": point["shape"][0], "height": point["shape"][1], "width": point["shape"][2],
               "launch_wall_s": wall, "status": "ok", "error": ""}
    return {"summary": summary, "iterations": iters, "ranks": ranks}


def calibration_specs(block: dict) -> list[tuple[list[dict], int]]:
    """Layer shapes the compute fit is measured on: the strong and the weak-base models."""
    return [(build_spec(tuple(run_shape(k, block[k]["grid"], [1, 1, 1])), block["model"]),
             block["batch_size"]) for k in ("strong", "weak")]


def calibrate_point(block: dict, resources_dir: str, round_index: int = 0) -> list[dict]:
    """Microbenchmarks on 2 ranks (ping-pong) + rank-0 compute/IO timings, same machine, same study;
    one round (rows tagged with it), each section with the machine's other load during it."""
    c = block["calibration"]
    data_dir = dataset_for(block, resources_dir, run_shape("strong", block["strong"]["grid"], [1, 1, 1]))
    rows = run_ranks("hpcdl.spatial.calibration:calibrate_rank", 2, {
        "specs": calibration_specs(block), "data_dir": str(data_dir), "sizes_bytes": c["pingpong_bytes"],
        "fractions": c["fractions"], "repeats": c["repeats"], "comm_gap_s": c["comm_gap_ms"] / 1e3},
        timeout_s=block["run_timeout_s"], threads_per_rank=block["threads_per_rank"])[0]
    return [{**r, "round": round_index} for r in rows]


def exactness_point(block: dict, layout: list[int]) -> list[dict]:
    """float64: the partitioned model vs the whole model on `layout`'s spatial ranks."""
    _env(block)
    _, pd, ph = layout
    res = run_ranks("hpcdl.spatial.exactness:model_case", pd * ph, {
        "shape": tuple(block["exactness"]["shape"]), "model": block["model"], "grid": (pd, ph)},
        timeout_s=block["run_timeout_s"])
    return [{"layout": "x".join(map(str, layout)), **{k: v for k, v in r.items() if k != "out_sizes"}}
            for r in res]
