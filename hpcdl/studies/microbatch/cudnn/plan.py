"""The study's plans over a network's cuDNN engine table under every workspace limit, and their
rows (pure: no torch, no GPU; hpcdl.studies.microbatch.cudnn.study runs them on CUDA).

Limits: microbatch.cudnn.limits_mib (DeepBench: cudnn.deepbench_limits_mib where set,
`network_limits_mib`) plus μ-cuDNN's library default, 64 MiB (spcl/ucudnn README: "workspace limit
64 MiB, micro-batch policy powerOfTwo"), labelled "default (64 MiB)". Under a
limit L, per kernel of the network (layer x forward / backward_data / backward_filter):

  baseline  the fastest engine that fits L at the full mini-batch (limits.fastest_undivided): what a
            framework bounded by L runs, undivided
  dp        μ-cuDNN's DP for that kernel under L (its per-kernel limit, "WR")
  ilp       μ-cuDNN's ILP over the network under one budget, L x the kernels' count ("WD", the
            memory the per-kernel limit allows in all): a kernel may take more than L where another
            takes less, so a single kernel may be slower than its baseline while the network is not

Every row and rollup names its mode (`mode`: WR for the DP, WD for the ILP) and what bounds it
(`budget_label`: "8 MiB per kernel (WR)", "120 MiB pooled over 15 kernel calls (WD)": a layer
the network runs n times counts n times).

One row per (limit, policy, planner, kernel): the baseline beside the plan, both benchmarked
("planned") and, after `attach_measured`, executed ("measured"). `rollup` sums a network's kernels
(each layer's kernels `count` times); `plan_problems` checks plans against their engine table.
"""

from __future__ import annotations

import math

import pandas as pd

from hpcdl.studies.microbatch.common.dp import KernelDP, WorkspaceError, division_text
from hpcdl.studies.microbatch.common.ilp import solve
from hpcdl.studies.microbatch.cudnn import limits

MiB = limits.MiB
DEFAULT_LIMIT_MIB = 64.0  # μ-cuDNN's library default (spcl/ucudnn README)
PLANNERS = ("dp", "ilp")
Division = tuple[tuple[str, int], ...]
# (layer, kernel), the baseline's division (None: no engine fits), the plan's (None: infeasible)
Config = tuple[limits.Key, Division | None, Division | None]
KEYS = ["network", "limit_mib", "limit_label", "policy", "planner"]


# μ-cuDNN's two modes and the planner that stands for each (hpcdl.studies.microbatch.paper): every row
# and rollup names its mode, and every figure labels its planner so
MODE = {"dp": "WR", "ilp": "WD"}
MODE_LABEL = {"dp": "DP per kernel (WR)", "ilp": "ILP network budget (WD)"}


def cudnn_networks(block: dict) -> list[str]:
    """The networks μ-cuDNN's experiment runs: microbatch.cudnn.networks, or microbatch.networks."""
    return list((block.get("cudnn") or {}).get("networks") or block["networks"])


def network_limits_mib(block: dict, network: str) -> list[float]:
    """One network's per-kernel limits (MiB): microbatch.cudnn.deepbench_limits_mib for DeepBench where
    set (the spcl/ucudnn README's 128, 256 and 512 MiB), else microbatch.cudnn.limits_mib."""
    cudnn = block.get("cudnn") or {}
    if network == "deepbench" and cudnn.get("deepbench_limits_mib"):
        return [float(v) for v in cudnn["deepbench_limits_mib"]]
    return [float(v) for v in cudnn.get("limits_mib", [8, 64, 512])]


def budget_label(planner: str, limit_mib: float, budget_bytes: float, kernels: int) -> str:
    """What bounds a plan, with its mode: "8 MiB per kernel (WR)" or "120 MiB pooled over 15 kernel
    calls (WD)" (`kernels`: the network's kernel calls, a layer run n times counted n times)."""
    if planner == "ilp":
        return f"{budget_bytes / MiB:g} MiB pooled over {kernels} kernel calls (WD)"
    return f"{limit_mib:g} MiB per kernel (WR)"


def limit_settings(limits_mib) -> list[tuple[float, str]]:
    """(MiB, label) of every limit the study plans under: the configured ones and the library's
    default, ascending; the default is named so."""
    values = sorted({float(v) for v in limits_mib} | {DEFAULT_LIMIT_MIB})
    return [(v, f"default ({v:g} MiB)" if v == DEFAULT_LIMIT_MIB else f"{v:g} MiB") for v in values]


