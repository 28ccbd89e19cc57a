"""What the checkpoint task app's task bodies run (tasks/checkpoint.py).

`run_point` is one (format, mode, size) I/O point in one process: per repeat the save (blocking,
durable, committed), then a verified load with the files evicted from the page cache first (cold
read, unless `cold_load` is off), each with its peak extra RAM (instruments.py). A sync save is
bracketed by two storage-ceiling probes of the same bytes, written the way the save writes them
right before and right after it; every timed write (probe or save) follows an untimed page-cache
warm-up of its size (instruments.warm_pages). The repeat's ceiling is the FASTER probe, the most
favourable ceiling of the save's own moment (paired per repeat): a noisy probe can only lower the
ratio, never make a pass easier; the two probes' disagreement is kept as the ceiling's noise.
Async points probe no ceiling (nothing compares async bandwidth with it), which pays for the
second sync probe.

On `device="cuda"` the state lives on the GPU: a sync save's time includes its device-to-host copy
(`d2h_s`), an async save blocks for the snapshot into pinned host memory only (`snapshot_s`; the
background serialisation + fsync + commit is `persist_s`), each probe of the ceiling is the D2H
ceiling of the same bytes plus the storage ceiling (instruments.CEILINGS, the `ceiling` column),
and `load_s` includes copying the loaded state back onto the GPU.

The other task bodies' functions live in their own modules and are exposed here: `ranks_point`
(DCP from N ranks, distributed.py), `resume_check` and `overhead_run` (training-state
checkpoints, training.py).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from hpcdl.studies.checkpoint import integrity, saver
from hpcdl.studies.checkpoint.distributed import run_point as ranks_point
from hpcdl.studies.checkpoint.instruments import (
    CEILINGS,
    PeakRSS,
    check_scratch_budget,
    d2h_ceiling,
    on_device,
    storage_ceiling,
    synthetic_state,
    warm_pages,
)
from hpcdl.studies.checkpoint.state import tensor_bytes
from hpcdl.studies.checkpoint.training import overhead_run, resume_check

__all__ = ["overhead_run", "ranks_point", "resume_check", "run_point"]


def _warm_up(root: Path, fmt: str, device: str = "cpu") -> None:
    """One untimed tiny save + load: the format's first call in a process pays imports and set-up
    (on cuda also the first device-to-host copy)."""
    t = saver.save(on_device({"w": torch.zeros(16)}, device), root, "warm-up", fmt)
    saver.load(t.path)
    shutil.rmtree(t.path)


def ceiling_pair(nbytes: int, before_s: float, after_s: float, write_bw: float) -> dict:
    """The repeat's ceiling: the faster of the probes around its save (so a slow, noisy probe lowers
    the save's ratio instead of raising it), the save's paired ratio to it, and the probes' relative
    disagreement |bw_before - bw_after| / their mean (the ceiling's own noise, evidence only)."""
    bw_before, bw_after = nbytes / before_s, nbytes / after_s
    ceiling_s = min(before_s, after_s)
    return {"ceiling_before_s": before_s, "ceiling_after_s": after_s, "ceiling_s": ceiling_s,
            "ceiling_bw_bytes_per_s": nbytes / ceiling_s, "bw_over_ceiling": write_bw * ceiling_s / nbytes,
            "ceiling_spread": abs(bw_before - bw_after) / ((bw_before + bw_after) / 2)}


def _parts(st_before: float, d2h_before: float, st_after: float, d2h_after: float, cuda: bool) -> dict:
    """The storage and D2H parts of the faster probe (nan where none was taken)."""
    st, d2h = min((st_before, d2h_before), (st_after, d2h_after), key=sum)
    return {"storage_ceiling_s": st, "d2h_ceiling_s": d2h if cuda else float("nan")}


def _snapshot_passes(ckpt: saver.AsyncCheckpointer, flat: dict, passes: int) -> list[float]:
    """Wall seconds of `passes` more snapshot copies of `flat` into the saver's own buffers (each
    Snapshot.take's own `copy_s`, after the state's queued GPU work has settled, as a save starts)."""
    out = []
    for _ in range(passes):
        saver.settle(flat)
        ckpt.snapshot.take(flat)
        out.append(ckpt.snapshot.copy_s)
    return out


def _typical_blocking(timing: saver.SaveTiming, extra: list[float]) -> float:
    """The save's blocking time with its snapshot copy replaced by the median of all the repeat's
    snapshot copies (the save's own and `extra`); a sync save's own blocking time. On the laptop VM
    2-4 in 60 copies of 256 MiB stall for 40-140 ms on the host (no guest fault, no steal), so one
    copy's time is the host's draw; the median of three needs two of them stalled."""
    if not extra or not np.isfinite(timing.snapshot_s):
        return timing.blocking_s
    return timing.blocking_s - timing.snapshot_s + float(np.median([timing.snapshot_s, *extra]))


def run_point(fmt: str, mode: str, n_params: int, scratch_dir: str, *, repeats: int = 1,
              seed: int = 0, cold_load: bool = True, rss_interval_s: float = 0.002,
              scratch_limit_mb: float | None = None, device: str = "cpu",
              snapshot_passes: int = 1) -> list[dict]:
    """Measure one (format, mode, size) point with the state on `device`; one record per repeat.
    An async repeat times `snapshot_passes` snapshot copies in all (its save's own, then the rest
    once the save is durable) and records their median as `blocking_typical_s` (see
    `_typical_blocking`). Scratch is removed after."""
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
    if int(snapshot_passes) != snapshot_passes or snapshot_passes < 1:
        raise ValueError(f"snapshot_passes must be a whole number >= 1, got {snapshot_passes!r}")
    if device not in CEILINGS:
        raise ValueError(f"device must be a resolved device, cpu or cuda; got {device!r}")
    cuda = device == "cuda"
    nan = float("nan")
    root = Path(scratch_dir) / f"{fmt}-{mode}-{n_params}-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    try:
        flat = on_device(synthetic_state(n_params, seed), device)
        nbytes = tensor_bytes(flat)
        # The checkpoint and the probe after it (or its page-cache warm-up, deleted first) coexist briefly.
        check_scratch_budget(root, 2 * nbytes + (1 << 20),
                             None if scratch_limit_mb is None else int(scratch_limit_mb * 2**20))
        _warm_up(root, fmt, device)
        ckpt = saver.AsyncCheckpointer(root, fmt) if mode == "async" else None
        if ckpt is not None:
            ckpt.prepare(flat)
        # the D2H ceiling's pinned buffers, allocated once per point (outside every timing)
        pinned = saver.Snapshot() if cuda and ckpt is None else None
        if pinned is not None:
            pinned.prepare(flat)

        # what a probe writes: the state's own host bytes (on cuda, the D2H ceiling's pinned copy)
        host = list((pinned.buffers if pinned is not None else flat).values()) if ckpt is None else None

        def probe(after: bool) -> tuple[float, float]:
            """(storage ceiling s, D2H ceiling s: 0 for state in host memory) of the state's bytes;
            the storage probe is the one next to the save."""
            d2h = d2h_ceiling(flat, pinned) if pinned is not None and not after else 0.0
            storage = storage_ceiling(root, nbytes, host)
            if pinned is not None and after:
                d2h = d2h_ceiling(flat, pinned)
            return storage, d2h

        rows = []
        for rep in range(repeats):
            name = f"rep-{rep:03d}"
            st_before, d2h_before = probe(after=False) if ckpt is None else (nan, nan)
            warm_pages(root, nbytes)  # as before each probe: the save's page cache as warm as theirs
            with PeakRSS(rss_interval_s) as save_mem:
                if ckpt is None:
                    timing = saver.save(flat, root, name, fmt)
                else:
                    ckpt.save(flat, name)
                    timing = ckpt.wait()
            st_after, d2h_after = probe(after=True) if ckpt is None else (nan, nan)
            # after the save is durable, so the extra copies neither warm nor contend with its own
            extra = _snapshot_passes(ckpt, flat, snapshot_passes - 1) if ckpt is not None else []
            if cold_load:
                integrity.evict_from_page_cache(timing.path)
            t0 = time.perf_counter()
            with PeakRSS(rss_interval_s) as load_mem:
                manifest = integrity.verify(timing.path)
                t1 = time.perf_counter()
                back = saver.read(timing.path, manifest)
                if cuda:  # restored where the state lives
                    back = on_device(back, device)
            load_s = time.perf_counter() - t0
            ok = back.keys() == flat.keys() and all(torch.equal(back[k], flat[k]) for k in flat)
            del back
            shutil.rmtree(timing.path)
            integrity.fsync_dir(root)  # the deletion's journal commit must not land in the next timing
            rows.append({
                "device": device, "format": fmt, "mode": mode, "process_group": False, "ranks": 1,
                "n_params": n_params, "repeat": rep,
                "state_bytes": nbytes, "file_bytes": timing.file_bytes,
                "blocking_s": timing.blocking_s, "durable_s": timing.durable_s,
                "commit_s": timing.commit_s, "load_s": load_s, "verify_s": t1 - t0,
                "d2h_s": timing.d2h_s, "snapshot_s": timing.snapshot_s, "persist_s": timing.persist_s,
                "snapshot_passes_s": (" ".join(f"{t:.6g}" for t in [timing.snapshot_s, *extra])
                                      if ckpt is not None else ""),
                "blocking_typical_s": _typical_blocking(timing, extra),
                "write_bw_bytes_per_s": timing.file_bytes / timing.durable_s,
                # the ceiling of each moment: D2H (on cuda) then storage, the two as a save does them
                **ceiling_pair(nbytes, st_before + d2h_before, st_after + d2h_after,
                               timing.file_bytes / timing.durable_s),
                "ceiling": CEILINGS[device] if ckpt is None else "",
                # the parts of the faster probe (the ceiling)
                **_parts(st_before, d2h_before, st_after, d2h_after, pinned is not None),
                "save_peak_extra_rss_bytes": save_mem.peak_extra_bytes,
                "load_peak_extra_rss_bytes": load_mem.peak_extra_bytes,
                "roundtrip_ok": bool(ok), "cold_load": bool(cold_load),
            })
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)
