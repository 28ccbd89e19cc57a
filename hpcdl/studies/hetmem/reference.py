"""The SIMULATED reference: a trace-driven two-tier memory simulation (this machine has one NUMA
node and no second memory tier, so placements cannot be measured on hardware here).

A cache hierarchy from pycachesim (sizes and associativities from config) replays the traced
accesses and says where each one was served. Caches are indexed by virtual address, so which
accesses miss does not depend on the placement: the hierarchy is simulated once per application,
and a reference run of a placement times the misses of every instruction window against the tier
each missed page sits in. The timing model has effects the differential estimator does not model:

    cache hits          L2/L3 hit latencies add core time in every placement
    overlap of misses   streaming misses overlap (mlp_stream outstanding), irregular ones less
                        (mlp_random); the core's miss buffers are shared by both tiers, so the
                        latency time of a window is the sum over tiers
    bandwidth limits    a tier moves at most bandwidth_gbs; a window is bound by the larger of its
                        latency time and each tier's transfer time (store misses move two lines:
                        read for ownership, later write-back)
    compute overlap     core time and memory time overlap by compute_overlap

Every table, figure and claim labels this reference "simulated".
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hpcdl.studies.hetmem.layout import Layout
from hpcdl.studies.hetmem.trace import KIND_LOAD, KIND_MODIFY, KIND_STORE, Trace

STREAM_LOOKBACK = 8  # a miss to line L counts as streaming if L-1 missed among the last 8 misses


def build_hierarchy(levels: list[dict], line_bytes: int):
    """pycachesim levels, last level first (each level needs the next one's reference)."""
    from cachesim import Cache, CacheSimulator, MainMemory

    mem = MainMemory()
    below = None
    caches = []
    for lv in reversed(levels):
        sets = lv["size_kib"] * 1024 // (line_bytes * lv["ways"])
        c = Cache(
            lv["name"],
            sets,
            lv["ways"],
            line_bytes,
            "LRU",
            **({} if below is None else {"load_from": below, "store_to": below}),
        )
        if below is None:
            mem.load_to(c)
            mem.store_from(c)
        caches.insert(0, c)
        below = c
    return CacheSimulator(caches[0], mem), caches


def simulate_caches(trace: Trace, levels: list[dict], line_bytes: int) -> np.ndarray:
    """Where each access was served: 0 = first level ... len(levels) = memory."""
    _, caches = build_hierarchy(levels, line_bytes)
    first = caches[0]
    served = np.empty(len(trace.addr), dtype=np.int8)
    before = [0] * len(caches)
    for i, (addr, size, kind) in enumerate(
        zip(trace.addr.tolist(), trace.size.tolist(), trace.kind.tolist(), strict=True)
    ):
        if kind == KIND_LOAD:
            first.load(addr, length=size)
        elif kind == KIND_STORE:
            first.store(addr, length=size)
        else:
            first.load(addr, length=size)
            first.store(addr, length=size)
        depth = 0
        for k, c in enumerate(caches):
            n = c.MISS_count
            if n != before[k]:
                depth = k + 1
                before[k] = n
        served[i] = depth
    return served


@dataclass
class MissProfile:
    """Per instruction window: instructions, cache hits by level, and per page the memory misses
    (streaming / irregular) and bytes moved. Placement-independent."""

    window_instructions: int
    instructions: np.ndarray  # (W,)
    hits: np.ndarray  # (W, levels-1): hits in levels 2.. (first-level hits are in the CPI)
    seq: np.ndarray  # (W, P) streaming misses
    rnd: np.ndarray  # (W, P) irregular misses
    bytes: np.ndarray  # (W, P)
    miss_window: np.ndarray  # window of each memory miss, in order (the PEBS-like event stream)
    miss_page: np.ndarray  # page of each memory miss
    cache_sim_s: float

    @property
    def n_windows(self) -> int:
        return len(self.instructions)


def miss_profile(
    trace: Trace,
    layout: Layout,
    served: np.ndarray,
    n_levels: int,
    line_bytes: int,
    window_instructions: int,
    cache_sim_s: float = float("nan"),
) -> MissProfile:
    n_win = max(1, -(-trace.instructions // window_instructions))
    win = np.minimum(trace.icount // window_instructions, n_win - 1)
    instr = np.full(n_win, window_instructions, dtype=np.float64)
    instr[-1] = trace.instructions - window_instructions * (n_win - 1)
    hits = (
        np.stack([np.bincount(win[served == k], minlength=n_win) for k in range(1, n_levels)], axis=1)
        if n_levels > 1
        else np.zeros((n_win, 0))
    )
    page = layout.page_index(trace.addr)
    miss = served == n_levels
    m_win, m_page = win[miss], page[miss]
    lines = trace.addr[miss] // line_bytes
    streaming = np.zeros(len(lines), dtype=bool)
    for k in range(1, STREAM_LOOKBACK + 1):
        streaming[k:] |= lines[k:] - 1 == lines[:-k]
    stores = np.isin(trace.kind[miss], (KIND_STORE, KIND_MODIFY))
    shape = (n_win, layout.n_pages)
    flat = m_win * layout.n_pages + m_page

    def grid(weights):
        return np.bincount(flat, weights=weights, minlength=shape[0] * shape[1]).reshape(shape)

    return MissProfile(
        window_instructions,
        instr,
        hits.astype(np.float64),
        grid(streaming.astype(float)),
        grid((~streaming).astype(float)),
        grid(line_bytes * (1.0 + stores)),
        m_win,
        m_page,
        cache_sim_s,
    )


@dataclass(frozen=True)
class TimingModel:
    freq_ghz: float
    cpi: float
    hit_latency_cycles: tuple[float, ...]  # levels 2.. of the hierarchy
    mlp_stream: float
    mlp_random: float
    compute_overlap: float
    fast_latency_ns: float
    fast_bandwidth_gbs: float
    slow_latency_ns: float
    slow_bandwidth_gbs: float

    @classmethod
    def from_config(cls, block: dict) -> TimingModel:
        core, fast, slow = block["core"], block["tiers"]["fast"], block["tiers"]["slow"]
        return cls(
            core["freq_ghz"],
            core["cpi"],
            tuple(lv["hit_latency_cycles"] for lv in block["caches"][1:]),
            core["mlp_stream"],
            core["mlp_random"],
            core["compute_overlap"],
            fast["latency_ns"],
            fast["bandwidth_gbs"],
            slow["latency_ns"],
            slow["bandwidth_gbs"],
        )


def window_times(profile: MissProfile, model: TimingModel, masks: np.ndarray) -> np.ndarray:
    """Simulated time (s) of every window for each placement: masks (K, P) -> (K, W)."""
    masks = np.atleast_2d(masks).astype(np.float64)
    core_s = (
        profile.instructions * model.cpi + profile.hits @ np.asarray(model.hit_latency_cycles, dtype=float)
    ) / (model.freq_ghz * 1e9)
    lat_s = np.zeros((len(masks), profile.n_windows))
    bw_s = np.zeros_like(lat_s)
    for on_fast, lat_ns, bw in (
        (masks, model.fast_latency_ns, model.fast_bandwidth_gbs),
        (1.0 - masks, model.slow_latency_ns, model.slow_bandwidth_gbs),
    ):
        lat_s += (
            ((profile.seq @ on_fast.T) / model.mlp_stream + (profile.rnd @ on_fast.T) / model.mlp_random).T
            * lat_ns
            * 1e-9
        )
        bw_s = np.maximum(bw_s, (profile.bytes @ on_fast.T).T / (bw * 1e9))
    mem_s = np.maximum(lat_s, bw_s)
    both = np.minimum(core_s, mem_s)
    return np.maximum(core_s, mem_s) + (1.0 - model.compute_overlap) * both


def reference_runs(profile: MissProfile, model: TimingModel, masks: np.ndarray) -> tuple[np.ndarray, float]:
    """Total simulated runtime of each placement, and the time one reference run costs: the cache
    simulation of the trace plus this placement's timing (the cache part is shared, see above)."""
    t0 = time.perf_counter()
    totals = window_times(profile, model, masks).sum(axis=1)
    per_run = (time.perf_counter() - t0) / max(1, len(np.atleast_2d(masks)))
    return totals, profile.cache_sim_s + per_run


def simulate(trace: Trace, layout: Layout, block: dict) -> MissProfile:
    """Replay the trace through the configured hierarchy (timed) and build the miss profile."""
    t0 = time.perf_counter()
    served = simulate_caches(trace, block["caches"], block["line_bytes"])
    sim_s = time.perf_counter() - t0
    return miss_profile(
        trace, layout, served, len(block["caches"]), block["line_bytes"], block["window_instructions"], sim_s
    )
