"""What every I/O point measures with, in one process or on N ranks: a synthetic fp32 model state
(in host memory, or on the GPU), the bandwidth ceiling and the peak extra RAM, and the scratch budget
a point must fit in.

The single-process points' storage ceiling is fio's (fio.py, warmed by `warm_pages` like a save). The
DCP ranks points' own probe is the same bytes written the way a save writes them (`storage_ceiling`): a fresh
staging directory next to the checkpoints, one file written through a Python file object, fsync'd
with the saves' own `integrity.make_durable`, timed from before the mkdir to durable like a save's
`durable_s`; only the format's encoding is missing. Before it and before every save, `warm_pages`
writes as many bytes into a scratch file and deletes it (untimed), so each timed write refills
page-cache pages the kernel has just freed. Why: on a VM whose free memory goes back to the host
(virtio-balloon free page reporting; DAMON reclaims cold page cache) the first touch of such a page
faults in the host. A probe that got those pages wrote at ~0.4 GB/s while the save right after it,
refilling the pages the probe had just freed, wrote at ~2 GB/s: safetensors "beat the ceiling" 3-5x
(the fsync phase and O_DIRECT writes were steady at 1.4-3 GB/s: the disk was not the cause).

State on the GPU must first reach host memory, so there the ceiling is the D2H copy ceiling (the
same tensors copied into preallocated pinned host memory, `d2h_ceiling`) followed by the storage
ceiling: the fastest any save could move those bytes from GPU memory to durable storage, one after
the other as a synchronous save does (`CEILINGS`).

Peak extra RAM is the peak process RSS above the RSS just before the operation, sampled with
psutil every `rss_interval_s` by a background thread (a spike shorter than the interval can be
missed; tracemalloc cannot see torch's allocations).
Freed heap is returned to the OS before each baseline (glibc `malloc_trim`) so reuse of memory an
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

from hpcdl.studies.checkpoint import integrity

LAYER_WIDTH = 1024
LAYER_PARAMS = 1 << 22  # 16 MiB fp32 per tensor: many tensors, as in a real state_dict
# Which ceiling a save's bandwidth is divided by, on each device (the tables' `ceiling` column; what
# measured its storage part is `ceiling_source`: fio, or the DCP ranks points' own probe).
CEILINGS = {"cpu": "storage (write+fsync)",
            "cuda": "D2H pinned memcpy + storage (write+fsync)"}


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


def on_device(flat: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    """`flat` where the study's state lives: as is on the CPU, copied to the GPU on cuda (the
    values are generated on the CPU either way, so both devices hold the same state)."""
    if device == "cpu":
        return flat
    if device != "cuda":
        raise ValueError(f"device must be a resolved device, cpu or cuda; got {device!r}")
    out = {k: t.to("cuda") for k, t in flat.items()}
    torch.cuda.synchronize()
    return out


def d2h_ceiling(flat: dict[str, torch.Tensor], snapshot) -> float:
    """Seconds to copy the GPU tensors of `flat` into `snapshot`'s pinned host buffers
    (saver.Snapshot, prepared): the device-to-host copy ceiling of the same bytes."""
    from hpcdl.studies.checkpoint.saver import on_gpu

    if not on_gpu(flat):
        raise ValueError("d2h_ceiling needs state on the GPU")
    torch.cuda.synchronize()
    snapshot.take(flat)
    return snapshot.copy_s


def warm_pages(directory: Path, nbytes: int, chunk: int = 8 << 20) -> None:
    """Write `nbytes` into a scratch file in `directory` and delete it, never fsync'd (its dirty pages
    are dropped, nothing reaches the disk), untimed, right before a timed write of as many bytes: that
    write then refills page-cache pages the kernel has just freed, as a save right after a probe
    does, instead of pages a VM's host took back (module docstring). Touching anonymous memory
    instead did not help there: only pages freed by the page cache itself were reused."""
    if nbytes <= 0:
        return
    path = directory / f".warm-{os.getpid()}"
    zeros = memoryview(bytes(min(chunk, nbytes)))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, zeros[:min(left, len(zeros))])
    finally:
        os.close(fd)
        path.unlink()
    integrity.fsync_dir(directory)  # the create + delete committed now, not inside the timed write


def _chunks(tensors, nbytes: int, chunk: int):
    """The bytes a probe writes: the state's own tensors (what a save writes), else `nbytes` of
    random data in `chunk`-byte writes."""
    if tensors is not None:
        for t in tensors:
            yield memoryview(t.detach().contiguous().view(-1).view(torch.uint8).numpy())
        return
    buf = memoryview(os.urandom(min(chunk, max(nbytes, 1))))
    left = nbytes
    while left > 0:
        yield buf[:min(left, len(buf))]
        left -= min(left, len(buf))


def write_probe(directory: Path, nbytes: int, tensors=None, chunk: int = 8 << 20) -> tuple[Path, float]:
    """Write the probe the way a save writes (module docstring): a fresh staging directory in
    `directory`, one file through a Python file object (the host tensors `tensors`, one write each,
    else `nbytes` of random data in `chunk`-byte writes), `integrity.make_durable`. Returns the
    staging directory, left in place, and the seconds from before its mkdir to durable."""
    t0 = time.perf_counter()
    tmp = integrity.new_tmp_dir(directory, "ceiling")
    try:
        with open(tmp / "probe.bin", "wb") as f:
            for part in _chunks(tensors, nbytes, chunk):
                f.write(part)
        return tmp, integrity.make_durable(tmp) - t0
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def storage_ceiling(directory: Path, nbytes: int, tensors=None, chunk: int = 8 << 20) -> float:
    """Seconds of one storage-ceiling probe of `nbytes` in `directory` (`write_probe`), its pages
    warmed first; the probe is removed after and the removal committed, both untimed."""
    directory.mkdir(parents=True, exist_ok=True)
    warm_pages(directory, nbytes)
    tmp, elapsed = write_probe(directory, nbytes, tensors, chunk)
    shutil.rmtree(tmp)
    integrity.fsync_dir(directory)  # commit the removal now, not inside the next timed write
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
