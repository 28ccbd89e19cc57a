"""Core-assignment policies of the co-scheduler (pure: called on every arrival and departure).

    rigid         a job gets min(requested, free whole cores) at admission and keeps them; it
                  waits (first come, first served) while no whole core is free
    equal         malleable: every running job gets the same share of the cores
    proportional  malleable: shares proportional to each job's remaining iterations

Malleable shares are whole cores while there are no more jobs than cores (largest-remainder
apportionment, at least one core each) and fractions of the cores, enforced by the quota alone,
when jobs outnumber cores. A share's thread count is its nearest whole number of cores, >= 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

POLICIES = ("rigid", "equal", "proportional")
MIN_FRACTION = 0.05  # of a core: a fractional share never starves a job completely


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


def _fractional(weights: dict[str, float], cores: int) -> dict[str, float]:
    """Shares of a core each (jobs outnumber cores): proportional, capped at one core (one thread
    cannot use more; the excess is handed on to the uncapped jobs), never below MIN_FRACTION."""
    shares: dict[str, float] = {}
    free, left = float(cores), dict(weights)
    while left:
        total = sum(left.values()) or 1.0
        trial = {n: free * w / total for n, w in left.items()}
        capped = {n for n, v in trial.items() if v >= 1.0}
        if not capped:
            shares.update(trial)
            break
        for n in capped:
            shares[n] = 1.0
            free -= 1.0
            del left[n]
    floor = {n: max(MIN_FRACTION, v) for n, v in shares.items()}
    scale = cores / sum(floor.values())
    return {n: v * scale for n, v in floor.items()}


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
    jobs = [*running, *waiting]
    admit = [j.name for j in waiting]
    if not jobs:
        return admit, {}
    weights = {j.name: (1.0 if policy == "equal" else max(j.remaining, 1)) for j in jobs}
    shares = _apportion_whole(weights, cores) if len(jobs) <= cores else _fractional(weights, cores)
    return admit, shares


def threads_for_share(share: float, max_threads: int) -> int:
    return max(1, min(max_threads, math.floor(share + 0.5)))
