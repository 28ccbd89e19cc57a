"""Pure index arithmetic for spatially partitioned windowed ops (conv, pooling) along one axis.

A global axis of D planes is split into contiguous slabs, one per rank of a line of
ranks. For an op with kernel k, stride s and padding p, output plane o reads input planes
[o*s - p, o*s - p + k). Output o is owned by the rank that owns its window's centre plane,
so a stride-1 "same" op keeps the input's partition and pooling keeps slabs local where
it can. Every rank computes the same plan from the global sizes, so a bad geometry raises
the same error on every rank (no rank is left waiting in an exchange).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import accumulate


def split_sizes(n: int, parts: int, what: str = "depth", allow_uneven: bool = True) -> tuple[int, ...]:
    """Contiguous slab sizes of `n` planes over `parts` ranks; the first n % parts get one extra."""
    if parts < 1:
        raise ValueError(f"{what}: need at least one rank, got {parts}")
    if parts > n:
        raise ValueError(f"{what}: {parts} ranks for {n} planes; more ranks than {what} planes")
    if not allow_uneven and n % parts:
        raise ValueError(f"{what}: {n} planes are not divisible by {parts} ranks "
                         f"(uneven splits are disabled)")
    base, rem = divmod(n, parts)
    return tuple(base + (1 if i < rem else 0) for i in range(parts))


@dataclass(frozen=True)
class AxisPlan:
    """Input slabs -> output slabs of one op along one axis, plus the input window each rank needs."""

    in_sizes: tuple[int, ...]
    out_sizes: tuple[int, ...]
    need_lo: tuple[int, ...]  # first global input plane rank r needs (negative = zero padding)
    need_hi: tuple[int, ...]  # one past the last (beyond the axis = zero padding)

    @property
    def total(self) -> int:
        return sum(self.in_sizes)

    @property
    def in_starts(self) -> tuple[int, ...]:
        return (0, *accumulate(self.in_sizes))[:-1]

    def halo(self, r: int) -> tuple[int, int]:
        """(planes received from the left neighbour, planes received from the right)."""
        a = self.in_starts[r]
        b = a + self.in_sizes[r]
        return max(0, a - max(self.need_lo[r], 0)), max(0, min(self.need_hi[r], self.total) - b)

    def exchange(self, r: int) -> dict:
        """Everything rank r does in one exchange, in local plane indices."""
        a = self.in_starts[r]
        size = self.in_sizes[r]
        lo, hi, total = self.need_lo[r], self.need_hi[r], self.total
        recv_l, recv_r = self.halo(r)
        keep_lo = max(lo, 0, a) - a
        keep_hi = min(hi, total, a + size) - a
        send_l = self.halo(r - 1)[1] if r > 0 else 0
        send_r = self.halo(r + 1)[0] if r + 1 < len(self.in_sizes) else 0
        return {"zeros_l": max(0, -lo), "zeros_r": max(0, hi - total), "recv_l": recv_l,
                "recv_r": recv_r, "keep": (keep_lo, keep_hi), "send_l": send_l, "send_r": send_r}


def plan_axis(in_sizes: tuple[int, ...] | list[int], kernel: int, stride: int, padding: int,
              what: str = "layer") -> AxisPlan:
    """Plan one windowed op over slabs `in_sizes`; raises ValueError for geometries it cannot run."""
    in_sizes = tuple(int(s) for s in in_sizes)
    if kernel < 1 or stride < 1:
        raise ValueError(f"{what}: kernel and stride must be >= 1, got {kernel}, {stride}")
    if any(s < 1 for s in in_sizes):
        raise ValueError(f"{what}: every rank needs at least one plane, got slabs {list(in_sizes)}")
    total = sum(in_sizes)
    n_out = (total + 2 * padding - kernel) // stride + 1
    if n_out < 1:
        raise ValueError(f"{what}: {total} planes are too few for kernel {kernel} with padding {padding}")
    starts = [0, *accumulate(in_sizes)]
    owners = []
    for o in range(n_out):
        centre = min(max(o * stride - padding + (kernel - 1) // 2, 0), total - 1)
        owners.append(bisect.bisect_right(starts, centre) - 1)
    out_sizes = tuple(owners.count(r) for r in range(len(in_sizes)))
    for r, n in enumerate(out_sizes):
        if n == 0:
            raise ValueError(
                f"{what}: rank {r}'s slab of {in_sizes[r]} planes yields no output plane "
                f"(kernel {kernel}, stride {stride}); the split is thinner than the halo: "
                f"use fewer ranks along this axis or a larger input")
    need_lo, need_hi = [], []
    first = 0
    for n in out_sizes:
        need_lo.append(first * stride - padding)
        need_hi.append((first + n - 1) * stride - padding + kernel)
        first += n
    plan = AxisPlan(in_sizes, out_sizes, tuple(need_lo), tuple(need_hi))
    for r in range(len(in_sizes)):
        left, right = plan.halo(r)
        if r > 0 and left > in_sizes[r - 1]:
            raise ValueError(f"{what}: rank {r} needs a halo of {left} planes but rank {r - 1}'s slab "
                             f"has only {in_sizes[r - 1]}; halo larger than slab")
        if r + 1 < len(in_sizes) and right > in_sizes[r + 1]:
            raise ValueError(f"{what}: rank {r} needs a halo of {right} planes but rank {r + 1}'s slab "
                             f"has only {in_sizes[r + 1]}; halo larger than slab")
    return plan
