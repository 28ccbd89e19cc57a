"""The slow tier: where offloaded tensors live, and the real copies to and from it.

    FileTier    CPU analogue of ZeRO-Infinity's NVMe offload: two files (persistent optimizer
                state, per-step activation scratch) in a per-run subdirectory of the configured
                directory; copies are os.pwrite / os.preadv on a writer and a reader thread per file
                (they release the GIL, so they overlap with torch compute). io_mode "page_cache" goes
                through the kernel's page cache; "dontneed" fdatasyncs each write and drops its
                pages (POSIX_FADV_DONTNEED) so that reads come from the device.
    PinnedTier  CUDA: pinned host memory; copies on their own CUDA streams (one per direction),
                ordered against the compute stream with events.

A copy returns a Ticket; `ticket.wait()` is the only place the training thread (stream) blocks on
a transfer, and it records that wait on the timeline's "wait" lane (the exposed transfer time).

Run directories are named run-<host>-<pid>-<time> and hold an `owner` file; a new FileTier first
removes every run directory of this host whose process is gone (an interrupted run's leftovers),
and removes its own on close, on error, and at interpreter exit.
"""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hpcdl.studies.offload.procs import pid_alive

IO_MODES = ("page_cache", "dontneed")
RUN_PREFIX = "run-"


class SlowTierError(OSError):
    """The slow-tier directory cannot be used: missing, not writable or full (the message names the path)."""


def remove_stale_runs(root: Path) -> list[Path]:
    """Remove run directories of this host whose owning process no longer exists."""
    removed = []
    host = socket.gethostname()
    for d in sorted(root.glob(f"{RUN_PREFIX}*")):
        try:
            owner_host, pid = (d / "owner").read_text().split()
        except (OSError, ValueError):
            owner_host, pid = host, "-1"  # no readable owner: a run killed while creating its directory
        if owner_host == host and not pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def check_slow_dir(root: str | Path, key: str = "offload.slow_dir") -> Path:
    root = Path(root)
    if not root.is_dir():
        raise SlowTierError(
            errno.ENOENT,
            f"config key '{key}': slow-tier directory {root} does not exist "
            "(create it, or point the key at an existing directory)",
            str(root),
        )
    return root


class Ticket:
    """One copy in flight. wait() blocks the compute lane until it is done and records the wait."""

    def __init__(self, tier, future=None, event=None, keep=None, kind=""):
        self.tier, self.future, self.event, self.keep, self.kind = tier, future, event, keep, kind
        self.done = False

    def wait(self) -> None:
        if self.done:
            return
        tl, clock = self.tier.timeline, self.tier.timeline.clock
        stream = self.tier.compute_stream
        start = clock.mark(stream)
        if self.future is not None:
            self.future.result()  # re-raises an I/O error of the copy (ENOSPC, EROFS, ...)
        else:
            stream.wait_event(self.event)
        tl.add("wait", self.kind, start, clock.mark(stream))
        self.keep, self.done = None, True


class FileTier:
    compute_stream = None

    def __init__(
        self, root: str | Path, timeline, io_mode: str = "page_cache", key: str = "offload.slow_dir"
    ):
        if io_mode not in IO_MODES:
            raise ValueError(f"config key 'offload.io_mode': {io_mode!r} is not allowed; allowed: {IO_MODES}")
        self.root = check_slow_dir(root, key)
        self.key, self.io_mode, self.timeline = key, io_mode, timeline
        remove_stale_runs(self.root)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        self.dir = self.root / f"{RUN_PREFIX}{socket.gethostname()}-{os.getpid()}-{stamp}-{id(self):x}"
        self._fds: dict[str, int] = {}
        try:
            self.dir.mkdir()
            (self.dir / "owner").write_text(f"{socket.gethostname()} {os.getpid()}\n")
            for name in ("optim", "acts"):
                self._fds[name] = os.open(
                    self.dir / f"{name}.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600
                )
        except OSError as exc:
            self.close()
            raise self._error(exc, "cannot create its run directory") from exc
        self._end = {"optim": 0, "acts": 0}
        # one writer and one reader per region: optimizer buckets never queue behind activations
        self._writer = {r: ThreadPoolExecutor(1, thread_name_prefix=f"offload-write-{r}") for r in self._end}
        self._reader = {r: ThreadPoolExecutor(1, thread_name_prefix=f"offload-read-{r}") for r in self._end}
        self._closed = False
        atexit.register(self.close)

    def _error(self, exc: OSError, what: str) -> SlowTierError:
        why = {
            errno.ENOSPC: "is full",
            errno.EDQUOT: "is over its quota",
            errno.EROFS: "is read-only",
            errno.EACCES: "is not writable",
            errno.EPERM: "is not writable",
        }.get(exc.errno, "failed")
        return SlowTierError(
            exc.errno or errno.EIO,
            f"config key '{self.key}': slow-tier directory {self.root} "
            f"{why} ({what}: {exc.strerror or exc}); nothing was left in it",
            str(self.root),
        )

    # --------------------------------------------------------------- space
    def reserve(self, region: str, nbytes: int) -> int:
        """Offset of `nbytes` in a region ("optim": kept for the run; "acts": reset every step)."""
        off = self._end[region]
        self._end[region] = off + nbytes
        return off

    def preallocate(self, region: str) -> None:
        """Claim the region's bytes on disk now, so a full device fails before training starts."""
        n = self._end[region]
        if n:
            try:
                os.posix_fallocate(self._fds[region], 0, n)
            except OSError as exc:
                self.close()
                raise self._error(exc, f"reserving {n} bytes") from exc

    def reset_scratch(self) -> None:
        self._end["acts"] = 0

    def empty(self, shape, dtype):
        """A fast-tier buffer for a read."""
        import torch

        return torch.empty(shape, dtype=dtype)

    # --------------------------------------------------------------- copies
    @staticmethod
    def _bytes(t) -> memoryview:
        import torch

        # as bytes first: numpy has no bfloat16
        return memoryview(t.detach().contiguous().view(-1).view(torch.uint8).numpy())

    def put(self, src, region: str, offset: int, kind: str) -> Ticket:
        buf = self._bytes(src)
        fd, dontneed = self._fds[region], self.io_mode == "dontneed"
        log = self.timeline.current  # the issuing step's log

        def job():
            start = time.perf_counter()
            try:
                done = 0
                while done < len(buf):
                    done += os.pwrite(fd, buf[done:], offset + done)
                if dontneed:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, offset, len(buf), os.POSIX_FADV_DONTNEED)
            except OSError as exc:
                raise self._error(exc, f"writing {len(buf)} bytes") from exc
            if log is not None:
                log.add("to_slow", kind, start, time.perf_counter(), len(buf))

        return Ticket(self, self._writer[region].submit(job), keep=src, kind=kind)

    def get(self, dst, region: str, offset: int, kind: str, after_compute: bool = True, after=None) -> Ticket:
        """`after` (the write's Ticket) is already confirmed by the caller: one writer thread, in order."""
        buf = self._bytes(dst)  # dst is contiguous: this is its own memory
        fd = self._fds[region]
        log = self.timeline.current

        def job():
            start = time.perf_counter()
            done = 0
            while done < len(buf):
                n = os.preadv(fd, [buf[done:]], offset + done)
                if n == 0:
                    raise EOFError(
                        f"slow tier {self.dir}: read past the end of {region}.bin at {offset + done}"
                    )
                done += n
            if log is not None:
                log.add("from_slow", kind, start, time.perf_counter(), len(buf))

        return Ticket(self, self._reader[region].submit(job), keep=dst, kind=kind)

    def sync(self) -> None:
        """Wait (off the timeline) for every queued copy; used between steps."""
        for pool in (*self._writer.values(), *self._reader.values()):
            pool.submit(lambda: None).result()

    def close(self) -> None:
        if getattr(self, "_closed", True) and not self._fds and not getattr(self, "dir", None):
            return
        for pools in (getattr(self, "_writer", {}), getattr(self, "_reader", {})):
            for ex in pools.values():
                ex.shutdown(wait=True)
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        if getattr(self, "dir", None) is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        self._closed = True


