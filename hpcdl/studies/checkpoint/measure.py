"""One sweep point: save/load cost of a synthetic fp32 model state in one format and mode.

Per repeat it measures the storage ceiling (the same byte count written sequentially
in 8 MiB chunks and fsync'd into the same directory, like `dd bs=8M conv=fsync`),
then the save (blocking, durable, committed), then a verified load with the files
evicted from the page cache first (cold read, unless `cold_load` is off). Peak extra
RAM is the peak process RSS above the RSS just before the operation, sampled with
psutil every `rss_interval_s` by a background thread (a spike shorter than the
interval can be missed; tracemalloc cannot see torch's allocations). Freed heap is
returned to the OS before each baseline (glibc `malloc_trim`) so reuse of memory an
earlier repeat freed does not hide growth.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
import time
from pathlib import Path

import psutil
import torch

from hpcdl.studies.checkpoint import integrity, saver
from hpcdl.studies.checkpoint.state import tensor_bytes

LAYER_WIDTH = 1024
LAYER_PARAMS = 1 << 22  # 16 MiB fp32 per tensor: many tensors, as in a real state_dict


class PeakRSS:
    """Context manager: `.peak_extra_bytes` = max sampled RSS minus RSS at entry."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.peak_extra_bytes = 0
        self._proc = psutil.Process()
        self._stop = threading.Event()

    def __enter__(self) -> PeakRSS:
        _release_free_heap()
        self._base = self._peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self._proc.memory_info().rss)
            self._stop.wait(self.interval_s)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._proc.memory_info().rss)
        self.peak_extra_bytes = self._peak - self._base


def _release_free_heap() -> None:
    """Hand freed heap pages back to the OS (glibc) so the baseline RSS is not inflated by
    memory an earlier operation freed but kept, which would hide the next one's growth."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def synthetic_state(n_params: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A flat fp32 state of exactly `n_params` values split into (rows, 1024) 'layers'."""
    if n_params < 1:
        raise ValueError(f"n_params must be >= 1, got {n_params}")
    g = torch.Generator().manual_seed(seed)
    out, left, i = {}, n_params, 0
    while left > 0:
        n = min(left, LAYER_PARAMS)
        rows, rest = divmod(n, LAYER_WIDTH)
        if rows:
            out[f"layers.{i}.weight"] = torch.randn(rows, LAYER_WIDTH, generator=g)
        if rest:
            out[f"layers.{i}.bias"] = torch.randn(rest, generator=g)
        left -= n
        i += 1
    return out


def storage_ceiling(directory: Path, nbytes: int, chunk: int = 8 << 20) -> float:
    """Seconds to write `nbytes` sequentially and fsync them in `directory` (file removed after)."""
    directory.mkdir(parents=True, exist_ok=True)
    buf = memoryview(os.urandom(min(chunk, max(nbytes, 1))))
    path = directory / f".ceiling-{os.getpid()}"
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, buf[:min(left, len(buf))])
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - t0
    path.unlink()
    integrity.fsync_dir(directory)  # commit the unlink now, not inside the next timed write
    return elapsed


def check_scratch_budget(directory: Path, need_bytes: int, limit_bytes: int | None) -> None:
    """Refuse a point that would exceed the configured scratch budget or the free disk space."""
    if limit_bytes is not None and need_bytes > limit_bytes:
        raise RuntimeError(f"point needs ~{need_bytes / 2**20:.0f} MiB of scratch, over the "
                           f"configured checkpoint.scratch_limit_mb ({limit_bytes / 2**20:.0f} MiB)")
    free = shutil.disk_usage(directory).free
    if need_bytes > free:
        raise RuntimeError(f"point needs ~{need_bytes / 2**20:.0f} MiB of scratch, only "
                           f"{free / 2**20:.0f} MiB free in {directory}")


def _warm_up(root: Path, fmt: str) -> None:
    """One untimed tiny save + load: the format's first call in a process pays imports and set-up."""
    t = saver.save({"w": torch.zeros(16)}, root, "warm-up", fmt)
    saver.load(t.path)
    shutil.rmtree(t.path)


def run_point(fmt: str, mode: str, n_params: int, scratch_dir: str, *, repeats: int = 1,
              seed: int = 0, cold_load: bool = True, rss_interval_s: float = 0.002,
              scratch_limit_mb: float | None = None) -> list[dict]:
    """Measure one (format, mode, size) point; one record per repeat. Scratch is removed after."""
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
    root = Path(scratch_dir) / f"{fmt}-{mode}-{n_params}-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    try:
        flat = synthetic_state(n_params, seed)
        nbytes = tensor_bytes(flat)
        # Checkpoint + ceiling file can coexist briefly.
        check_scratch_budget(root, 2 * nbytes + (1 << 20),
                             None if scratch_limit_mb is None else int(scratch_limit_mb * 2**20))
        _warm_up(root, fmt)
        ckpt = saver.AsyncCheckpointer(root, fmt) if mode == "async" else None
        if ckpt is not None:
            ckpt.prepare(flat)
        rows = []
        for rep in range(repeats):
            ceiling_s = storage_ceiling(root, nbytes)
            name = f"rep-{rep:03d}"
            with PeakRSS(rss_interval_s) as save_mem:
                if ckpt is None:
                    timing = saver.save(flat, root, name, fmt)
                else:
                    ckpt.save(flat, name)
                    timing = ckpt.wait()
            if cold_load:
                integrity.evict_from_page_cache(timing.path)
            t0 = time.perf_counter()
            with PeakRSS(rss_interval_s) as load_mem:
                manifest = integrity.verify(timing.path)
                t1 = time.perf_counter()
                back = saver.read(timing.path, manifest)
            load_s = time.perf_counter() - t0
            ok = back.keys() == flat.keys() and all(torch.equal(back[k], flat[k]) for k in flat)
            del back
            shutil.rmtree(timing.path)
            integrity.fsync_dir(root)  # the deletion's journal commit must not land in the next timing
            rows.append({
                "format": fmt, "mode": mode, "process_group": False, "ranks": 1, "n_params": n_params,
                "repeat": rep,
                "state_bytes": nbytes, "file_bytes": timing.file_bytes,
                "blocking_s": timing.blocking_s, "durable_s": timing.durable_s,
                "commit_s": timing.commit_s, "load_s": load_s, "verify_s": t1 - t0,
                "write_bw_bytes_per_s": timing.file_bytes / timing.durable_s,
                "ceiling_s": ceiling_s, "ceiling_bw_bytes_per_s": nbytes / ceiling_s,
                "save_peak_extra_rss_bytes": save_mem.peak_extra_bytes,
                "load_peak_extra_rss_bytes": load_mem.peak_extra_bytes,
                "roundtrip_ok": bool(ok), "cold_load": bool(cold_load),
            })
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)

