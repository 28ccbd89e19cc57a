"""Halo exchange along one partitioned axis as an autograd Function.

Forward: each rank receives the planes its window needs from its left/right neighbours
(isend/irecv, nothing at the global edges, zeros for the op's padding there) and drops
planes it does not need. Backward is the adjoint: the gradient of every received plane
is sent back to its owner and added to the gradient of the planes it sent.

Halos live on the rank's compute device; `post` and `wait` move them over the rank's backend
(hpcdl.studies.spatial.devices): on the CPU as they are, on a GPU over NCCL as they are (one batched
group call), and on a shared GPU staged through host memory over gloo.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from hpcdl.studies.spatial.devices import comm_for
from hpcdl.studies.spatial.partition import AxisPlan


class HaloExchangeError(RuntimeError):
    """A neighbour did not answer a halo exchange (died or timed out)."""


@dataclass
class CommTimers:
    """Seconds spent in each kind of communication since the last reset (read per iteration).

    A phase on the CPU is timed by the host clock. On a GPU it is timed on the compute stream, by CUDA
    events around it: the time the stream spent there (waiting for a halo, say), whatever the host did
    meanwhile, and no synchronisation that would stall the queue. Those spans are read by `settle`,
    once the iteration's work is done."""

    seconds: dict = field(default_factory=lambda: {"halo": 0.0, "gather": 0.0, "allreduce": 0.0})
    spans: list = field(default_factory=list)  # (kind, start event, end event) not yet read

    def reset(self) -> None:
        for k in self.seconds:
            self.seconds[k] = 0.0
        self.spans.clear()

    def start(self, device) -> float | torch.cuda.Event:
        """A phase on `device` (where its tensors are computed) starts now."""
        if torch.device(device).type == "cuda":
            mark = torch.cuda.Event(enable_timing=True)
            mark.record()
            return mark
        return time.perf_counter()

    def stop(self, kind: str, start: float | torch.cuda.Event) -> None:
        if isinstance(start, float):
            self.seconds[kind] += time.perf_counter() - start
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.spans.append((kind, start, end))

    def settle(self) -> dict:
        """Add the GPU phases' seconds (waiting for their end events) and return `seconds`."""
        for kind, start, end in self.spans:
            end.synchronize()
            self.seconds[kind] += start.elapsed_time(end) / 1e3
        self.spans.clear()
        return self.seconds


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


def _failed(verb: str, peer: int | str, tag: int, timeout: float, exc: Exception) -> HaloExchangeError:
    return HaloExchangeError(f"rank {dist.get_rank()}: halo exchange ({verb} rank {peer}, tag {tag}) "
                             f"failed within {timeout:.0f} s: {exc}")


@dataclass
class Posted:
    """An exchange in flight: its works, the device its tensors are computed on (whose clock times the
    wait) and, on a shared GPU, the (compute buffer, host buffer) pairs its receives land in."""

    works: list = field(default_factory=list)  # (work, peer, verb, tag, buffers)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    unstage: list = field(default_factory=list)


def post(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]], tag: int,
         time_staging: bool = True) -> Posted:
    """Post all receives, then all sends, without waiting; returns the exchange for `wait`.

    Sends and receive buffers are on the rank's compute device. NCCL (a GPU's own) gets them as one
    batch, a single NCCL group call: NCCL ignores tags and matches a pair's operations in issue
    order, and two neighbours each posting a lone receive first would block each other's stream.
    Where the rank's collectives run on the host (a shared GPU) they are staged through host memory
    here and copied back by `wait`; the copies are the exchange's time (TIMERS["halo"], unless the
    caller times the whole post: `time_staging` False).
    """
    every = [*recvs, *sends]
    if not every:
        return Posted()
    device = every[0][0].device
    comm = comm_for(every[0][0])
    if device.type == "cuda" and comm.type == "cuda":
        return Posted(_post_batch(sends, recvs, tag), device)
    unstage = []
    if comm != device:
        t0 = TIMERS.start(device)
        sends = [(buf.to(comm), peer) for buf, peer in sends]
        staged = [(torch.empty(buf.shape, dtype=buf.dtype, device=comm), peer) for buf, peer in recvs]
        unstage = [(buf, host) for (buf, _), (host, _) in zip(recvs, staged, strict=True)]
        recvs = staged
        if time_staging:
            TIMERS.stop("halo", t0)
    works = []
    # Posting fails too once a dead peer's connection is closed, before any wait.
    for verb, op, pairs in (("receive from", dist.irecv, recvs), ("send to", dist.isend, sends)):
        for buf, peer in pairs:
            try:
                works.append((op(buf, peer, tag=tag), peer, verb, tag, (buf,)))
            except RuntimeError as exc:
                raise _failed(verb, peer, tag, exchange_timeout_s(), exc) from exc
    return Posted(works, device, unstage)


