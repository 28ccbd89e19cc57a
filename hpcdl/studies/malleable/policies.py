"""Core-assignment policies of the co-scheduler (pure: called on every arrival and departure).

    rigid         a job gets min(requested, free whole cores) at admission and keeps them; it
                  waits (first come, first served) while no whole core is free
    equal         malleable: every running job gets the same share of the cores
    proportional  malleable: shares proportional to each job's remaining iterations

Malleable policies never time-slice a core between jobs: at most one running job per core, each
with at least one whole core, the spare cores apportioned by largest remainder. An arrival that
finds every core busy takes a core from a job holding more than one (the shrink that malleability
makes possible); when every running job is down to one core it waits, first come, first served.
Time-slicing more jobs than cores (shares below one core) would stretch every job and, for jobs
of equal work, raise the mean turnaround above first-come-first-served: the fault of processor
sharing, not a benefit of malleability. A share's thread count is its whole number of cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

POLICIES = ("rigid", "equal", "proportional")


@dataclass(frozen=True)
class JobView:
    name: str
    request: int  # cores asked for (what a rigid scheduler grants at most)
    remaining: int  # iterations left
    share: float | None = None  # cores held now (None: waiting)


def _apportion_whole(weights: dict[str, float], cores: int) -> dict[str, float]:
    """Whole cores, at least one each, the rest by largest remainder of the weights."""
    names = list(weights)
    spare = cores - len(names)
    total = sum(weights.values()) or 1.0
    ideal = {n: spare * weights[n] / total for n in names}
    got = {n: 1 + math.floor(ideal[n]) for n in names}
    left = cores - sum(got.values())
    for n in sorted(names, key=lambda n: (-(ideal[n] - math.floor(ideal[n])), names.index(n)))[:left]:
        got[n] += 1
    return {n: float(v) for n, v in got.items()}


def decide(policy: str, cores: int, running: list[JobView], waiting: list[JobView]) -> tuple[list[str], dict]:
    """(jobs to admit now, {job: cores} for every job that runs after this event)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if policy == "rigid":
        shares = {j.name: float(j.share) for j in running}
        free = cores - int(round(sum(shares.values())))
        admit = []
        for j in waiting:  # first come, first served: the head waits, so do the ones behind it
            if free < 1:
                break
            shares[j.name] = float(min(j.request, free))
            free -= int(shares[j.name])
            admit.append(j.name)
        return admit, shares
    admit = [j.name for j in waiting[: max(0, cores - len(running))]]  # first come, first served
    jobs = [*running, *(j for j in waiting if j.name in admit)]
    if not jobs:
        return admit, {}
    weights = {j.name: (1.0 if policy == "equal" else max(j.remaining, 1)) for j in jobs}
    return admit, _apportion_whole(weights, cores)


def threads_for_share(share: float, max_threads: int) -> int:
    return max(1, min(max_threads, math.floor(share + 0.5)))
