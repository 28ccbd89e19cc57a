"""The cuDNN engine benchmark of one layer (issues 27, 42): every plan of every kernel at every
micro-batch size, timed at every offset the executor runs it at, or a row saying why not.

Before anything is timed, each plan's fate at each micro-batch offset is decided by the pure
alignment.decide (built, within the largest limit, every offset aligned as its graph declares), then
the plan runs once at one offset of each address class (alignment.probe_offsets; the first, at sample
0, with a workspace of its own, measures the plan's workspace too); what fails there, or later inside
the timing rounds, becomes a "skipped" row with the reason. Nothing a single plan does stops the
layer's other plans. Rows carry the graph's declared alignment (`alignment`) and how many rounds
timed them (`repeats`).

The probe is the plan's first warm-up call: `warmup` - 1 more run before its timed rounds. With a
`screen_ratio` (microbatch.cudnn.screen_ratio: time, not the setting), every plan is timed in one
round first; a plan at least that many times slower than another of the same kernel and micro-batch
that needs no more workspace is dominated (limits.dominated: no limit can choose it) and keeps that
round's time, the others run the remaining `repeats` - 1 rounds. On the H200 table of 2026-11-27
(batch 64) such plans (by 1.5x) took about 80 % of the benchmark's GPU time.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from hpcdl.studies.microbatch.choice.algorithms import KERNELS, KernelCall
from hpcdl.studies.microbatch.choice.bench import cuda_peak_extra_bytes, round_times
from hpcdl.studies.microbatch.cudnn.alignment import decide, describe, probe_offsets, starts
from hpcdl.studies.microbatch.cudnn.engines import KernelGraph, graph_for, inputs_at, kernel_operands
from hpcdl.studies.microbatch.cudnn.limits import dominated


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _guarded(fn, j: int, failed: dict[int, str]):
    """fn, with its first exception kept in failed[j] (and later calls skipped) instead of raised:
    a plan failing inside the timing rounds must not take the layer's other plans with it."""

    def call(n=0):
        if j in failed:
            return None
        try:
            return fn(n)
        except Exception as exc:  # noqa: BLE001 - the binding raises its own types
            failed[j] = f"during timing: {_why(exc)}"
            return None

    return call


def benchmark_layer(
    call: KernelCall,
    sizes: list[int],
    repeats: int,
    warmup: int,
    max_workspace_bytes: float,
    tf32: bool = False,
    kernels: tuple[str, ...] = KERNELS,
    progress=None,
    screen_ratio: float | None = None,
) -> tuple[list[dict], dict[tuple[str, int], KernelGraph]]:
    """One row per (kernel, micro-batch, plan): the plan's name and index, its reported and measured
    workspace, its time (fastest and median of `repeats` rounds, all plans of a layer interleaved,
    each call at the next offset 0, b, 2b, ... as the executor walks the batch).

    Status "ok" (timed), "over_limit" (needs more than `max_workspace_bytes`, the largest limit:
    not timed) or "skipped" (did not build, or cannot run at some offset, or failed when run; the
    reason says which). A graph no engine supports gives one skipped row with plan_index -1. Also
    returns the graphs by (kernel, size), for the executor. `progress` (a tqdm bar or None) advances
    by one per (kernel, size). `screen_ratio`: see the module's docstring (None: every plan is timed
    `repeats` rounds)."""
    if call.device != "cuda":
        raise ValueError("cuDNN engines are benchmarked on CUDA only")
    wrong = [b for b in sizes if not 1 <= b <= call.batch]
    if wrong:
        raise ValueError(f"layer {call.layer.name}: micro-batch sizes {wrong} are not within 1..{call.batch}")
    base = {"layer": call.layer.name, "count": call.layer.count}
    rows, configs, graphs = [], [], {}
    # one workspace for every timed plan, grown to the largest need (as the executor holds one per
    # layer): a buffer per plan would hold hundreds of them, up to the largest limit each
    shared = {"ws": torch.empty(1, dtype=torch.uint8, device=call.x.device)}
    for kernel in kernels:
        ops = kernel_operands(call, kernel)
        out_full = call.output(kernel)
        for b in sizes:
            cell = {**base, "kernel": kernel, "micro_batch": b}
            try:
                g = graph_for(call, kernel, b, tf32)
            except Exception as exc:  # noqa: BLE001 - no engine supports this graph at all
                why = _why(exc)
                rows.append({**cell, "engine": "", "plan_index": -1, "status": "skipped", "reason": why})
                if progress is not None:
                    progress.update(1)
                continue
            graphs[(kernel, b)] = g
            offsets = starts(call.batch, b)
            probes = probe_offsets(ops, offsets)
            cell.update(plan_count=g.count, alignment=describe(g.alignment))
            for d in decide(g.plans, g.refused, ops, g.alignment, offsets, max_workspace_bytes):
                row = {**cell, "engine": d.engine, "plan_index": d.index}
                row["workspace_bytes"] = d.workspace_bytes
                if d.status != "run":
                    rows.append({**row, "status": d.status, "reason": d.reason})
                    continue
                t0 = time.perf_counter()
                if shared["ws"].numel() < d.workspace_bytes:
                    shared["ws"] = torch.empty(d.workspace_bytes, dtype=torch.uint8, device=call.x.device)
                once = _plan_call(call, kernel, b, g, d.index, offsets, out_full, shared)
                probed, why = _probe(once, g, d.index, offsets, probes)
                if probed is None:
                    rows.append({**row, "status": "skipped", "reason": why})
                    continue
                configs.append((row, once, *probed, time.perf_counter() - t0))
            if progress is not None:
                progress.update(1)
    rows += _timed_rows(configs, repeats, warmup, screen_ratio)
    return rows, graphs


