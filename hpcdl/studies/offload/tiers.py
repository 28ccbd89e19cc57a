"""The two tiers' bandwidths, measured in the run: is the slow tier slower?

An offload saves fast-tier memory only by moving bytes to a tier that is a different, slower
resource. On the CPU the slow tier is files, and through the page cache ("page_cache" io_mode) those
files are RAM again; so every sweep point measures both tiers with the study's own copy paths, in
its own process and slow-tier directory, right after its training run (`measure`):

    fast tier   CPU: a copy between two buffers in process memory (one memcpy on the calling thread,
                as each slow-tier copy is one pwrite / preadv on one thread); CUDA: a
                device-to-device copy in GPU memory
    slow tier   the FileTier / PinnedTier the strategies use, `put` (write: fast -> slow) and `get`
                (read: slow -> fast) of the same bytes, each waited for (its Ticket)

Each direction `rounds` times after one untimed round; a point records the median. The tables stage
writes them to tables/tiers.csv (`table`), and the slow-tier gate (verdicts/gate.py) makes the memory,
capacity and hidden-fraction claims that would pass "not measured on this host" where the slow tier is
not slower than the fast one by `slow_tier_min_slowdown` in both directions (`too_fast`).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pandas as pd
import torch

from hpcdl.studies.offload.slowtier import FileTier, PinnedTier
from hpcdl.studies.offload.timeline import CpuClock, CudaClock, Timeline

DIRECTIONS = ("write", "read")
COLUMNS = ["device", "tier_pair", "io_mode", "tier", "medium", "direction", "probe_bytes", "points",
           "bandwidth_bytes_per_s", "bandwidth_min_bytes_per_s", "bandwidth_max_bytes_per_s", "slowdown"]
MEDIUM = {("cpu", "fast"): "process memory (RAM)", ("cuda", "fast"): "GPU memory",
          ("cuda", "slow"): "pinned host memory",
          ("cpu", "slow", "page_cache"): "files through the page cache (RAM)",
          ("cpu", "slow", "dontneed"): "files, fdatasync'd, pages dropped (the device)"}


def _timed(fn, sync, rounds: int) -> float:
    """Median seconds of `fn()` over `rounds` calls after one untimed call."""
    fn()
    sync()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(device: str, slow_dir: str, io_mode: str, nbytes: int, rounds: int) -> dict:
    """{fast,slow}_{write,read}_bw_bytes_per_s of `nbytes` on `device`'s tiers (a point's record
    columns), and the probe's size."""
    if nbytes < 1 or rounds < 1:
        raise ValueError(f"a tier probe needs bytes >= 1 and rounds >= 1, got {nbytes} and {rounds}")
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    src = torch.full((nbytes,), 7, dtype=torch.uint8, device=device)
    dst = torch.zeros_like(src)
    if cuda:
        fast = {"write": _timed(lambda: dst.copy_(src), sync, rounds),
                "read": _timed(lambda: src.copy_(dst), sync, rounds)}
    else:  # one memcpy on this thread, as a slow-tier copy is (torch's copy_ would wait for its pool)
        a, b = src.numpy(), dst.numpy()
        fast = {"write": _timed(lambda: np.copyto(b, a), sync, rounds),
                "read": _timed(lambda: np.copyto(a, b), sync, rounds)}
    timeline = Timeline(CudaClock(torch) if cuda else CpuClock())  # no step: nothing is logged
    tier = PinnedTier(timeline, torch.device(device)) if cuda else FileTier(slow_dir, timeline, io_mode)
    try:
        at = tier.reserve("optim", nbytes)
        tier.preallocate("optim")
        put = tier.put(src, "optim", at, "probe")
        put.wait()
        slow = {"write": _timed(lambda: tier.put(src, "optim", at, "probe").wait(), sync, rounds),
                "read": _timed(lambda: tier.get(dst, "optim", at, "probe", after=put).wait(), sync, rounds)}
    finally:
        tier.close()
    out = {f"{t}_{d}_bw_bytes_per_s": nbytes / secs[d]
           for t, secs in (("fast", fast), ("slow", slow)) for d in DIRECTIONS}
    return {**out, "tier_probe_bytes": nbytes}


def table(steps: pd.DataFrame) -> pd.DataFrame:
    """tiers.csv from the sweep points' records: per tier and direction, the median over the points
    (and their range), and for the slow tier its slowdown, fast / slow bandwidth."""
    cols = [f"{t}_{d}_bw_bytes_per_s" for t in ("fast", "slow") for d in DIRECTIONS]
    if steps.empty or not set(cols) <= set(steps):
        return pd.DataFrame(columns=COLUMNS)
    rows = []
    for (device, pair, io_mode), g in steps.groupby(["device", "tier", "io_mode"], sort=True):
        med = {c: float(np.nanmedian(g[c])) for c in cols if g[c].notna().any()}
        for t in ("fast", "slow"):
            for d in DIRECTIONS:
                c = f"{t}_{d}_bw_bytes_per_s"
                if c not in med:
                    continue
                slowdown = med.get(f"fast_{d}_bw_bytes_per_s", np.nan) / med[c] if t == "slow" else np.nan
                rows.append({"device": device, "tier_pair": pair, "io_mode": io_mode, "tier": t,
                             "medium": MEDIUM.get((device, t), MEDIUM.get((device, t, io_mode), "")),
                             "direction": d, "probe_bytes": int(g["tier_probe_bytes"].max()),
                             "points": int(g[c].notna().sum()), "bandwidth_bytes_per_s": med[c],
                             "bandwidth_min_bytes_per_s": float(g[c].min()),
                             "bandwidth_max_bytes_per_s": float(g[c].max()), "slowdown": slowdown})
    return pd.DataFrame(rows, columns=COLUMNS)


def too_fast(tiers: pd.DataFrame, least: float) -> tuple[str | None, dict]:
    """(why the slow tier does not count as slower on this host, or None; the bandwidths as
    evidence). It must be at least `least` times slower than the fast tier in both directions."""
    if tiers.empty or "slowdown" not in tiers:
        return ("the tiers' bandwidths were not measured in this run (tables/tiers.csv is missing or "
                "empty): rerun the study"), {}
    slow = tiers[tiers["tier"] == "slow"].set_index("direction")
    fast = tiers[tiers["tier"] == "fast"].set_index("direction")
    gbs = {f"{t}_{d}_gb_per_s": round(float(frame.loc[d, "bandwidth_bytes_per_s"]) / 1e9, 3)
           for t, frame in (("fast", fast), ("slow", slow)) for d in DIRECTIONS if d in frame.index}
    evidence = {"tier_bandwidths": gbs,
                "slow_tier_slowdown": {d: round(float(slow.loc[d, "slowdown"]), 3) for d in slow.index},
                "slow_tier_medium": str(slow["medium"].iloc[0]) if len(slow) else "",
                "slow_tier_min_slowdown": least}
    short = [d for d in DIRECTIONS if not (d in slow.index and float(slow.loc[d, "slowdown"]) >= least)]
    if not short:
        return None, evidence
    parts = ", ".join(f"{d} {gbs.get(f'slow_{d}_gb_per_s', float('nan')):g} GB/s vs the fast tier's "
                      f"{gbs.get(f'fast_{d}_gb_per_s', float('nan')):g} GB/s "
                      f"({evidence['slow_tier_slowdown'].get(d, float('nan')):g}x slower)" for d in short)
    return (f"on this host the slow tier ({evidence['slow_tier_medium']}) is not slower than the fast "
            f"tier by offload.claims.slow_tier_min_slowdown {least:g}x: {parts}; what it holds is not out "
            "of a faster memory"), evidence

