"""The study's units of work, each a plain function a task body (tasks/spatial.py) calls once.

A scaling run = one rank launch (hpcdl.platform.kit.rank_runtime.launch.run_ranks) of
hpcdl.studies.spatial.train.train_run on data x depth x height ranks; it returns one summary row and
per-rank, per-iteration rows.

Every launch (scaling runs, the 1-rank and no-communication ceiling runs among them, calibration,
exactness) runs on the device its block names: `device`, the study's device resolved once by the task
app (cpu or cuda), and on CUDA `gpu_sharing` (sweep.placement). The rows say where they were measured.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hpcdl.common.layers import build_spec
from hpcdl.platform import run_ranks
from hpcdl.studies.spatial.data import ensure_dataset
from hpcdl.studies.spatial.sweep import ceiling_point, run_shape

TRAIN = "hpcdl.studies.spatial.train:train_run"


def dataset_for(block: dict, resources_dir: str, shape) -> Path:
    g = block["grf"]
    return ensure_dataset(resources_dir, tuple(shape), block["n_samples"], block["seed"],
                          tuple(g["amplitude"]), tuple(g["ns"]))


def _env(block: dict) -> None:
    os.environ["HPCDL_HALO_TIMEOUT_S"] = str(block["halo_timeout_s"])


def _placed(block: dict) -> dict:
    """run_ranks' device arguments from a unit's block (its resolved device; sharing only on CUDA)."""
    return {"device": block["device"], "gpu_sharing": bool(block.get("gpu_sharing", False))}


def run_point(point: dict, block: dict, resources_dir: str) -> dict:
    """Launch one scaling run; returns {"summary": row, "iterations": rows, "ranks": per-rank rows},
    and where the point measures its ceiling in the same launch (sweep.expand: `paired_ceiling`)
    the ceiling's three under "ceiling"."""
    if "paired_with" in point:
        raise ValueError(f"spatial: {point['run']} is measured in {point['paired_with']}'s launch")
    _env(block)
    data_dir = dataset_for(block, resources_dir, point["shape"])
    d, pd, ph = point["layout"]
    paired = point.get("paired_ceiling")
    t0 = time.time()
    results = run_ranks(TRAIN, point["ranks"], {
        "data_dir": str(data_dir), "n_data": d, "grid": (pd, ph), "model": block["model"],
        "batch_size": point["batch_size"], "iterations": point["iterations"], "lr": block["lr"],
        "seed": block["seed"], "dtype": block["dtype"], "allow_uneven": block["allow_uneven"],
        "overlap": block["overlap"], "bucket_kb": block["bucket_kb"],
        "paired_ceiling": bool(paired),
        "alone_steps": block["warmup"]},
        timeout_s=block["run_timeout_s"], threads_per_rank=block["threads_per_rank"], **_placed(block))
    wall = time.time() - t0
    out = _rows(point, results, wall, "records", "peak_rss_mb", gpu_peak=True)
    if paired:
        # the GPU peak is read before the ceiling's model exists: the strong run's, not the ceiling's
        out["ceiling"] = _rows(ceiling_point(point), results, wall, "ceiling_records", "ceiling_peak_rss_mb",
                               gpu_peak=False)
    return out


def _rows(point: dict, results: list[dict], wall: float, records: str, peak: str, gpu_peak: bool) -> dict:
    """One run's summary, iteration and rank rows from its launch's per-rank results (`records` and
    `peak` name the run's keys there; `gpu_peak`: whether the GPU's peak memory is this run's)."""
    d, pd, ph = point["layout"]
    iters, ranks = [], []
    for res in results:
        for rec in res[records]:
            iters.append({"run": point["run"], "repeat": point["repeat"], "rank": res["rank"], **rec})
        ranks.append({"run": point["run"], "repeat": point["repeat"], "rank": res["rank"],
                      "data_index": res["data_index"],
                      "slab_depth": res["slab_depth"], "slab_height": res["slab_height"],
                      "peak_rss_mb": res[peak], "base_rss_mb": res["base_rss_mb"],
                      "peak_delta_mb": res[peak] - res["base_rss_mb"], "n_params": res["n_params"],
                      "placement": res["placement"],
                      **({"gpu_peak_mb": res["gpu_peak_mb"]} if gpu_peak and "gpu_peak_mb" in res else {})})
    summary = {**{k: v for k, v in point.items() if k not in ("layout", "shape")},
               "data": d, "depth_ranks": pd, "height_ranks": ph,
               "depth": point["shape"][0], "height": point["shape"][1], "width": point["shape"][2],
               "device": results[0]["device"], "placement": results[0]["run_placement"],
               "launch_wall_s": wall, "status": "ok", "error": ""}
    return {"summary": summary, "iterations": iters, "ranks": ranks}


def calibration_specs(block: dict) -> list[tuple[list[dict], int]]:
    """Layer shapes the compute fit is measured on: the strong and the weak-base models, less one whose
    shapes are all held out (sweep.calibrated_kinds; the calibration block carries that list)."""
    return [(build_spec(tuple(run_shape(k, block[k]["grid"], [1, 1, 1])), block["model"]),
             block["batch_size"]) for k in block["calibrated_kinds"]]


def calibrate_point(block: dict, resources_dir: str, round_index: int = 0) -> list[dict]:
    """Microbenchmarks on 2 ranks (ping-pong) + rank-0 compute/IO timings, same machine, same study;
    one round (rows tagged with it), each section with the machine's other load during it."""
    c = block["calibration"]
    data_dir = dataset_for(block, resources_dir, run_shape("strong", block["strong"]["grid"], [1, 1, 1]))
    rows = run_ranks("hpcdl.studies.spatial.calibration.microbench:calibrate_rank", 2, {
        "specs": calibration_specs(block), "data_dir": str(data_dir), "sizes_bytes": c["pingpong_bytes"],
        "fractions": c["fractions"], "repeats": c["repeats"], "comm_gap_s": c["comm_gap_ms"] / 1e3},
        timeout_s=block["run_timeout_s"], threads_per_rank=block["threads_per_rank"], **_placed(block))[0]
    return [{**r, "round": round_index} for r in rows]


def exactness_point(block: dict, layout: list[int]) -> list[dict]:
    """float64: the partitioned model vs the whole model on `layout`'s spatial ranks."""
    _env(block)
    _, pd, ph = layout
    res = run_ranks("hpcdl.studies.spatial.exactness:model_case", pd * ph, {
        "shape": tuple(block["exactness"]["shape"]), "model": block["model"], "grid": (pd, ph)},
        timeout_s=block["run_timeout_s"], **_placed(block))
    return [{"layout": "x".join(map(str, layout)), **{k: v for k, v in r.items() if k != "out_sizes"}}
            for r in res]


def gpu_calibration_point(block: dict, out_dir: str) -> dict:
    """The GPU calibration at the papers' slab shapes (hpcdl.studies.spatial.calibration.gpu) on this task's
    GPU, written to `out_dir`/<gpu>.csv (+ provenance); returns its path and item count."""
    from hpcdl.studies.spatial.calibration import gpu

    if block["device"] != "cuda":
        raise ValueError(f"the GPU calibration runs on cuda, spatial.device resolved to {block['device']}")
    path = gpu.run(block, "cuda", out_dir, "tasks.spatial (spatial.gpu_calibration.in_study)")
    return {"path": str(path), "items": len(gpu.layouts.calibration_items(block))}
