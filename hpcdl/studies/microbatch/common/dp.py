"""μ-cuDNN's dynamic program per kernel, kept as a Pareto front of (time, workspace).

For a kernel and a mini-batch B, a configuration is a division of B into micro-batches, each run
with one algorithm; its time is the sum of the micro-batches' times and its workspace the largest
of theirs (they run one after another and reuse the workspace). The DP over b = 1..B:

    front(b) = Pareto( {(t(a, b), ws(a, b)) : a, b in sizes}
                       ∪ {front(b1) ⊕ front(b - b1) : b1 in sizes, b1 <= b / 2} )

with (t1, w1) ⊕ (t2, w2) = (t1 + t2, max(w1, w2)). Both terms are monotone in time and workspace,
so dropping dominated configurations loses no optimum: the min over front(B) under a workspace
limit is μ-cuDNN's T(B). `sizes` is the policy: undivided {B}, powerOfTwo {2^k <= B} ∪ {B}, or all
{1..B}. A B the policy cannot split evenly (e.g. B = 10 with powerOfTwo) ends with an uneven last
micro-batch (8 + 2). Nothing here is timed: the times and workspaces are benchmarked inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POLICIES = ("undivided", "powerOfTwo", "all")


def division_text(division) -> tuple[str, str]:
    """A division [(algorithm or engine, micro-batch), ...] as two texts: "4+4" and "a+b"."""
    return "+".join(str(b) for _, b in division), "+".join(a for a, _ in division)


class WorkspaceError(ValueError):
    """No configuration of a kernel fits its workspace limit (the message names the layer)."""


def policy_sizes(policy: str, batch: int) -> list[int]:
    if batch < 1:
        raise ValueError(f"batch size must be >= 1, got {batch}")
    if policy == "undivided":
        return [batch]
    if policy == "powerOfTwo":
        return sorted({1 << k for k in range(batch.bit_length()) if 1 << k <= batch} | {batch})
    if policy == "all":
        return list(range(1, batch + 1))
    raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")


@dataclass
class Front:
    """Pareto configurations of one kernel at one batch size, fastest last (workspace ascending)."""

    time_s: np.ndarray
    workspace: np.ndarray
    # how each configuration is made: ("single", algorithm, b) or ("split", b1, i1, b2, i2)
    how: list[tuple]


def _pareto(t: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated points, workspace ascending (time then strictly descending)."""
    order = np.lexsort((t, w))
    keep, best = [], np.inf
    for i in order:
        if t[i] < best:
            keep.append(i)
            best = t[i]
    return np.asarray(keep, dtype=int)


def challenger_prices(
    table: dict[tuple[str, int], tuple[float, float]],
    typical: dict[tuple[str, int], float],
    incumbent: tuple[str, int] | None,
    margin: float,
    extra_s: float,
) -> dict[tuple[str, int], tuple[float, float]]:
    """A kernel's table as the planners see it when it should leave the framework's default
    (`incumbent`, None where this kernel is not one the default runs) only for a real gain.

    The incumbent keeps its fastest repeat; every challenger is priced at its median repeat
    (`typical`), at least its fastest times (1 + margin), plus `extra_s` (what running a layer
    through the planned executor costs). A challenger then wins only where its typical time beats
    the default's best: on a shared CPU a memory-bound layer varies by +-30 % call to call, and
    gains inside that flipped between benchmark and execution.
    """
    return {
        key: (t if key == incumbent else max(typical[key], t * (1 + margin)) + extra_s, w)
        for key, (t, w) in table.items()
    }


class KernelDP:
    """Fronts of every b = 1..B for one kernel, from its benchmarked table."""

    def __init__(
        self,
        table: dict[tuple[str, int], tuple[float, float]],
        batch: int,
        policy: str,
        label: str = "kernel",
        skip_missing: bool = False,
    ):
        """table: (algorithm, micro-batch) -> (time_s, workspace_bytes), for every size the policy needs;
        with `skip_missing`, a size without any configuration is left out of the policy instead (a
        cuDNN engine table can lack one where no engine runs at some micro-batch offset)."""
        self.batch, self.policy, self.label = batch, policy, label
        self.sizes = policy_sizes(policy, batch)
        missing = [b for b in self.sizes if not any(k[1] == b for k in table)]
        if missing and not skip_missing:
            raise ValueError(f"{label}: policy {policy} needs micro-batch sizes {missing}, not benchmarked")
        self.sizes = [b for b in self.sizes if b not in missing]
        self.fronts: dict[int, Front | None] = {}
        size_set = set(self.sizes)
        for b in range(1, batch + 1):
            ts, ws, how = [], [], []
            if b in size_set:
                for (alg, bb), (t, w) in table.items():
                    if bb == b:
                        ts.append(t)
                        ws.append(w)
                        how.append(("single", alg, b))
            for b1 in self.sizes:
                if b1 > b // 2:
                    break
                f1, f2 = self.fronts.get(b1), self.fronts.get(b - b1)
                if f1 is None or f2 is None:
                    continue
                tt = (f1.time_s[:, None] + f2.time_s[None, :]).ravel()
                ww = np.maximum(f1.workspace[:, None], f2.workspace[None, :]).ravel()
                keep = _pareto(tt, ww)
                n2 = len(f2.time_s)
                ts += list(tt[keep])
                ws += list(ww[keep])
                how += [("split", b1, int(k // n2), b - b1, int(k % n2)) for k in keep]
            if not ts:
                self.fronts[b] = None
                continue
            t_arr, w_arr = np.asarray(ts, float), np.asarray(ws, float)
            keep = _pareto(t_arr, w_arr)
            self.fronts[b] = Front(t_arr[keep], w_arr[keep], [how[i] for i in keep])

    def front(self, b: int | None = None) -> Front:
        f = self.fronts.get(self.batch if b is None else b)
        if f is None:
            raise ValueError(
                f"{self.label}: no configuration for batch {b or self.batch} under policy {self.policy}"
            )
        return f

    def division(self, index: int, b: int | None = None) -> list[tuple[str, int]]:
        """The configuration `index` of front(b) as micro-batches [(algorithm, size), ...]."""
        how = self.front(b).how[index]
        if how[0] == "single":
            return [(how[1], how[2])]
        _, b1, i1, b2, i2 = how
        return self.division(i1, b1) + self.division(i2, b2)

    def best(self, limit_bytes: float | None = None) -> tuple[int, float, float]:
        """μ-cuDNN's T(B) under a workspace limit: (front index, time_s, workspace_bytes)."""
        f = self.front()
        ok = np.flatnonzero(f.workspace <= (np.inf if limit_bytes is None else limit_bytes))
        if ok.size == 0:
            raise WorkspaceError(
                f"{self.label}: workspace limit {limit_bytes / 2**20:.3f} MiB is smaller than every "
                f"configuration's need under policy {self.policy} (the least is "
                f"{f.workspace.min() / 2**20:.3f} MiB)"
            )
        i = int(ok[np.argmin(f.time_s[ok])])
        return i, float(f.time_s[i]), float(f.workspace[i])
