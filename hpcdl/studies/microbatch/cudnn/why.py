"""Why micro-batching does or does not pay, per kernel and workspace limit, read off a cuDNN engine
table (pure: pandas, no torch; issue #58 item 2).

μ-cuDNN gains where three things hold at once: under a limit L the fastest engine at the full
mini-batch B needs more than L (the limit binds), that engine's workspace shrinks below L at some
micro-batch b < B, and B/b calls of it at b still beat the fastest engine that fits L undivided (the
baseline). On a newer GPU and cuDNN any of the three can fail, and an engine table says which:

    the fastest engine's workspace at each micro-batch size   fastest_engine, fastest_workspace_bytes
    the per-call overhead                                      call_over_share: the time of one call at b
                                                               over its share (b / B) of the fastest
                                                               undivided call; same_engine_call_over_share
                                                               with the same engine's undivided call
    the undivided engines that fit each limit                  undivided_fitting of undivided_engines

One row per (network, layer, kernel, limit, micro-batch b) for b in the powers of two up to B and B
itself (the DP may use other sizes too; its plan is in the dp_* columns), with the kernel's verdict
under that limit (`cause`, `why`) repeated on its rows:

    no_baseline     no engine fits L at the full mini-batch
    not_binding     the fastest undivided engine fits L: there is nothing to gain by dividing
    workspace       the engines faster than the baseline need more than L at every micro-batch size
    overhead        one of them fits L at some b, but B/b calls of the fastest engine fitting L at b
                    take longer than the baseline (the per-call overhead eats the faster engine's gain)
    divides         the DP (the richest configured policy) divides the kernel and beats the baseline
    planner_missed  an even division at some b beats the baseline on this table, yet the DP does not
                    divide (it should never: the DP's divisions include every even one)

`divided_over_baseline` is the even division's time at b (B/b calls of the fastest engine fitting L
at b) over the baseline's: below 1 dividing by b pays. The table is built from the engine table the
study's run measures (raw/cudnn_engines.csv) or that `make gpu` records
(hpcdl.studies.microbatch.cudnn.engine_table, tests/data/microbatch_cudnn_<gpu>.csv): the same columns.
Engines over the largest limit are not timed there (`engines_over_limit` counts them): a faster engine
beyond it is invisible to every limit planned.
"""

from __future__ import annotations

import math

import pandas as pd

from hpcdl.studies.microbatch.common.dp import KernelDP, WorkspaceError, division_text
from hpcdl.studies.microbatch.cudnn.limits import label
from hpcdl.studies.microbatch.cudnn.plan import limit_settings, network_limits_mib, planned_policies

MiB = 2**20
CAUSES = ("no_baseline", "not_binding", "workspace", "overhead", "divides", "planner_missed")
CAUSE_TEXT = {
    "no_baseline": "no engine fits the limit undivided",
    "not_binding": "the fastest undivided engine fits the limit",
    "workspace": "faster engines' workspace never fits",
    "overhead": "a faster engine fits divided, per-call overhead eats its gain",
    "divides": "the DP divides and gains",
    "planner_missed": "an even division gains, the DP does not divide",
}
KEY_COLS = ["network", "layer", "kernel", "count", "batch_size", "limit_mib", "limit_label", "policy"]
KERNEL_COLS = [
    "cause", "why", "undivided_engines", "undivided_fitting", "fastest_undivided_engine",
    "fastest_undivided_time_s", "fastest_undivided_workspace_bytes", "baseline_engine", "baseline_time_s",
    "baseline_workspace_bytes", "faster_engines", "dp_micro_batches", "dp_engines", "dp_time_s",
    "dp_speedup", "dp_divided", "best_even_micro_batch", "best_even_over_baseline",
]
SIZE_COLS = [
    "micro_batch", "engines_timed", "engines_over_limit", "fastest_engine", "fastest_time_s",
    "fastest_workspace_bytes", "fastest_fits_limit", "same_engine_undivided_time_s", "call_over_share",
    "same_engine_call_over_share", "fitting_engine", "fitting_time_s", "fitting_workspace_bytes",
    "divided_time_s", "divided_over_baseline", "faster_fit_at_micro_batch", "faster_least_workspace_bytes",
]
COLUMNS = [*KEY_COLS, *KERNEL_COLS, *SIZE_COLS]
EPS = 1e-9  # relative: times equal within this are ties (the same measurement read twice)


def limits_for(block: dict, networks: list[str]) -> dict[str, list[tuple[float, str]]]:
    """Each network's limits as the study plans them (plan.network_limits_mib plus the library
    default), from a validated microbatch block."""
    return {n: limit_settings(network_limits_mib(block, n)) for n in networks}


def _mib(b: float) -> str:
    return f"{b / MiB:.3g} MiB"


def _shown_sizes(sizes: list[int], batch: int) -> list[int]:
    """The micro-batch sizes a kernel's rows show: powers of two and the mini-batch, as benchmarked."""
    return sorted(b for b in set(sizes) if b == batch or b & (b - 1) == 0)


