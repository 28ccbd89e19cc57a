"""Partial-Q exchange of the samples themselves over gloo, in a background thread.

The exchange uses its own process group: collectives of one group must be issued in the
same order on every rank, and DDP's all-reduces run on the default group in the main
thread at the same time. A peer that dies or stalls makes all_to_all_single raise (gloo
closes the connection, or the group's timeout expires); the error is re-raised in the
main thread as ExchangeError naming the epoch and rank.
"""

from __future__ import annotations

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
                # fault injection for tests: this rank vanishes in the middle of an exchange
                import os
                os._exit(17)
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