def _plan_call(call: KernelCall, kernel: str, b: int, g: KernelGraph, index: int, offsets: list[int],
               out_full: torch.Tensor, shared: dict):
    """Plan `index` of `g` as a call: its n-th call runs at the n-th offset (walking the batch as the
    executor does), into the full result, with the shared workspace unless given its own."""

    def once(n=0, ws=None):
        s = offsets[n % len(offsets)]
        out = out_full if kernel == "backward_filter" else out_full[s : s + b]
        return g.run(index, inputs_at(call, kernel, s, b), out, shared["ws"] if ws is None else ws)

    return once


def _probe(once, g: KernelGraph, index: int, offsets: list[int], probes: list[int]):
    """Every address class once, before any timing; the first (sample 0: probes[0] is offsets[0]) with
    a workspace of its own, whose extra peak memory is the plan's. Returns ((what ran, that peak), "")
    or, where the plan refused (a built plan may still refuse these tensors), (None, the reason)."""
    got = {}

    def with_workspace():
        got["ran"] = once(0, ws=g.workspace(index))  # the allocation itself is what is measured

    where = 0
    try:
        measured = cuda_peak_extra_bytes(with_workspace)  # beside the shared buffer
        ran = got["ran"]
        for s in probes[1:]:
            where = s
            ran = once(offsets.index(s))
    except Exception as exc:  # noqa: BLE001 - the binding raises its own types
        return None, f"at sample {where}: {_why(exc)}"
    return (ran, measured), ""


def _timed_rows(configs: list[tuple], repeats: int, warmup: int, screen_ratio: float | None) -> list[dict]:
    """The probed plans timed in interleaved rounds (timed_rounds): an "ok" row each, or a "skipped"
    row for a plan that failed inside the rounds."""
    rows = []
    failed: dict[int, str] = {}
    fns = [_guarded(c[1], j, failed) for j, c in enumerate(configs)]
    times, walls = timed_rounds(fns, [(c[0]["kernel"], c[0]["micro_batch"]) for c in configs],
                                [c[0]["workspace_bytes"] for c in configs], failed, repeats, warmup,
                                screen_ratio)
    for j, ((row, _, ran, measured, wall), t, t_wall) in enumerate(zip(configs, times, walls, strict=True)):
        if j in failed:
            rows.append({**row, "status": "skipped", "reason": failed[j]})
            continue
        rows.append(
            {
                **row,
                "status": "ok",
                "reason": "",
                "ran": ran,
                "time_s": min(t),
                "time_median_s": statistics.median(t),
                "repeats": len(t),
                "measured_workspace_bytes": measured,
                "bench_wall_s": wall + t_wall,
            }
        )
    return rows


def timed_rounds(fns: list, groups: list, workspaces: list[float], failed: dict[int, str], repeats: int,
                 warmup: int, screen_ratio: float | None, device: str = "cuda"
                 ) -> tuple[list[list[float]], list[float]]:
    """Each plan's round times and wall seconds: `warmup` - 1 untimed calls (its probe was the first),
    then `repeats` interleaved rounds; with `screen_ratio`, one round of every plan, then the remaining
    rounds only for those no other plan of its group (kernel, micro-batch) dominates (limits.dominated).
    A plan in `failed` (it raised in a round) is never dominating."""
    extra = max(warmup - 1, 0)
    times, walls = round_times(fns, device, 1 if screen_ratio else repeats, extra)
    if not screen_ratio or repeats == 1 or not fns:
        return times, walls
    cells = [(g, float(w), t[0] if j not in failed else math.nan)
             for j, (g, w, t) in enumerate(zip(groups, workspaces, times, strict=True))]
    out = dominated(cells, screen_ratio)
    keep = [j for j in range(len(fns)) if j not in out and j not in failed]
    more, more_wall = round_times([fns[j] for j in keep], device, repeats - 1, 0, first_call=extra + 1)
    for j, t, w in zip(keep, more, more_wall, strict=True):
        times[j] += t
        walls[j] += w
    return times, walls
