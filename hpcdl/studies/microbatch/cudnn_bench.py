"""The cuDNN engine benchmark of one layer (issues 27, 42): every plan of every kernel at every
micro-batch size, timed at every offset the executor runs it at, or a row saying why not.

Before anything is timed, each plan's fate at each micro-batch offset is decided by the pure
alignment.decide (built, within the largest limit, every offset aligned as its graph declares), then
the plan runs once at one offset of each address class (alignment.probe_offsets); what fails there,
or later inside the timing rounds, becomes a "skipped" row with the reason. Nothing a single plan
does stops the layer's other plans. Rows carry the graph's declared alignment (`alignment`).
"""

from __future__ import annotations

import time

import torch

from hpcdl.studies.microbatch.algorithms import KERNELS, KernelCall
from hpcdl.studies.microbatch.alignment import decide, describe, probe_offsets, starts
from hpcdl.studies.microbatch.bench import cuda_peak_extra_bytes, time_rounds
from hpcdl.studies.microbatch.cudnn_engines import KernelGraph, graph_for, inputs_at, kernel_operands


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
) -> tuple[list[dict], dict[tuple[str, int], KernelGraph]]:
    """One row per (kernel, micro-batch, plan): the plan's name and index, its reported and measured
    workspace, its time (fastest and median of `repeats` rounds, all plans of a layer interleaved,
    each call at the next offset 0, b, 2b, ... as the executor walks the batch).

    Status "ok" (timed), "over_limit" (needs more than `max_workspace_bytes`, the largest limit:
    not timed) or "skipped" (did not build, or cannot run at some offset, or failed when run; the
    reason says which). A graph no engine supports gives one skipped row with plan_index -1. Also
    returns the graphs by (kernel, size), for the executor. `progress` (a tqdm bar or None) advances
    by one per (kernel, size)."""
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

                def once(n=0, g=g, i=d.index, kernel=kernel, b=b, offs=offsets, out_full=out_full, ws=None):
                    s = offs[n % len(offs)]  # walk the batch as the executor does
                    out = out_full if kernel == "backward_filter" else out_full[s : s + b]
                    return g.run(i, inputs_at(call, kernel, s, b), out, shared["ws"] if ws is None else ws)

                def with_workspace(g=g, i=d.index, once=once):
                    return once(0, ws=g.workspace(i))  # the allocation itself is what is measured

                try:
                    for s in probes:  # every address class once, before any timing
                        where = s
                        ran = once(offsets.index(s))
                    where = 0
                    measured = cuda_peak_extra_bytes(with_workspace)  # beside the shared buffer
                except Exception as exc:  # noqa: BLE001 - a built plan may still refuse these tensors
                    rows.append({**row, "status": "skipped", "reason": f"at sample {where}: {_why(exc)}"})
                    continue
                configs.append((row, once, ran, measured, time.perf_counter() - t0))
            if progress is not None:
                progress.update(1)
    failed: dict[int, str] = {}
    timed = time_rounds([_guarded(c[1], j, failed) for j, c in enumerate(configs)], "cuda", repeats, warmup)
    for j, ((row, _, ran, measured, wall), (t, t_med, t_wall)) in enumerate(zip(configs, timed, strict=True)):
        if j in failed:
            rows.append({**row, "status": "skipped", "reason": failed[j]})
            continue
        rows.append(
            {
                **row,
                "status": "ok",
                "reason": "",
                "ran": ran,
                "time_s": t,
                "time_median_s": t_med,
                "measured_workspace_bytes": measured,
                "bench_wall_s": wall + t_wall,
            }
        )
    return rows, graphs