def planned_policies(policies) -> list[str]:
    """The DP's policies: every configured one that can divide (`undivided` is the baseline
    itself); `undivided` alone where nothing else is configured (the plans then equal it)."""
    return [p for p in policies if p != "undivided"] or ["undivided"]


def _text(division: Division | None) -> tuple[str, str]:
    if not division:
        return "", ""
    return division_text(division)


def _row(network, limit_mib, label, policy, planner, key, count, base, choice, budget, kernels,
         reason) -> dict:
    sizes, engines = _text(choice.division if choice else None)
    planned = choice.time_s if choice else math.nan
    base_t = base.time_s if base else math.nan
    return {
        "network": network, "limit_mib": limit_mib, "limit_label": label, "policy": policy,
        "planner": planner, "mode": MODE[planner], "layer": key[0], "kernel": key[1], "count": count,
        "baseline_engine": base.engines if base else "",
        "baseline_time_s": base_t,
        "baseline_workspace_bytes": base.workspace_bytes if base else math.nan,
        "micro_batches": sizes, "engines": engines,
        "n_micro_batches": len(choice.division) if choice else 0,
        "divided": bool(choice and len(choice.division) > 1),
        "workspace_bytes": choice.workspace_bytes if choice else math.nan,
        "budget_bytes": budget,
        "budget_label": budget_label(planner, limit_mib, budget, kernels),
        "planned_time_s": planned,
        "planned_speedup": base_t / planned if choice and base else math.nan,
        "feasible": choice is not None,
        "reason": reason,
    }


def _dps(cells: dict, batch: int, policy: str) -> tuple[dict, dict]:
    """Each kernel's DP (sizes no engine ran at left out), and why a kernel has none."""
    dps, why = {}, {}
    for key, c in cells.items():
        try:
            dp = KernelDP(c, batch, policy, label=limits.label(key), skip_missing=True)
            dp.front()
            dps[key] = dp
        except ValueError as exc:
            why[key] = str(exc)
    return dps, why


def _ilp(dps: dict, why: dict, counts: dict, budget: float) -> tuple[dict, str]:
    """μ-cuDNN's ILP over every kernel's DP front under `budget` (ilp.solve): the choice per kernel,
    or {} and why not."""
    if why:
        return {}, f"ILP: {len(why)} kernel(s) have no configuration"
    fronts = {limits.label(k): dp.front() for k, dp in dps.items()}
    try:
        res = solve(fronts, {limits.label(k): counts[k] for k in dps}, budget)
    except WorkspaceError as exc:
        return {}, f"ILP: {exc}"
    out = {}
    for key, dp in dps.items():
        j = res.choice[limits.label(key)]
        f = fronts[limits.label(key)]
        out[key] = limits.Choice(tuple(dp.division(j)), float(f.time_s[j]), float(f.workspace[j]))
    return out, ""


def plan_network(
    table: pd.DataFrame,
    network: str,
    batch: int,
    policies: list[str],
    limits_mib,
    counts: dict[limits.Key, int] | None = None,
) -> tuple[list[dict], list[Config]]:
    """Every (limit, policy, planner, kernel) row of one network's engine table (limits.COLUMNS,
    ok rows), and beside each row its configuration: the baseline's and the plan's divisions
    [(engine, micro-batch), ...], which is what the executor runs. A kernel with no engine fitting
    the limit at the full mini-batch has no baseline (its DP may still divide); a plan that cannot
    fit gives a row with feasible False; either way `reason` says why. `budget_bytes` is the plan's
    bound: the per-kernel limit (dp) or the network's budget, the limit x the kernels' count (ilp)."""
    cells = limits.kernel_tables(table)
    counts = {k: int((counts or {}).get(k, 1)) for k in cells}
    rows, configs = [], []
    for limit_mib, label in limit_settings(limits_mib):
        lb = limit_mib * MiB
        base, why_base = {}, {}
        for key, c in cells.items():
            try:
                base[key] = limits.fastest_undivided(key, c, batch, lb)
            except ValueError as exc:  # WorkspaceError, or no engine at the full mini-batch
                base[key], why_base[key] = None, f"no baseline: {exc}"
        budget = lb * sum(counts.values())
        for policy in policies:
            dps, why_dp = _dps(cells, batch, policy)
            ilp, why_ilp = _ilp(dps, why_dp, counts, budget)
            for planner, bound in (("dp", lb), ("ilp", budget)):
                for key in cells:
                    choice, why = None, why_dp.get(key, "")
                    if planner == "ilp":
                        choice, why = ilp.get(key), why or why_ilp
                    elif key in dps:
                        try:
                            i, t, w = dps[key].best(lb)
                            choice = limits.Choice(tuple(dps[key].division(i)), t, w)
                        except WorkspaceError as exc:
                            why = str(exc)
                    reason = "; ".join(r for r in (why_base.get(key, ""), why) if r)
                    rows.append(_row(network, limit_mib, label, policy, planner, key, counts[key], base[key],
                                     choice, bound, sum(counts.values()), reason))
                    configs.append((key, _division(base[key]), _division(choice)))
    return rows, configs


