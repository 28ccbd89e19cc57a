"""The largest model (by depth, at the configured width) that trains under a fast-tier budget.

Whether a depth fits is decided only by a real trial: `trial_steps` training steps under the
enforced budget on the measured peak (CPU: anonymous RSS above the trial's start; CUDA: the
allocator's peak; BudgetExceeded, or a real out-of-memory, means it does not fit). To keep the
number of trials small, the fast-tier peaks of two small depths (measured by trials too) give an
affine guess of the answer; the search then walks from the guess until it holds a depth that fits
next to one that does not (depth+1), doubling its step size when the guess is far off.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hpcdl.studies.offload.accounting import BudgetExceeded
from hpcdl.studies.offload.train import RunSpec, train


def _trial(spec: RunSpec, depth: int, probes: list) -> dict | None:
    try:
        # a clean heap per trial: the measured peak (CPU: RSS above the start) must not reuse a
        # previous trial's freed memory
        rec, _ = train(replace(spec, depth=depth, trim_heap=True))
    except (BudgetExceeded, MemoryError, torch.OutOfMemoryError) as exc:
        probes.append({"depth": depth, "fits": False, "why": str(exc)[:200]})
        return None
    probes.append({"depth": depth, "fits": True, "peak_fast_bytes": rec["peak_fast_bytes"],
                   "peak_accounted_bytes": rec["peak_accounted_bytes"]})
    return rec


def largest_depth(spec: RunSpec, max_depth: int) -> dict:
    """{'depth': largest fitting depth (0: not even depth 1), 'probes': every trial, ...}."""
    probes: list[dict] = []
    fits: dict[int, dict | None] = {}

    def ok(d: int) -> bool:
        if d not in fits:
            fits[d] = _trial(spec, d, probes)
        return fits[d] is not None

    a = min(4, max_depth)  # two small probes past the transfer windows
    if not ok(a):
        lo, hi = 0, a
    elif (b := min(2 * a, max_depth)) == a:
        lo, hi = a, None
    elif not ok(b):
        lo, hi = a, b
    else:
        per_layer = (fits[b]["peak_fast_bytes"] - fits[a]["peak_fast_bytes"]) / (b - a)
        base = fits[a]["peak_fast_bytes"] - per_layer * a
        guess = max_depth if per_layer <= 0 else int((spec.budget_mb * 2**20 - base) // per_layer)
        lo, hi = b, None  # lo fits; hi (once known) does not
        d = min(max(guess, b + 1), max_depth)
        if ok(d):  # gallop up from the guess
            lo, step = d, 1
            while lo < max_depth:
                d = min(lo + step, max_depth)
                if not ok(d):
                    hi = d
                    break
                lo, step = d, step * 2
        else:  # gallop down from the guess
            hi, step = d, 1
            while hi - step > lo:
                d = hi - step
                if ok(d):
                    lo = d
                    break
                hi, step = d, step * 2
    while hi is not None and hi - lo > 1:  # bisect the bracket
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return _result(spec, lo, probes, fits.get(lo), capped=lo >= max_depth)


def _result(spec: RunSpec, depth: int, probes: list, rec: dict | None, capped: bool = False) -> dict:
    from hpcdl.studies.offload.model import n_params

    return {
        "strategy": spec.strategy,
        "precision": spec.precision,
        "width": spec.width,
        "batch": spec.batch,
        "budget_mb": spec.budget_mb,
        "max_depth": depth,
        "max_params": n_params(spec.width, depth) if depth else 0,
        "peak_fast_bytes_at_max": rec["peak_fast_bytes"] if rec else 0,
        "peak_accounted_bytes_at_max": rec["peak_accounted_bytes"] if rec else 0,
        "peak_measured_by": rec["peak_measured_by"] if rec else "",
        "capped_at_max_depth": capped,
        "trials": len(probes),
        "probes": ";".join(f"{p['depth']}:{'fit' if p['fits'] else 'over'}" for p in probes),
    }
