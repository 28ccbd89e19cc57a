"""Save and load checkpoints: synchronous, and asynchronous in CheckFreq's two phases.

Synchronous: write + fsync + manifest + rename while training waits. State on the GPU is first
copied to host memory (fresh pageable memory, as `torch.save` of CUDA tensors does), inside the
timed save: on CUDA the device-to-host copy is part of what a synchronous save costs.
Asynchronous, the same for every format: phase 1 (blocking) copies the state into the saver's
preallocated host snapshot, reused across saves (on the CPU in chunks pulled by a few threads,
host_copy.py), pinned where the state is on the GPU (a D2H DMA
into page-locked memory, bracketed by CUDA events and waited for, so training may overwrite the
weights as soon as it returns); phase 2 persists that snapshot in a background thread through the
same commit path. For DCP, phase 2 is DCP's public writer (`dcp.save` into a `FileSystemWriter`)
run by this process alone, so the background thread never uses a process group training may be
using. DCP's own async staging (stagers, `async_save`) is deliberately not used: its stager
lifecycle differs between torch 2.11 and 2.13, and on 2.11 a stager reused across saves raised
`KeyError: <class 'type'>`, as a closed one does.
A new save first waits for the previous persist, as CheckFreq does, and that wait counts as
blocking. Which path applies follows the device of the tensors given.
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hpcdl.studies.checkpoint import formats, integrity
from hpcdl.studies.checkpoint.host_copy import QueuedCopy

NAN = float("nan")


@dataclass
class SaveTiming:
    """Seconds from the save call to: return (training resumes), durable payload, committed checkpoint.

    d2h_s: a sync save's copy of GPU state to host memory (nan: the state was in host memory);
    snapshot_s: an async save's snapshot phase alone, without waiting for the previous persist;
    persist_s: an async save's background phase, from its start to the committed checkpoint
    (serialisation, fsync, manifest, rename). nan where the phase does not exist.
    """

    path: Path
    file_bytes: int
    blocking_s: float
    durable_s: float
    commit_s: float
    d2h_s: float = NAN
    snapshot_s: float = NAN
    persist_s: float = NAN


def on_gpu(flat: dict) -> bool:
    return any(t.is_cuda for t in flat.values())


def settle(flat: dict) -> None:
    """Wait for queued GPU work (the training step's kernels) before a save's clock starts: the
    save must see the step's result, and its timing must not include the step."""
    if on_gpu(flat):
        torch.cuda.synchronize()


def host_copy(flat: dict) -> dict:
    """`flat` in host memory: GPU tensors copied synchronously into fresh pageable memory."""
    return {k: t.to("cpu") if t.is_cuda else t for k, t in flat.items()}


def save(flat: dict, root: Path, name: str, fmt: str) -> SaveTiming:
    """Synchronous, crash-safe save of a flat tensor dict as checkpoint `root/name` (GPU tensors are
    copied to host memory first, inside the timing)."""
    writer = formats.get(fmt)
    settle(flat)
    t0 = time.perf_counter()
    d2h_s = NAN
    if on_gpu(flat):
        flat = host_copy(flat)  # .to("cpu") returns once the copy is done
        d2h_s = time.perf_counter() - t0
    tmp = integrity.new_tmp_dir(Path(root), name)
    try:
        writer.write(flat, tmp)
        c = integrity.commit(tmp, Path(root) / name, fmt)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SaveTiming(c.path, c.file_bytes, c.committed_at - t0, c.durable_at - t0, c.committed_at - t0,
                      d2h_s=d2h_s)


def load(path: Path) -> dict:
    """Verify `path` against its manifest, then read it with the format the manifest names."""
    return read(path, integrity.verify(Path(path)))


def read(path: Path, manifest: dict) -> dict:
    """Read a checkpoint whose `manifest` was just returned by `integrity.verify`."""
    return formats.get(manifest["format"]).read(Path(path))


class Snapshot:
    """Preallocated host buffers the state is copied into (CheckFreq's snapshot phase): plain CPU
    memory for CPU state, copied in chunks pulled by as many threads as torch uses (host_copy says
    why); pinned (page-locked) memory for GPU state, so the copy is a DMA."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}
        self.pinned = False
        self._host_copy: QueuedCopy | None = None
        self.copy_s = NAN      # wall seconds of the last take(), the copy waited for
        self.gpu_copy_s = NAN  # the same copy on the GPU's clock (CUDA events); nan for CPU state

    def prepare(self, flat: dict) -> None:
        """Allocate and first-touch the buffers so a snapshot is a pure copy."""
        pinned = on_gpu(flat)
        if pinned != self.pinned or {k: (t.shape, t.dtype) for k, t in flat.items()} != \
                {k: (b.shape, b.dtype) for k, b in self.buffers.items()}:
            self.buffers = {}  # release the old buffers before allocating the new ones
            self.buffers = {k: torch.zeros(t.shape, dtype=t.dtype, pin_memory=pinned)
                            for k, t in flat.items()}
            self.pinned = pinned

    def take(self, flat: dict) -> dict:
        self.prepare(flat)
        t0 = time.perf_counter()
        if not self.pinned:
            if self._host_copy is None:
                self._host_copy = QueuedCopy(torch.get_num_threads())
            self._host_copy(self.buffers, flat)
            self.copy_s = time.perf_counter() - t0
            return self.buffers
        # Asynchronous copies on the current stream into page-locked memory, then wait for the last:
        # the snapshot is complete (and the GPU state free to change) once `end` has completed.
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for k, t in flat.items():
            self.buffers[k].copy_(t, non_blocking=True)
        end.record()
        end.synchronize()
        self.copy_s = time.perf_counter() - t0
        self.gpu_copy_s = start.elapsed_time(end) / 1000.0
        return self.buffers


class AsyncCheckpointer:
    """Snapshot-then-persist saves into `root`; `wait()` returns the last save's timing.
    `snapshot` holds the host buffers every save of this saver copies into."""

    def __init__(self, root: Path, fmt: str) -> None:
        self.root, self.fmt = Path(root), fmt
        formats.get(fmt)
        self.snapshot = Snapshot()
        self._thread: threading.Thread | None = None
        self._result: SaveTiming | BaseException | None = None

    def prepare(self, flat: dict) -> None:
        """Allocate the snapshot buffers up front (CheckFreq does this once at start-up)."""
        self.snapshot.prepare(flat)

    def save(self, flat: dict, name: str) -> float:
        """Start a save; returns the blocking seconds (including waiting for the previous persist)."""
        settle(flat)
        t0 = time.perf_counter()
        self._join()  # the snapshot buffers are free again once the previous persist is done
        if isinstance(self._result, BaseException):
            raise self._result
        tmp = integrity.new_tmp_dir(self.root, name)
        final = self.root / name
        t_snap = time.perf_counter()
        snap = self.snapshot.take(flat)
        done = time.perf_counter()
        blocking, snapshot = done - t0, done - t_snap
        if self.fmt == "dcp":
            formats.ignore_dcp_single_process_warning()  # here, on the main thread
        self._result = None
        self._thread = threading.Thread(target=self._persist, args=(snap, tmp, final, t0, done, snapshot),
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

    def _persist(self, snap: dict, tmp: Path, final: Path, t0: float, returned: float,
                 snapshot: float) -> None:
        """Phase 2, on the background thread: write the snapshot, then commit it."""
        try:
            if self.fmt == "dcp":
                formats.dcp_write_alone(snap, tmp)
            else:
                formats.get(self.fmt).write(snap, tmp)
            c = integrity.commit(tmp, final, self.fmt)
            self._result = SaveTiming(c.path, c.file_bytes, returned - t0, c.durable_at - t0,
                                      c.committed_at - t0, snapshot_s=snapshot,
                                      persist_s=c.committed_at - returned)
        except BaseException as e:  # surfaced by the next save() or wait()
            shutil.rmtree(tmp, ignore_errors=True)
            self._result = e
