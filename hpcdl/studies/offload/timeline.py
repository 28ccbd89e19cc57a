"""Timestamps of one training step: compute phases, transfers on their own lanes, and the compute
lane's waits for a transfer (the exposed transfer time).

    lane "compute"    forward / backward / optimizer phases of the training thread (or CUDA stream)
    lane "wait"       the training thread (stream) blocked on a transfer: transfer time not hidden
    lane "to_slow"    a copy fast -> slow tier (activation pack, optimizer bucket copy-out)
    lane "from_slow"  a copy slow -> fast tier (activation prefetch, optimizer bucket copy-in)

hidden fraction = 1 - exposed / total transfer time: exposed is the sum of the waits, total the
sum of every transfer's duration. On CPU a timestamp is time.perf_counter() taken by the thread
doing the work; on CUDA it is an event recorded on the stream doing it (resolved after the step),
so a wait is the time between two events on the compute stream around its wait_event.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

LANES = ("compute", "wait", "to_slow", "from_slow")


class CpuClock:
    def mark(self, stream=None):
        return time.perf_counter()

    def start(self):
        self.t0 = time.perf_counter()

    def set_base(self, base):
        self.t0 = base

    def resolve(self, token) -> float:
        return token - self.t0


class CudaClock:
    def __init__(self, torch):
        self.torch = torch

    def mark(self, stream=None):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    def start(self):
        self.base = self.mark()

    def set_base(self, base):
        self.base = base

    def resolve(self, token) -> float:
        return self.base.elapsed_time(token) / 1000.0


@dataclass
class Span:
    lane: str
    kind: str
    start_s: float
    end_s: float
    nbytes: int = 0


class StepLog:
    """The raw timestamps of one step. A copy records into the log of the step that issued it, even
    when it completes during the next step (the optimizer's last copy-outs overlap the next forward)."""

    def __init__(self, clock):
        self.clock = clock
        clock.start()
        self.base = clock.t0 if hasattr(clock, "t0") else clock.base
        self._raw: list = []
        self._lock = threading.Lock()
        self.spans: list[Span] = []

    def add(self, lane: str, kind: str, start, end, nbytes: int = 0) -> None:
        with self._lock:
            self._raw.append((lane, kind, start, end, nbytes))

    def resolve(self) -> None:
        """Seconds since the step started (call once every copy has completed)."""
        self.clock.set_base(self.base)
        self.spans = [
            Span(lane, kind, self.clock.resolve(a), self.clock.resolve(b), n)
            for lane, kind, a, b, n in self._raw
        ]

    def sum(self, lane: str, kind: str | None = None) -> float:
        return sum(
            s.end_s - s.start_s for s in self.spans if s.lane == lane and (kind is None or s.kind == kind)
        )

    def bytes(self, lane: str) -> int:
        return sum(s.nbytes for s in self.spans if s.lane == lane)

    def transfer_s(self) -> float:
        return self.sum("to_slow") + self.sum("from_slow")

    def exposed_s(self) -> float:
        return self.sum("wait")

    def hidden_fraction(self) -> float | None:
        total = self.transfer_s()
        if total <= 0:
            return None
        return min(1.0, max(0.0, 1.0 - self.exposed_s() / total))

    def rows(self) -> list[dict]:
        return [
            {"lane": s.lane, "kind": s.kind, "start_s": s.start_s, "end_s": s.end_s, "span_bytes": s.nbytes}
            for s in sorted(self.spans, key=lambda s: (s.start_s, s.lane, s.kind))
        ]


@dataclass
class Timeline:
    """The current step's log (None between steps: waits there are not part of any step)."""

    clock: object = field(default_factory=CpuClock)
    current: StepLog | None = None

    def start(self) -> StepLog:
        self.current = StepLog(self.clock)
        return self.current

    def stop(self) -> None:
        self.current = None

    def add(self, lane: str, kind: str, start, end, nbytes: int = 0) -> None:
        if self.current is not None:
            self.current.add(lane, kind, start, end, nbytes)

    def phase(self, kind: str, stream=None):
        return _Phase(self, kind, stream)


class _Phase:
    def __init__(self, tl: Timeline, kind: str, stream):
        self.tl, self.kind, self.stream = tl, kind, stream

    def __enter__(self):
        self.start = self.tl.clock.mark(self.stream)
        return self

    def __exit__(self, *exc):
        self.tl.add("compute", self.kind, self.start, self.tl.clock.mark(self.stream))
        return False
