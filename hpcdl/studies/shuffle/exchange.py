"""Partial-Q exchange of the samples themselves: in host memory over gloo in a background thread
(`BackgroundExchange`, the default), or as CUDA tensors over NCCL (`DeviceExchange`).

Host memory (shuffle.exchange_device: host). The exchange uses its own gloo process group: collectives
of one group must be issued in the same order on every rank, and DDP's all-reduces run on the default
group in the main thread at the same time. A peer that dies or stalls makes all_to_all_single raise
(gloo closes the connection, or the group's timeout expires); the error is re-raised in the main
thread as ExchangeError naming the epoch and rank.

On the rank's GPU (exchange_device: device). The samples never leave the GPU: the all_to_all runs on
the default NCCL group, issued from the main thread before the epoch's first step. Not a second NCCL
group beside DDP's: NCCL kernels spin until every peer joins, and two communicators whose operations
are in flight at once may deadlock (NCCL's user guide, "Using multiple NCCL communicators
concurrently"; torch's new_group warns the same). On one group the order of operations is the
program's, the same on every rank: the exchange first, then DDP's all-reduces, which queue behind it
on the group's stream. The exchange overlaps the first steps' compute; a slow exchange delays the
first gradient all-reduce (timed in that step's fwd_bwd_s), and what remains at the epoch's end is
its exposed part. A dead peer leaves the kernel spinning: the host polls the exchange's end event
and raises ExchangeError after the timeout (the group's watchdog aborts it in any case).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist


class ExchangeError(RuntimeError):
    pass


@dataclass
class Outcome:
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None
    ids: torch.Tensor | None = None
    bytes_sent: int = 0
    bytes_recv: int = 0
    time_s: float = 0.0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


def _a2a(send: torch.Tensor, send_counts: list[int], recv_counts: list[int], group) -> torch.Tensor:
    out = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype)
    dist.all_to_all_single(out, send, output_split_sizes=recv_counts, input_split_sizes=send_counts,
                           group=group)
    return out


def _die() -> None:
    # fault injection for tests: this rank vanishes in the middle of an exchange
    os._exit(17)


class BackgroundExchange:
    """Start sending staged samples now; `wait()` returns what arrived (blocking only if still running)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor, send_counts: np.ndarray,
                 recv_counts: np.ndarray, group, epoch: int, die_before_send: bool = False):
        self.epoch, self.rank = epoch, dist.get_rank()
        self.outcome = Outcome()
        self.staged = (x, y, ids)  # the send buffers, for counting what the rank holds at its peak
        sc, rc = [int(c) for c in send_counts], [int(c) for c in recv_counts]
        self._thread = threading.Thread(
            target=self._run, args=(x, y, ids, sc, rc, group, die_before_send), daemon=True,
            name=f"shuffle-exchange-{epoch}")
        self._thread.start()

    def _run(self, x, y, ids, sc, rc, group, die_before_send):
        o = self.outcome
        t0 = time.perf_counter()
        try:
            if die_before_send:
                _die()
            o.x, o.y, o.ids = (_a2a(t, sc, rc, group) for t in (x, y, ids))
            o.bytes_sent = sum(int(t.nbytes) for t in (x, y, ids))
            o.bytes_recv = sum(int(t.nbytes) for t in (o.x, o.y, o.ids))
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            o.error = exc
        finally:
            o.time_s = time.perf_counter() - t0
            o.done.set()

    def wait(self, timeout_s: float) -> tuple[Outcome, float]:
        """(outcome, seconds the caller was blocked: the exposed part of the exchange)."""
        t0 = time.perf_counter()
        if not self.outcome.done.wait(timeout_s):
            raise ExchangeError(f"rank {self.rank}: shuffle exchange of epoch {self.epoch} did not finish "
                                f"within {timeout_s:.0f} s (a peer is stuck or dead)")
        exposed = time.perf_counter() - t0
        if self.outcome.error is not None:
            raise ExchangeError(f"rank {self.rank}: shuffle exchange of epoch {self.epoch} failed "
                                f"(a peer died or timed out): {self.outcome.error}") from self.outcome.error
        return self.outcome, exposed


class DeviceExchange:
    """The same exchange of CUDA tensors over the default (NCCL) group, started now from the calling
    thread; `wait()` as BackgroundExchange's. The staged tensors live on the rank's GPU."""

    POLL_S = 50e-6

    def __init__(self, x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor, send_counts: np.ndarray,
                 recv_counts: np.ndarray, epoch: int, die_before_send: bool = False):
        if x.device.type != "cuda" or "nccl" not in str(dist.get_backend()):
            raise ValueError(f"DeviceExchange moves CUDA tensors over NCCL; got {x.device} tensors on a "
                             f"{dist.get_backend()} default group (use BackgroundExchange for host memory)")
        self.epoch, self.rank = epoch, dist.get_rank()
        self.staged = (x, y, ids)
        sc, rc = [int(c) for c in send_counts], [int(c) for c in recv_counts]
        if die_before_send:
            _die()
        self._compute = torch.cuda.current_stream(x.device)
        # Outputs are allocated on the compute stream, which uses them once the exchange is done; the
        # process group keeps them (and the inputs) alive for its own stream meanwhile.
        outs = [torch.empty((sum(rc), *t.shape[1:]), dtype=t.dtype, device=t.device) for t in (x, y, ids)]
        side = torch.cuda.Stream(x.device)
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        side.wait_stream(self._compute)          # the staged copies were made on the compute stream
        with torch.cuda.stream(side):
            self._start.record()
            works = [dist.all_to_all_single(o, t, output_split_sizes=rc, input_split_sizes=sc, async_op=True)
                     for o, t in zip(outs, (x, y, ids), strict=True)]
            for w in works:                      # the side stream, not the compute stream nor the host,
                w.wait()                         # waits for NCCL's: _end marks the exchange done
            self._end.record()
        self.outcome = Outcome(*outs, bytes_sent=sum(int(t.nbytes) for t in (x, y, ids)),
                               bytes_recv=sum(int(t.nbytes) for t in outs))

    def wait(self, timeout_s: float) -> tuple[Outcome, float]:
        """(outcome, seconds the caller was blocked: the exposed part). The caller has synchronised its
        compute stream, so the time blocked here is the exchange's alone."""
        t0 = time.perf_counter()
        while not self._end.query():
            if time.perf_counter() - t0 > timeout_s:
                raise ExchangeError(f"rank {self.rank}: shuffle exchange of epoch {self.epoch} (NCCL) did "
                                    f"not finish within {timeout_s:.0f} s (a peer is stuck or dead)")
            time.sleep(self.POLL_S)
        exposed = time.perf_counter() - t0
        self._compute.wait_event(self._end)      # the received rows are read on the compute stream
        o = self.outcome
        o.time_s = self._start.elapsed_time(self._end) / 1e3
        o.done.set()
        return o, exposed