def _division(choice: limits.Choice | None) -> Division | None:
    return tuple((str(e), int(b)) for e, b in choice.division) if choice else None


def distinct_divisions(configs: list[Config]) -> dict[limits.Key, list[Division]]:
    """Per kernel, every division a baseline or a plan runs, each once (in first-seen order): the
    executor times each of them, and a plan equal to its baseline is the same measurement."""
    out: dict[limits.Key, list[Division]] = {}
    for key, base, plan in configs:
        got = out.setdefault(key, [])
        for d in (base, plan):
            if d is not None and d not in got:
                got.append(d)
    return out


MEASURED = ["baseline_measured_time_s", "measured_time_s", "measured_speedup", "noise_frac",
            "same_as_baseline", "rounds", "max_rel_err", "err_fp64", "default_err_fp64"]
# raw/cudnn_limits.csv's columns (written with these alone where the experiment did not run)
ROW_COLS = [*KEYS, "mode", "layer", "kernel", "count", "baseline_engine", "baseline_time_s",
            "baseline_workspace_bytes", "micro_batches", "engines", "n_micro_batches", "divided",
            "workspace_bytes", "budget_bytes", "budget_label", "planned_time_s", "planned_speedup",
            "feasible", "reason", *MEASURED]


def attach_measured(rows: list[dict], configs: list[Config], measured: dict) -> list[dict]:
    """The rows with what execution measured: `measured[(key, division)]` holds {"time_s" (median
    of the rounds), "noise_frac" ((slowest - fastest) / median round), "rounds", "max_rel_err",
    "err_fp64", "default_err_fp64"}.
    A row's noise allowance is the larger of its baseline's and its plan's."""
    out = []
    for row, (key, base, plan) in zip(rows, configs, strict=True):
        b = measured.get((key, base)) if base else None
        p = measured.get((key, plan)) if plan else None
        nan = math.nan
        noise = [x["noise_frac"] for x in (b, p) if x]
        out.append({
            **row,
            "baseline_measured_time_s": b["time_s"] if b else nan,
            "measured_time_s": p["time_s"] if p else nan,
            "measured_speedup": b["time_s"] / p["time_s"] if b and p else nan,
            "noise_frac": max(noise) if noise else nan,
            "same_as_baseline": bool(base and plan and base == plan),
            "rounds": min(x["rounds"] for x in (b, p) if x) if b or p else 0,
            "max_rel_err": p["max_rel_err"] if p else nan,
            "err_fp64": p.get("err_fp64", nan) if p else nan,
            "default_err_fp64": p.get("default_err_fp64", nan) if p else nan,
        })
    return out


ROLLUP_COLS = [
    *KEYS, "mode", "budget_label", "feasible", "kernels", "divided_kernels", "baseline_time_s",
    "planned_time_s", "planned_speedup",
    "baseline_measured_time_s", "measured_time_s", "measured_speedup", "noise_frac", "workspace_bytes",
    "budget_bytes", "max_rel_err",
]