def _post_batch(sends: list, recvs: list, tag: int) -> list:
    ops = ([dist.P2POp(dist.irecv, buf, peer, tag=tag) for buf, peer in recvs]
           + [dist.P2POp(dist.isend, buf, peer, tag=tag) for buf, peer in sends])
    peers = ", ".join(str(p) for p in sorted({peer for _, peer in (*recvs, *sends)}))
    try:
        works = dist.batch_isend_irecv(ops)
    except RuntimeError as exc:
        raise _failed("exchange with", peers, tag, exchange_timeout_s(), exc) from exc
    # the buffers stay referenced until the wait: NCCL reads and writes them on its own stream
    bufs = tuple(buf for buf, _ in (*recvs, *sends))
    return [(w, peers, "exchange with", tag, bufs) for w in works if w is not None]


def wait(posted: Posted) -> None:
    """Wait for a posted exchange with a deadline, so a dead or stalled peer is an error, not a hang.

    The seconds spent here are the exchange's exposed (not hidden) cost: TIMERS["halo"]. Over NCCL
    the compute stream waits for the exchange, not the host: a host-side deadline would poll every
    millisecond (c10d's blocking wait) and hold back the GPU's queue; there a stalled peer is caught
    by the process group's watchdog at its timeout (HPCDL_COLLECTIVE_TIMEOUT_S), which ends the rank.
    """
    t0 = TIMERS.start(posted.device)
    timeout = exchange_timeout_s()
    for work, peer, verb, tag, bufs in posted.works:
        try:
            ok = work.wait() if bufs[0].is_cuda else work.wait(timedelta(seconds=timeout))
        except RuntimeError as exc:
            raise _failed(verb, peer, tag, timeout, exc) from exc
        if ok is False:
            raise HaloExchangeError(f"rank {dist.get_rank()}: halo exchange ({verb} rank {peer}) "
                                    f"timed out after {timeout:.0f} s")
    for buf, host in posted.unstage:
        buf.copy_(host)
    TIMERS.stop("halo", t0)


def _p2p(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]], tag: int) -> None:
    """Blocking exchange: post everything, then wait."""
    device = (sends or recvs)[0][0].device
    t0 = TIMERS.start(device)
    posted = post(sends, recvs, tag, time_staging=False)
    TIMERS.stop("halo", t0)
    wait(posted)


def _receive_into(ex: dict, count: str, like: torch.Tensor, line: Line, dim: int, recvs: list) -> dict:
    """A buffer, shaped as `like` but along `dim`, for each side whose peer sends this rank planes
    (`<count>_l` / `<count>_r` of the exchange `ex`: recv forward, send backward), appended to `recvs`
    with that peer; the buffers by side ("l", "r")."""
    shape = list(like.shape)
    bufs = {}
    for side, peer in (("l", line.left()), ("r", line.right())):
        n = ex[f"{count}_{side}"]
        if n:
            shape[dim] = n
            bufs[side] = torch.empty(shape, dtype=like.dtype, device=like.device)
            recvs.append((bufs[side], peer))
    return bufs


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, plan: AxisPlan, line: Line, dim: int, tag: int):
        ex = plan.exchange(line.index)
        ctx.ex, ctx.line, ctx.dim, ctx.tag, ctx.size = ex, line, dim, tag, x.shape[dim]
        recvs, sends = [], []
        bufs = _receive_into(ex, "recv", x, line, dim, recvs)
        if ex["send_l"]:
            sends.append((_narrow(x, dim, 0, ex["send_l"]), line.left()))
        if ex["send_r"]:
            sends.append((_narrow(x, dim, x.shape[dim] - ex["send_r"], ex["send_r"]), line.right()))
        if sends or recvs:
            _p2p(sends, recvs, tag)
        shape = list(x.shape)
        parts = []
        if ex["zeros_l"]:
            shape[dim] = ex["zeros_l"]
            parts.append(torch.zeros(shape, dtype=x.dtype, device=x.device))
        if "l" in bufs:
            parts.append(bufs["l"])
        lo, hi = ex["keep"]
        parts.append(x.narrow(dim, lo, hi - lo))
        if "r" in bufs:
            parts.append(bufs["r"])
        if ex["zeros_r"]:
            shape[dim] = ex["zeros_r"]
            parts.append(torch.zeros(shape, dtype=x.dtype, device=x.device))
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
        back = _receive_into(ex, "send", grad, line, dim, recvs)
        if sends or recvs:
            _p2p(sends, recvs, ctx.tag + 1)
        shape = list(grad.shape)
        shape[dim] = ctx.size
        grad_x = torch.zeros(shape, dtype=grad.dtype, device=grad.device)
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