def _dp(dp: KernelDP | None, limit_bytes: float) -> tuple | None:
    """The DP's plan under the limit: (division, time, workspace), None where nothing fits."""
    try:
        if dp is None:
            return None
        i, t, w = dp.best(limit_bytes)
    except (WorkspaceError, ValueError):
        return None
    return tuple(dp.division(i)), t, w


def _kernel_rows(net: str, key, count: int, batch: int, cells: dict, over: dict, settings, policy: str
                 ) -> list[dict]:
    """One kernel's rows under every limit: cells (engine, b) -> (time, workspace), over b -> count of
    engines over the largest limit."""
    sizes = sorted({b for _, b in cells})
    by_size = {b: {e: tw for (e, bb), tw in cells.items() if bb == b} for b in sizes}
    full = by_size.get(batch, {})
    best_e = min(full, key=lambda e: (full[e][0], full[e][1], e)) if full else None
    best_t = full[best_e][0] if best_e else math.nan
    try:  # one DP per kernel, asked under every limit
        dp = KernelDP(cells, batch, policy, label=label(key), skip_missing=True)
        dp.front()
    except ValueError:
        dp = None
    rows = []
    for limit_mib, limit_label in settings:
        lb = limit_mib * MiB
        fits = {e: tw for e, tw in full.items() if tw[1] <= lb}
        base_e = min(fits, key=lambda e: (fits[e][0], fits[e][1], e)) if fits else None
        base_t, base_w = fits[base_e] if base_e else (math.nan, math.nan)
        faster = sorted(e for e, (t, _) in full.items() if base_e and t < base_t * (1 - EPS))
        plan = _dp(dp, lb)
        dp_div = bool(plan and len(plan[0]) > 1)
        dp_speedup = base_t / plan[1] if plan and base_e else math.nan
        size_rows, even = [], {}
        for b in _shown_sizes(sizes, batch):
            at = by_size[b]
            e_b = min(at, key=lambda e: (at[e][0], at[e][1], e))
            t_b, w_b = at[e_b]
            fit_b = {e: tw for e, tw in at.items() if tw[1] <= lb}
            ef = min(fit_b, key=lambda e: (fit_b[e][0], fit_b[e][1], e)) if fit_b else None
            tf, wf = fit_b[ef] if ef else (math.nan, math.nan)
            same = full.get(e_b, (math.nan, math.nan))[0]
            share = b / batch
            divided = tf * batch / b if ef else math.nan
            faster_ws = [at[e][1] for e in faster if e in at]
            if b < batch and ef and base_e:
                even[b] = divided / base_t
            size_rows.append({
                "micro_batch": b, "engines_timed": len(at), "engines_over_limit": int(over.get(b, 0)),
                "fastest_engine": e_b, "fastest_time_s": t_b, "fastest_workspace_bytes": w_b,
                "fastest_fits_limit": bool(w_b <= lb),
                "same_engine_undivided_time_s": same,
                "call_over_share": t_b / (best_t * share) if best_e else math.nan,
                "same_engine_call_over_share": t_b / (same * share) if same == same else math.nan,
                "fitting_engine": ef or "", "fitting_time_s": tf, "fitting_workspace_bytes": wf,
                "divided_time_s": divided, "divided_over_baseline": divided / base_t if base_e else math.nan,
                "faster_fit_at_micro_batch": bool(b < batch and any(w <= lb for w in faster_ws)),
                "faster_least_workspace_bytes": min(faster_ws) if faster_ws else math.nan,
            })
        best_b = min(even, key=even.get) if even else None
        cause, why = _verdict(batch, limit_mib, best_e, full, base_e, base_t, faster, plan, dp_div,
                              dp_speedup, even, best_b, cells, lb)
        kernel = {
            "network": net, "layer": key[0], "kernel": key[1], "count": count, "batch_size": batch,
            "limit_mib": float(limit_mib), "limit_label": limit_label, "policy": policy,
            "cause": cause, "why": why,
            "undivided_engines": len(full), "undivided_fitting": len(fits),
            "fastest_undivided_engine": best_e or "", "fastest_undivided_time_s": best_t,
            "fastest_undivided_workspace_bytes": full[best_e][1] if best_e else math.nan,
            "baseline_engine": base_e or "", "baseline_time_s": base_t, "baseline_workspace_bytes": base_w,
            "faster_engines": len(faster),
            "dp_micro_batches": division_text(plan[0])[0] if plan else "",
            "dp_engines": division_text(plan[0])[1] if plan else "",
            "dp_time_s": plan[1] if plan else math.nan, "dp_speedup": dp_speedup, "dp_divided": dp_div,
            "best_even_micro_batch": best_b if best_b is not None else math.nan,
            "best_even_over_baseline": even[best_b] if best_b is not None else math.nan,
        }
        rows += [{**kernel, **r} for r in size_rows]
    return rows


