"""Halo exchange along one partitioned axis as an autograd Function.

Forward: each rank receives the planes its window needs from its left/right neighbours
(isend/irecv, nothing at the global edges, zeros for the op's padding there) and drops
planes it does not need. Backward is the adjoint: the gradient of every received plane
is sent back to its owner and added to the gradient of the planes it sent.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from hpcdl.studies.spatial.partition import AxisPlan


class HaloExchangeError(RuntimeError):
    """A neighbour did not answer a halo exchange (died or timed out)."""


@dataclass
class CommTimers:
    """Seconds spent in each kind of communication since the last reset (read per iteration)."""

    seconds: dict = field(default_factory=lambda: {"halo": 0.0, "gather": 0.0, "allreduce": 0.0})

    def reset(self) -> None:
        for k in self.seconds:
            self.seconds[k] = 0.0


TIMERS = CommTimers()


def exchange_timeout_s() -> float:
    return float(os.environ.get("HPCDL_HALO_TIMEOUT_S", os.environ.get("HPCDL_COLLECTIVE_TIMEOUT_S", "60")))


@dataclass(frozen=True)
class Line:
    """The ranks along one partitioned axis: global ranks in slab order and this rank's index."""

    ranks: tuple[int, ...]
    index: int

    def left(self) -> int | None:
        return self.ranks[self.index - 1] if self.index > 0 else None

    def right(self) -> int | None:
        return self.ranks[self.index + 1] if self.index + 1 < len(self.ranks) else None


def _narrow(x: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    return x.narrow(dim, start, length).contiguous()


def _failed(verb: str, peer: int, tag: int, timeout: float, exc: Exception) -> HaloExchangeError:
    return HaloExchangeError(f"rank {dist.get_rank()}: halo exchange ({verb} rank {peer}, tag {tag}) "
                             f"failed within {timeout:.0f} s: {exc}")


def post(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]], tag: int) -> list:
    """Post all receives, then all sends, without waiting; returns the pending works for `wait`."""
    works = []
    # Posting fails too once a dead peer's connection is closed, before any wait.
    for verb, op, pairs in (("receive from", dist.irecv, recvs), ("send to", dist.isend, sends)):
        for buf, peer in pairs:
            try:
                works.append((op(buf, peer, tag=tag), peer, verb, tag, buf))
            except RuntimeError as exc:
                raise _failed(verb, peer, tag, exchange_timeout_s(), exc) from exc
    return works


def wait(works: list) -> None:
    """Wait for posted works with a deadline, so a dead or stalled peer is an error, not a hang.

    The seconds spent here are the exchange's exposed (not hidden) cost: TIMERS["halo"].
    """
    t0 = time.perf_counter()
    timeout = exchange_timeout_s()
    for work, peer, verb, tag, _ in works:
        try:
            ok = work.wait(timedelta(seconds=timeout))
        except RuntimeError as exc:
            raise _failed(verb, peer, tag, timeout, exc) from exc
        if ok is False:
            raise HaloExchangeError(f"rank {dist.get_rank()}: halo exchange ({verb} rank {peer}) "
                                    f"timed out after {timeout:.0f} s")
    TIMERS.seconds["halo"] += time.perf_counter() - t0


def _p2p(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]], tag: int) -> None:
    """Blocking exchange: post everything, then wait."""
    t0 = time.perf_counter()
    works = post(sends, recvs, tag)
    TIMERS.seconds["halo"] += time.perf_counter() - t0
    wait(works)


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, plan: AxisPlan, line: Line, dim: int, tag: int):
        ex = plan.exchange(line.index)
        ctx.ex, ctx.line, ctx.dim, ctx.tag, ctx.size = ex, line, dim, tag, x.shape[dim]
        shape = list(x.shape)
        recvs, sends, bufs = [], [], {}
        for side, peer in (("l", line.left()), ("r", line.right())):
            n = ex[f"recv_{side}"]
            if n:
                shape[dim] = n
                bufs[side] = torch.empty(shape, dtype=x.dtype)
                recvs.append((bufs[side], peer))
        if ex["send_l"]:
            sends.append((_narrow(x, dim, 0, ex["send_l"]), line.left()))
        if ex["send_r"]:
            sends.append((_narrow(x, dim, x.shape[dim] - ex["send_r"], ex["send_r"]), line.right()))
        if sends or recvs:
            _p2p(sends, recvs, tag)
        parts = []
        if ex["zeros_l"]:
            shape[dim] = ex["zeros_l"]
            parts.append(torch.zeros(shape, dtype=x.dtype))
        if "l" in bufs:
            parts.append(bufs["l"])
        lo, hi = ex["keep"]
        parts.append(x.narrow(dim, lo, hi - lo))
        if "r" in bufs:
            parts.append(bufs["r"])
        if ex["zeros_r"]:
            shape[dim] = ex["zeros_r"]
            parts.append(torch.zeros(shape, dtype=x.dtype))
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        ex, line, dim = ctx.ex, ctx.line, ctx.dim
        lo, hi = ex["keep"]
        off = ex["zeros_l"]
        sends, recvs = [], []
        if ex["recv_l"]:
            sends.append((_narrow(grad, dim, off, ex["recv_l"]), line.left()))
        off += ex["recv_l"]
        grad_keep = grad.narrow(dim, off, hi - lo)
        off += hi - lo
        if ex["recv_r"]:
            sends.append((_narrow(grad, dim, off, ex["recv_r"]), line.right()))
        shape = list(grad.shape)
        back = {}
        for side, peer in (("l", line.left()), ("r", line.right())):
            n = ex[f"send_{side}"]
            if n:
                shape[dim] = n
                back[side] = torch.empty(shape, dtype=grad.dtype)
                recvs.append((back[side], peer))
        if sends or recvs:
            _p2p(sends, recvs, ctx.tag + 1)
        shape[dim] = ctx.size
        grad_x = torch.zeros(shape, dtype=grad.dtype)
        grad_x.narrow(dim, lo, hi - lo).copy_(grad_keep)
        if "l" in back:
            grad_x.narrow(dim, 0, ex["send_l"]).add_(back["l"])
        if "r" in back:
            grad_x.narrow(dim, ctx.size - ex["send_r"], ex["send_r"]).add_(back["r"])
        return grad_x, None, None, None, None


def halo_exchange(x: torch.Tensor, plan: AxisPlan, line: Line, dim: int, tag: int) -> torch.Tensor:
    """x's slab along `dim` -> the window [need_lo, need_hi) this rank's outputs read."""
    if x.shape[dim] != plan.in_sizes[line.index]:
        raise ValueError(f"rank {line.index} along dim {dim}: slab has {x.shape[dim]} planes, "
                         f"plan expects {plan.in_sizes[line.index]}")
    ex = plan.exchange(line.index)
    if not (ex["recv_l"] or ex["recv_r"] or ex["send_l"] or ex["send_r"] or ex["zeros_l"] or ex["zeros_r"]) \
            and ex["keep"] == (0, x.shape[dim]):
        return x  # e.g. a 2-pool on even slabs: the window is the slab, so skip the copies
    return _Exchange.apply(x, plan, line, dim, tag)
