"""The process's own memory, as a CPU run's fast tier is measured (train.py): the anonymous resident
bytes now (`rss_bytes`), their high-water mark sampled on a thread during a run (`PeakRss`), and the
two steps that let a run start from a clean heap (`warm_process`, `trim_heap`)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading

import torch


def rss_bytes() -> int:
    """The process's anonymous resident bytes now (resident - file-backed/shared, Linux /proc; no psutil,
    so the GPU probe needs only torch). Library code paged in on first use is file-backed and not
    memory the training holds, so it is left out; heap, tensors, thread stacks and arenas count."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * _PAGE


_PAGE = os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """The process's resident set sampled on a thread, for the peak during a run."""

    def __init__(self, interval_s: float):
        self.interval = interval_s
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.interval)

    def restart(self) -> None:
        self.peak = rss_bytes()

    def now(self) -> int:
        """The peak so far, this instant included (a step's end: no sample can miss what it holds)."""
        self.peak = max(self.peak, rss_bytes())
        return self.peak

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        return False


_WARM = []


def warm_process() -> None:
    """One Adam step on a 4-element tensor, once per process: torch.optim's first step imports modules
    (tens of MiB of Python objects) that would otherwise count as the memory of whichever run is first
    in a worker process."""
    if not _WARM:
        p = torch.nn.Parameter(torch.zeros(4))
        opt = torch.optim.Adam([p])
        p.sum().backward()
        opt.step()
        _WARM.append(True)


def trim_heap() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