class PinnedTier:
    """Slow tier in pinned host memory; one CUDA stream per direction."""

    def __init__(self, timeline, device):
        import torch

        self.torch, self.timeline, self.device = torch, timeline, device
        self.compute_stream = torch.cuda.current_stream(device)
        self.d2h = torch.cuda.Stream(device)
        self.h2d = torch.cuda.Stream(device)
        self._buffers: dict[str, list] = {"optim": [], "acts": []}
        self._next = {"optim": 0, "acts": 0}

    def reserve(self, region: str, nbytes: int) -> int:
        """Index of a pinned buffer of `nbytes` (acts buffers are reused step after step)."""
        i = self._next[region]
        self._next[region] = i + 1
        bufs = self._buffers[region]
        if i == len(bufs):
            bufs.append(self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True))
        elif bufs[i].numel() < nbytes:
            bufs[i] = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)
        return i

    def preallocate(self, region: str) -> None:
        pass

    def reset_scratch(self) -> None:
        self._next["acts"] = 0

    def empty(self, shape, dtype):
        """A GPU buffer for a prefetch, allocated in the copy stream's pool (so the copy need not wait
        for compute to release it) and marked as used by the compute stream, which reads it."""
        torch = self.torch
        with torch.cuda.stream(self.h2d):
            buf = torch.empty(shape, dtype=dtype, device=self.device)
        buf.record_stream(self.compute_stream)
        return buf

    def _view(self, region, index, like):
        n = like.numel() * like.element_size()
        return self._buffers[region][index][:n].view(like.dtype).view(like.shape)

    def put(self, src, region: str, index: int, kind: str) -> Ticket:
        torch, clock = self.torch, self.timeline.clock
        self.d2h.wait_stream(self.compute_stream)  # the tensor is produced on the compute stream
        with torch.cuda.stream(self.d2h):
            start = clock.mark(self.d2h)
            self._view(region, index, src).copy_(src, non_blocking=True)
            end = clock.mark(self.d2h)
        self.timeline.add("to_slow", kind, start, end, src.numel() * src.element_size())
        return Ticket(self, event=end, keep=src, kind=kind)

    def get(self, dst, region: str, index: int, kind: str, after_compute: bool = True, after=None) -> Ticket:
        """after_compute: dst is a buffer compute may still be using (optimizer staging), so the copy
        waits for the compute queued so far; prefetch buffers come from empty() and need not."""
        torch, clock = self.torch, self.timeline.clock
        if after_compute:
            self.h2d.wait_stream(self.compute_stream)
        if after is not None:                          # the copy that wrote this pinned buffer
            self.h2d.wait_event(after.event)
        with torch.cuda.stream(self.h2d):
            start = clock.mark(self.h2d)
            dst.copy_(self._view(region, index, dst), non_blocking=True)
            end = clock.mark(self.h2d)
        self.timeline.add("from_slow", kind, start, end, dst.numel() * dst.element_size())
        return Ticket(self, event=end, keep=dst, kind=kind)

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self._buffers = {"optim": [], "acts": []}