def rollup(rows: pd.DataFrame) -> pd.DataFrame:
    """Per network, limit, policy and planner: the kernels' times summed (each `count` times),
    baseline vs plan, planned and measured, their speedups, how many kernels the plan divides, and
    the noise allowance (the kernels' noise_frac weighted by their measured baseline time). A
    network any of whose kernels lacks a baseline or a plan is not feasible (no speedup)."""
    if rows.empty:
        return pd.DataFrame(columns=ROLLUP_COLS)
    d = rows.assign(
        w=rows["count"].astype(float),
        divided=rows["divided"].astype(str).str.lower().eq("true"),
        feasible=rows["feasible"].astype(str).str.lower().eq("true"),
    )
    out = []
    for keys, g in d.groupby(KEYS, sort=False):
        ok = bool(g["feasible"].all() and g["baseline_time_s"].notna().all())

        def total(col, g=g):
            return float((g[col] * g["w"]).sum()) if g[col].notna().all() else math.nan

        base, plan = total("baseline_time_s"), total("planned_time_s")
        mbase = total("baseline_measured_time_s") if "baseline_measured_time_s" in g else math.nan
        mplan = total("measured_time_s") if "measured_time_s" in g else math.nan
        noise = (
            float((g["noise_frac"] * g["baseline_measured_time_s"] * g["w"]).sum() / mbase)
            if "noise_frac" in g and ok and mbase > 0 else math.nan
        )
        named = dict(zip(KEYS, keys, strict=True))
        out.append({
            **named,
            "mode": MODE.get(named["planner"], ""),
            # the rows' own label where they carry one (raw tables of older runs do not)
            "budget_label": (g["budget_label"].iloc[0] if "budget_label" in g else
                             budget_label(named["planner"], float(named["limit_mib"]),
                                          float(g["budget_bytes"].iloc[0]), int(g["count"].sum()))),
            "feasible": ok,
            "kernels": len(g),
            "divided_kernels": int(g["divided"].sum()),
            "baseline_time_s": base if ok else math.nan,
            "planned_time_s": plan if ok else math.nan,
            "planned_speedup": base / plan if ok else math.nan,
            "baseline_measured_time_s": mbase if ok else math.nan,
            "measured_time_s": mplan if ok else math.nan,
            "measured_speedup": mbase / mplan if ok and mplan > 0 else math.nan,
            "noise_frac": noise,
            "workspace_bytes": total("workspace_bytes"),
            "budget_bytes": float(g["budget_bytes"].iloc[0]),
            "max_rel_err": float(g["max_rel_err"].max()) if "max_rel_err" in g else math.nan,
        })
    return pd.DataFrame(out, columns=ROLLUP_COLS)


def plan_problems(
    table: pd.DataFrame, rows: list[dict], configs: list[Config], slack: float = 1e-12
) -> list[str]:
    """What is wrong with plans (`plan_network`'s rows and configurations) against the engine
    table `table` ([] where nothing is): a baseline over its limit or not the table's fastest
    fitting engine, a plan's benchmarked time above its baseline's (the DP's and the ILP's network
    total), a step (engine, micro-batch) that is no ok row of the table, a dp step's workspace over
    the limit, an ILP's count-weighted workspace over its budget."""
    cells = limits.kernel_tables(table)
    problems = []
    ilp: dict[tuple, list] = {}
    for row, (key, base, plan) in zip(rows, configs, strict=True):
        where = (f"{row['network']} {limits.label(key)} at {row['limit_label']} "
                 f"({row['policy']}/{row['planner']})")
        lb, got = row["limit_mib"] * MiB, cells.get(key, {})
        for what, div in (("baseline", base), ("plan", plan)):
            for engine, size in div or ():
                if (engine, size) not in got:
                    problems.append(f"{where}: {what} step {engine} at micro-batch {size} is no ok row "
                                    "of the table")
                elif (what == "baseline" or row["planner"] == "dp") and got[(engine, size)][1] > lb:
                    problems.append(f"{where}: {what} step {engine} at micro-batch {size} needs "
                                    f"{got[(engine, size)][1] / MiB:.3f} MiB, over the limit")
        if base is not None and all(s in got for s in base):
            fits = [t for (e, b), (t, w) in got.items() if b == base[0][1] and w <= lb]
            if fits and got[base[0]][0] > min(fits) + slack:
                problems.append(f"{where}: baseline {base[0][0]} is not the fastest engine fitting the limit")
        if plan is None or base is None or not all(s in got for s in (*plan, *base)):
            continue
        t_plan, t_base = sum(got[s][0] for s in plan), sum(got[s][0] for s in base)
        if row["planner"] == "dp" and t_plan > t_base * (1 + slack):
            problems.append(f"{where}: planned {t_plan:.6g} s is slower than the baseline's {t_base:.6g} s")
        if row["planner"] == "ilp":
            acc = ilp.setdefault((row["network"], row["limit_mib"], row["policy"]),
                                 [0.0, 0.0, 0.0, row["budget_bytes"]])
            n = row["count"]
            acc[0] += n * t_plan
            acc[1] += n * t_base
            acc[2] += n * max(got[s][1] for s in plan)
    for (net, limit_mib, policy), (t_plan, t_base, ws, budget) in ilp.items():
        where = f"{net} ILP at {limit_mib:g} MiB ({policy})"
        if t_plan > t_base * (1 + slack):
            problems.append(f"{where}: planned {t_plan:.6g} s is slower than the baselines' {t_base:.6g} s")
        if ws > budget * (1 + slack):
            problems.append(f"{where}: workspace {ws / MiB:.3f} MiB is over the budget "
                            f"{budget / MiB:.3f} MiB")
    return problems
