"""Save and load checkpoints: synchronous, and asynchronous in CheckFreq's two phases.

Synchronous: write + fsync + manifest + rename while training waits.
Asynchronous: phase 1 (blocking) copies the state into preallocated CPU buffers;
phase 2 persists that snapshot in a background thread through the same commit path.
DCP uses its own `async_save` (it stages to CPU itself, with its staging buffers
cached across saves) and the commit runs once its future completes. A new save first
waits for the previous persist, as CheckFreq does, and that wait counts as blocking.
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hpcdl.studies.checkpoint import formats, integrity


@dataclass
class SaveTiming:
    """Seconds from the save call to: return (training resumes), durable payload, committed checkpoint."""

    path: Path
    file_bytes: int
    blocking_s: float
    durable_s: float
    commit_s: float


def save(flat: dict, root: Path, name: str, fmt: str) -> SaveTiming:
    """Synchronous, crash-safe save of a flat tensor dict as checkpoint `root/name`."""
    writer = formats.get(fmt)
    t0 = time.perf_counter()
    tmp = integrity.new_tmp_dir(Path(root), name)
    try:
        writer.write(flat, tmp)
        c = integrity.commit(tmp, Path(root) / name, fmt)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SaveTiming(c.path, c.file_bytes, c.committed_at - t0, c.durable_at - t0, c.committed_at - t0)


def load(path: Path) -> dict:
    """Verify `path` against its manifest, then read it with the format the manifest names."""
    return read(path, integrity.verify(Path(path)))


def read(path: Path, manifest: dict) -> dict:
    """Read a checkpoint whose `manifest` was just returned by `integrity.verify`."""
    return formats.get(manifest["format"]).read(Path(path))


class Snapshot:
    """Preallocated CPU buffers the state is copied into (CheckFreq's snapshot phase)."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def prepare(self, flat: dict) -> None:
        """Allocate and first-touch the buffers so a snapshot is a pure copy."""
        if {k: (t.shape, t.dtype) for k, t in flat.items()} != \
                {k: (b.shape, b.dtype) for k, b in self.buffers.items()}:
            self.buffers = {k: torch.zeros_like(t, device="cpu") for k, t in flat.items()}

    def take(self, flat: dict) -> dict:
        self.prepare(flat)
        for k, t in flat.items():
            self.buffers[k].copy_(t)
        return self.buffers


class AsyncCheckpointer:
    """Snapshot-then-persist saves into `root`; `wait()` returns the last save's timing."""

    def __init__(self, root: Path, fmt: str) -> None:
        self.root, self.fmt = Path(root), fmt
        formats.get(fmt)
        self._snapshot = Snapshot()
        self._thread: threading.Thread | None = None
        self._result: SaveTiming | BaseException | None = None
        self._dcp_stager = None

    def prepare(self, flat: dict) -> None:
        """Allocate the snapshot buffers up front (CheckFreq does this once at start-up)."""
        if self.fmt == "dcp":
            self._stager().stage(flat)
        else:
            self._snapshot.prepare(flat)

    def save(self, flat: dict, name: str) -> float:
        """Start a save; returns the blocking seconds (including waiting for the previous persist)."""
        t0 = time.perf_counter()
        self._join()
        if isinstance(self._result, BaseException):
            raise self._result
        tmp = integrity.new_tmp_dir(self.root, name)
        final = self.root / name
        if self.fmt == "dcp":
            future = self._dcp_async_save(flat, tmp)
            target, args = self._finish_dcp, (future, tmp, final)
        else:
            snap = self._snapshot.take(flat)
            target, args = self._persist, (snap, tmp, final)
        blocking = time.perf_counter() - t0
        self._result = None
        self._thread = threading.Thread(target=self._guard, args=(target, args, tmp, t0, blocking),
                                        daemon=True)
        self._thread.start()
        return blocking

    def wait(self) -> SaveTiming | None:
        self._join()
        if isinstance(self._result, BaseException):
            raise self._result
        return self._result

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _guard(self, target, args, tmp: Path, t0: float, blocking: float) -> None:
        try:
            c = target(*args)
            self._result = SaveTiming(c.path, c.file_bytes, blocking, c.durable_at - t0,
                                      c.committed_at - t0)
        except BaseException as e:  # surfaced by the next save() or wait()
            shutil.rmtree(tmp, ignore_errors=True)
            self._result = e

    def _persist(self, snap: dict, tmp: Path, final: Path) -> integrity.Commit:
        formats.get(self.fmt).write(snap, tmp)
        return integrity.commit(tmp, final, self.fmt)

    def _dcp_async_save(self, flat: dict, tmp: Path):
        import torch.distributed.checkpoint as dcp

        with formats.quiet_dcp():
            return dcp.async_save(flat, storage_writer=dcp.FileSystemWriter(str(tmp)),
                                  async_stager=self._stager(), no_dist=formats.dcp_no_dist())

    def _stager(self):
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._dcp_stager is None:
            # Plain (unpinned, CPU-only) staging whose buffers DCP caches across saves:
            # its counterpart of CheckFreq's preallocated snapshot.
            self._dcp_stager = DefaultStager(StagingOptions(
                use_pinned_memory=False, use_shared_memory=False, use_async_staging=False,
                use_non_blocking_copy=False))
        return self._dcp_stager

    def _finish_dcp(self, future, tmp: Path, final: Path) -> integrity.Commit:
        with formats.quiet_dcp():  # DCP's writer thread warns while this waits
            future.result()
        return integrity.commit(tmp, final, self.fmt)