def _verdict(batch, limit_mib, best_e, full, base_e, base_t, faster, plan, dp_div, dp_speedup, even, best_b,
             cells, lb) -> tuple[str, str]:
    """The kernel's cause under one limit and a sentence with its numbers."""
    if base_e is None:
        least = min((w for _, w in full.values()), default=math.nan)
        return "no_baseline", (f"no engine fits {limit_mib:g} MiB at the full mini-batch {batch} (the least "
                               f"needs {_mib(least)})")
    if full[best_e][0] >= base_t * (1 - EPS):
        return "not_binding", (f"the fastest undivided engine {base_e} ({_mib(full[base_e][1])}) fits "
                               f"{limit_mib:g} MiB: {len([1 for _, w in full.values() if w <= lb])} of "
                               f"{len(full)} undivided engines fit")
    gain = f"{best_e} undivided is {base_t / full[best_e][0]:.2f}x the baseline {base_e}"
    if dp_div and dp_speedup > 1 + EPS:
        return "divides", (f"the DP divides ({division_text(plan[0])[0]}) and plans {dp_speedup:.2f}x; "
                           f"{gain}")
    if best_b is not None and even[best_b] < 1 - EPS:
        return "planner_missed", (f"{batch // best_b} calls at micro-batch {best_b} take "
                                  f"{even[best_b]:.2f}x the baseline, yet the DP does not divide")
    # the micro-batch sizes below B at which an engine faster than the baseline (undivided) fits the limit
    fit = {bb for (e, bb), (_, w) in cells.items() if bb < batch and e in faster and w <= lb}
    if not fit:
        least = min((w for (e, bb), (_, w) in cells.items() if e in faster and bb < batch), default=math.nan)
        return "workspace", (f"{len(faster)} engine(s) beat the baseline undivided ({gain}); at every "
                             f"smaller micro-batch they need at least {_mib(least)} > {limit_mib:g} MiB")
    b = max(fit)  # the largest micro-batch a faster engine fits: the fewest calls
    ratio = min(t for (_, bb), (t, w) in cells.items() if bb == b and w <= lb) * batch / b / base_t
    best = f" (best even division: {even[best_b]:.2f}x at {best_b})" if best_b is not None else ""
    return "overhead", (f"{gain}; a faster engine fits {limit_mib:g} MiB at micro-batch {b} (the largest "
                        f"it fits), where {batch // b} calls of the fastest fitting engine take {ratio:.2f}x "
                        f"the baseline{best}")


def why_table(engines: pd.DataFrame, limits: dict[str, list[tuple[float, str]]] | list[float],
              policies=("powerOfTwo",)) -> pd.DataFrame:
    """The table described in the module's docstring, from an engine table (rows of status ok are
    timed, over_limit ones counted; one network or several, each planned alone). `limits`: per
    network its (MiB, label) settings (`limits_for`), or one list of MiB for every network (the
    library default added, as the study plans). `policies`: the configured ones (the DP uses the
    richest: the last of plan.planned_policies)."""
    if engines.empty or "status" not in engines:
        return pd.DataFrame(columns=COLUMNS)
    policy = planned_policies(list(policies))[-1]
    rows = []
    for net, t in engines.groupby("network", sort=False):
        settings = limits.get(net, []) if isinstance(limits, dict) else limit_settings(limits)
        if not settings:
            continue
        ok = t[t["status"] == "ok"]
        if ok.empty:
            continue
        batch = int(t["batch_size"].dropna().iloc[0]) if "batch_size" in t and t["batch_size"].notna().any() \
            else int(ok["micro_batch"].max())
        over = t[t["status"] == "over_limit"]
        for (layer, kernel), g in ok.groupby(["layer", "kernel"], sort=False):
            cells = {(str(r.engine), int(r.micro_batch)): (float(r.time_s), float(r.workspace_bytes))
                     for r in g.itertuples(index=False)}
            o = over[(over["layer"] == layer) & (over["kernel"] == kernel)]
            n_over = o.groupby(o["micro_batch"].astype(int)).size().to_dict() if len(o) else {}
            rows += _kernel_rows(str(net), (str(layer), str(kernel)), int(g["count"].iloc[0]), batch, cells,
                                 n_over, settings, policy)
    return pd.DataFrame(rows, columns=COLUMNS)


def causes(why: pd.DataFrame) -> pd.DataFrame:
    """How many kernels (and kernel calls, each layer's count times) each cause holds per network and
    limit: the figure's first row, and the summary a reader checks first."""
    cols = ["network", "limit_mib", "limit_label", "cause", "kernels", "kernel_calls"]
    if why.empty:
        return pd.DataFrame(columns=cols)
    k = why.drop_duplicates(["network", "layer", "kernel", "limit_mib"])
    g = k.groupby(["network", "limit_mib", "limit_label", "cause"], sort=False)
    return pd.DataFrame({"kernels": g.size(), "kernel_calls": g["count"].sum()}).reset_index()[cols]

