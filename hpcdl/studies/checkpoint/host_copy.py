"""The CPU snapshot copy: host tensors into preallocated host buffers, in byte chunks that a few
threads pull from one queue.

Why not `buffer.copy_(tensor)`: torch splits each copy over its intra-op threads in equal static
parts and returns when the slowest part is done. On the 2-core laptop a copy of 256 MiB took 17 ms,
but 60-130 ms whenever anything else (a kernel flusher, another process) took one core for a moment:
the copy then waited for its preempted half. Pulled from a queue, the chunks a preempted thread
would have copied go to the other thread: measured beside a process spinning on one core, the queued
copy took 23-38 ms where `copy_` took up to 135 ms, and on an idle machine both took 13-17 ms
(benchmarks/snapshot_copy.py). Each chunk is copied by numpy, which releases the GIL and starts no
thread team of its own.

What this does not remove: in three fresh-clone runs of 007af56 (#59) the async save's own copy
still stalled in 2, 4 and 0 of 25 saves (up to 0.30 s), while the copies made just after it did not.
The stall needs the VM's free page reporting (virtio-balloon hands pages the guest frees back to the
host). In a loop of 256 MiB copies, each after a 256 MiB page-cache write and unlink like the
study's warm-up, 8-12 of 300 copies took 0.10-0.16 s with reporting on, their threads using about
5x the CPU of a normal copy with no page fault or steal in the guest; with reporting off
(/sys/module/page_reporting/parameters/page_reporting_order above the largest order) 0 of 300 did.
Without the write and unlink, 0 of 200 did. The stall does not follow the kernel's count of reported
pages closely enough to predict: waiting before each save until nothing was reported for 0.6 s left
6 of 100 own copies stalled, against 2 of 100 without the wait. The study changes no kernel setting
of the machine it runs on; the async claim judges the copies as they came.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

CHUNK_BYTES = 8 << 20  # small enough that a preempted chunk is a short wait, large enough to stream


def _byte_view(t: torch.Tensor) -> np.ndarray:
    """A contiguous tensor's bytes as a flat numpy array (any dtype, bfloat16 included)."""
    return t.reshape(-1).view(torch.uint8).numpy()


class QueuedCopy:
    """Copies `src[k]` into `dst[k]` for every key with `threads` threads pulling chunks from one
    queue; tensors that are not contiguous CPU tensors are copied by torch, after the queue."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="snapshot-copy")

    def __call__(self, dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
        chunks, rest = [], []
        for k, t in src.items():
            b = dst[k]
            if t.device.type != "cpu" or not (t.is_contiguous() and b.is_contiguous()):
                rest.append(k)
                continue
            s, d = _byte_view(t), _byte_view(b)
            chunks += [(d[a:a + CHUNK_BYTES], s[a:a + CHUNK_BYTES]) for a in range(0, s.size, CHUNK_BYTES)]
        queue, lock = iter(chunks), threading.Lock()

        def pull() -> None:
            while True:
                with lock:
                    item = next(queue, None)
                if item is None:
                    return
                np.copyto(item[0], item[1])

        for f in [self._pool.submit(pull) for _ in range(min(self.threads, len(chunks)))]:
            f.result()  # re-raises a worker's error here
        for k in rest:
            dst[k].copy_(src[k])

    def close(self) -> None:
        self._pool.shutdown(wait=True)
