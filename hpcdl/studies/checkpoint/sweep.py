"""Expand the validated `checkpoint:` block into sweep points (plain dicts, one per task).

Every point carries the study's resolved device (hpcdl.platform.kit.device.study_device, resolved once
by the task app), and a DCP-ranks point on cuda whether its ranks may share a GPU: a point's stored
record is keyed by its whole dict, so one measured on one device is never reused for another."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcdl.studies.checkpoint.instruments import LAYER_WIDTH


def sweep_sizes(min_params: int, max_params: int, points: int) -> list[int]:
    """Geometric parameter counts from min to max, rounded to whole 1024-wide rows, distinct."""
    if points == 1:
        return [max_params]
    raw = np.geomspace(min_params, max_params, points)
    sizes = sorted({max(LAYER_WIDTH, int(round(x / LAYER_WIDTH)) * LAYER_WIDTH) for x in raw})
    return sizes


def scratch_path(cfg: dict) -> Path:
    # absolute: under COMPSs a task runs in its sandbox directory, not where the app started
    return Path(cfg["results_dir"]).absolute() / cfg["checkpoint"]["scratch_dir"]


DEVICES = ("cpu", "cuda")


def _device(device: str) -> str:
    if device not in DEVICES:
        raise ValueError(f"device must be a resolved device ({', '.join(DEVICES)}), got {device!r}")
    return device


def io_points(cfg: dict, device: str) -> list[dict]:
    """(format, mode, size) points in one process, then DCP (ranks, size) points, on `device`."""
    b = cfg["checkpoint"]
    scratch = str(scratch_path(cfg))
    common = {"repeats": b["repeats"], "seed": b["seed"], "cold_load": b["cold_load"],
              "rss_interval_s": b["rss_interval_ms"] / 1000.0, "scratch_limit_mb": b["scratch_limit_mb"],
              "scratch_dir": scratch, "device": _device(device)}
    sharing = {"gpu_sharing": bool(b.get("gpu_sharing", False))} if device == "cuda" else {}
    sizes = sweep_sizes(**b["sizes"])
    # fio's ceiling: at every size, or at the claim's (the largest) only (checkpoint.ceiling_sizes)
    fio_at = set(sizes) if b.get("ceiling_sizes", "all") == "all" else {max(sizes)}
    points = [{"kind": "io", "fmt": f, "mode": m, "n_params": n, **common,
               **({"snapshot_passes": b["snapshot_passes"]} if m == "async" else {"ceiling": n in fio_at})}
              for n in sizes for f in b["formats"] for m in b["modes"]]
    points += [{"kind": "ranks", "ranks": r, "n_params": n, "timeout_s": b["rank_timeout_s"], **common,
                **sharing}
               for n in sizes for r in b["dcp_ranks"]]
    return points


def resume_points(cfg: dict, device: str) -> list[dict]:
    b = cfg["checkpoint"]
    r = b["resume"]
    spec = {**r["model"], "seed": b["seed"]}
    return [{"fmt": f, "scratch_dir": str(scratch_path(cfg)), "spec": spec,
             "steps_total": r["steps_total"], "stop_at": r["stop_at"], "device": _device(device)}
            for f in b["formats"]]


def overhead_points(cfg: dict, device: str) -> list[dict]:
    b = cfg["checkpoint"]
    o = b["overhead"]
    base = {"fmt": o["format"], "scratch_dir": str(scratch_path(cfg)),
            "spec": {**o["model"], "seed": b["seed"]}, "steps": o["steps"], "warmup_steps": o["warmup_steps"],
            "device": _device(device)}
    return [{"mode": m, "interval": k, **base} for m in o["modes"] for k in o["intervals"]]
