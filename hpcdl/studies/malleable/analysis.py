"""Aggregate, plot and check claims for the malleability study (used by `python -m hpcdl.platform.cli`).

Tables (tables/): response.csv (each requested change: lag, latency, iteration times around it),
oversub.csv (median iteration time per mode and quota phase; keep / follow penalty), policies.csv
(makespan, mean turnaround, mean wait, utilisation per policy, ratios to rigid), jobs.csv,
utilisation.csv (busy and allocated cores over time per policy), change_cost.csv (first iteration
after a change / steady iteration, every applied change) and series.csv (every iteration).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform.claims import every, not_measured
from hpcdl.platform.results import mark_no_data, read_table, save_figure, write_table

CLAIMS = ("change_within_one_iteration", "follow_quota_faster", "malleable_beats_rigid")
PHASE_SKIP = 2  # iterations at the start of a quota phase left out of its median
UTIL_BIN_S = 0.25  # width of the utilisation-over-time bins
MALLEABLE = ("equal", "proportional")


def _raw(study_dir: Path, name: str) -> pd.DataFrame:
    path = Path(study_dir) / "raw" / f"{name}.csv"
    try:
        return read_table(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def _points(study_dir: Path) -> pd.DataFrame:
    return _raw(study_dir, "points")


def _status(points: pd.DataFrame, experiment: str, variant: str) -> tuple[str, str]:
    if points.empty:
        return "missing", "no points table"
    d = points[(points["experiment"] == experiment) & (points["variant"] == variant)]
    if d.empty:
        return "missing", f"{experiment} point {variant} is not in the table"
    r = d.iloc[0]
    if r["status"] == "ok":
        return "ok", ""
    why = str(r.get("reason") if r["status"] == "skipped" else r.get("error") or "").strip().splitlines()
    return str(r["status"]), f"{experiment} point {variant} {r['status']}: {(why or ['no reason'])[-1][:300]}"


def response_table(changes: pd.DataFrame, series: pd.DataFrame) -> pd.DataFrame:
    if changes.empty:
        return pd.DataFrame(columns=["variant", "direction", "outcome", "lag_iters", "latency_s"])
    d = changes[changes["experiment"] == "response"].copy()
    if d.empty:
        return d
    d["direction"] = np.where(
        d["target_threads"] < d["old_threads"].fillna(d["target_threads"]), "down", "up"
    )
    d["latency_over_iter"] = d["latency_s"] / d["inprogress_iter_s"]
    return d.reset_index(drop=True)


def oversub_table(series: pd.DataFrame, cfg: dict) -> pd.DataFrame:
    cols = ["mode", "phase", "quota_cores", "threads", "iter_s", "oversubscribed", "keep_over_follow"]
    if series.empty:
        return pd.DataFrame(columns=cols)
    d = series[series["experiment"] == "oversub"]
    block = cfg["malleable"]["oversub"]
    quotas, phase = block["quotas"], block["phase_iterations"]
    rows = []
    for mode, g in d.groupby("variant"):
        for i, q in enumerate(quotas):
            ph = g[(g["iteration"] >= i * phase + PHASE_SKIP) & (g["iteration"] < (i + 1) * phase)]
            if ph.empty:
                continue
            threads = int(ph["threads_run"].mode().iloc[0])
            rows.append(
                {
                    "mode": mode,
                    "phase": i,
                    "quota_cores": float(q),
                    "threads": threads,
                    "iter_s": float(ph["iter_s"].median()),
                    # more runnable threads than the quota's whole cores (one thread on half a core is not)
                    "oversubscribed": threads > max(1.0, q) + 1e-9,
                }
            )
    out = pd.DataFrame(rows, columns=cols[:-1])
    if out.empty:
        return pd.DataFrame(columns=cols)
    piv = out.pivot_table(index="phase", columns="mode", values="iter_s")
    ratio = (
        (piv["keep"] / piv["follow"]) if {"keep", "follow"} <= set(piv.columns) else pd.Series(dtype=float)
    )
    out["keep_over_follow"] = out["phase"].map(ratio)
    return out


def policies_table(points: pd.DataFrame, series: pd.DataFrame, cores: int) -> pd.DataFrame:
    cols = [
        "policy",
        "status",
        "enforcement",
        "makespan_s",
        "mean_turnaround_s",
        "mean_wait_s",
        "utilisation_frac",
        "jobs_ok",
        "jobs_failed",
        "makespan_over_rigid",
        "turnaround_over_rigid",
    ]
    if points.empty:
        return pd.DataFrame(columns=cols)
    d = points[points["experiment"] == "cosched"]
    rows = []
    for r in d.itertuples():
        row = {"policy": r.variant, "status": r.status, "enforcement": getattr(r, "enforcement", "")}
        if r.status == "ok":
            cpu = series[(series["experiment"] == "cosched") & (series["variant"] == r.variant)][
                "cpu_s"
            ].sum()
            row.update(
                makespan_s=r.makespan_s,
                mean_turnaround_s=r.mean_turnaround_s,
                mean_wait_s=r.mean_wait_s,
                utilisation_frac=cpu / (cores * r.makespan_s) if r.makespan_s else np.nan,
                jobs_ok=r.jobs_ok,
                jobs_failed=r.jobs_failed,
            )
        rows.append(row)
    out = pd.DataFrame(rows, columns=cols)
    rigid = out[(out["policy"] == "rigid") & (out["status"] == "ok")]
    if not rigid.empty:
        out["makespan_over_rigid"] = out["makespan_s"] / float(rigid["makespan_s"].iloc[0])
        out["turnaround_over_rigid"] = out["mean_turnaround_s"] / float(rigid["mean_turnaround_s"].iloc[0])
    return out


def utilisation_table(
    series: pd.DataFrame, decisions: pd.DataFrame, jobs: pd.DataFrame, cores: int
) -> pd.DataFrame:
    """Busy cores (each iteration's CPU time spread over its wall interval) and allocated cores per bin."""
    cols = ["policy", "t_s", "busy_cores", "allocated_cores", "utilisation_frac"]
    rows = []
    s = series[series["experiment"] == "cosched"] if not series.empty else series
    for policy, g in s.groupby("variant") if not s.empty else []:
        end = float((g["start_s"] + g["iter_s"]).max())
        edges = np.arange(0.0, end + UTIL_BIN_S, UTIL_BIN_S)
        busy = np.zeros(len(edges) - 1)
        for a, w, c in zip(g["start_s"], g["iter_s"], g["cpu_s"], strict=True):
            lo, hi = a, a + w
            overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0, None)
            busy += c * overlap / max(w, 1e-9)
        busy /= UTIL_BIN_S
        alloc = _allocated(decisions, jobs, policy, edges[:-1] + UTIL_BIN_S / 2)
        for t, b, al in zip(edges[:-1], busy, alloc, strict=True):
            rows.append(
                {
                    "policy": policy,
                    "t_s": t,
                    "busy_cores": b,
                    "allocated_cores": al,
                    "utilisation_frac": b / cores,
                }
            )
    return pd.DataFrame(rows, columns=cols)


def _allocated(decisions: pd.DataFrame, jobs: pd.DataFrame, policy: str, times: np.ndarray) -> np.ndarray:
    """Sum over jobs of the share each held at each time (shares change at decisions, end at finish)."""
    out = np.zeros(len(times))
    if decisions.empty:
        return out
    d = decisions[(decisions["experiment"] == "cosched") & (decisions["variant"] == policy)]
    j = jobs[(jobs["experiment"] == "cosched") & (jobs["variant"] == policy)] if not jobs.empty else jobs
    finished = {str(r.job): r.finished_s for r in j.itertuples()}
    for job, g in d.groupby(d["job"].astype(str)):
        g = g.sort_values("time_s")
        starts = list(g["time_s"]) + [finished.get(job, np.inf)]
        for (t0, t1), share in zip(zip(starts[:-1], starts[1:], strict=True), g["cores"], strict=True):
            out += np.where((times >= t0) & (times < t1), share, 0.0)
    return out


def change_cost_table(changes: pd.DataFrame) -> pd.DataFrame:
    if changes.empty:
        return pd.DataFrame(columns=["experiment", "variant", "source", "change_cost_ratio"])
    d = changes[changes["outcome"] == "applied"].copy()
    d["change_cost_ratio"] = d["first_iter_s"] / d["steady_iter_s"]
    return d.reset_index(drop=True)


def aggregate(cfg: dict, study_dir: Path) -> None:
    study_dir = Path(study_dir)
    cores = cfg["malleable"]["cores"]
    points, series, changes = _points(study_dir), _raw(study_dir, "series"), _raw(study_dir, "changes")
    decisions, jobs = _raw(study_dir, "decisions"), _raw(study_dir, "jobs")
    started = pd.Timestamp.now().timestamp()
    tables = study_dir / "tables"
    out = {
        "response": response_table(changes, series),
        "oversub": oversub_table(series, cfg),
        "policies": policies_table(points, series, cores),
        "jobs": jobs,
        "utilisation": utilisation_table(series, decisions, jobs, cores),
        "change_cost": change_cost_table(changes),
        "series": series,
    }
    for name, df in out.items():
        write_table(df, tables / f"{name}.csv", cfg, started)


def _table(study_dir: Path, name: str) -> pd.DataFrame:
    try:
        return read_table(Path(study_dir) / "tables" / f"{name}.csv")
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


# ---- figures --------------------------------------------------------------------------------------
def plot(cfg: dict, study_dir: Path) -> None:
    import matplotlib.pyplot as plt

    study_dir = Path(study_dir)
    figs = study_dir / "figures"
    _plot_gantt(
        plt,
        _raw(study_dir, "decisions"),
        _table(study_dir, "jobs"),
        _table(study_dir, "policies"),
        cfg,
        figs / "gantt.png",
    )
    _plot_policy_bars(plt, _table(study_dir, "policies"), figs / "policy_bars.png")
    _plot_iter_time(
        plt, _table(study_dir, "series"), _table(study_dir, "oversub"), cfg, figs / "iter_time.png"
    )
    _plot_utilisation(plt, _table(study_dir, "utilisation"), cfg, figs / "utilisation.png")


def _policies(cfg: dict) -> list[str]:
    return list(cfg["malleable"]["cosched"]["policies"])


def _plot_gantt(plt, decisions, jobs, policies, cfg, path) -> None:
    names = _policies(cfg)
    cores = cfg["malleable"]["cores"]
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 1.2 + 1.3 * len(names)), sharex=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, policy in zip(axes[:, 0], names, strict=True):
        ax.set_title(f"{policy}" + ("" if policy == "rigid" else " (malleable)"), fontsize=10, loc="left")
        j = jobs[(jobs["variant"] == policy)] if not jobs.empty else jobs
        d = decisions[(decisions["variant"] == policy)] if not decisions.empty else decisions
        if j.empty:
            mark_no_data(ax, f"no co-scheduling run for {policy}")
            continue
        for row, r in enumerate(j.sort_values("job").itertuples()):
            ax.plot([r.arrival_s], [row], marker="|", color="k", ms=12)
            if pd.notna(r.admitted_s) and r.admitted_s > r.arrival_s:
                ax.barh(
                    row,
                    r.admitted_s - r.arrival_s,
                    left=r.arrival_s,
                    color="lightgrey",
                    hatch="//",
                    edgecolor="grey",
                    height=0.6,
                )
            g = d[d["job"].astype(str) == str(r.job)].sort_values("time_s")
            ends = [*g["time_s"].iloc[1:], r.finished_s]
            for t0, t1, share, thr in zip(g["time_s"], ends, g["cores"], g["threads"], strict=True):
                if pd.isna(t1) or t1 <= t0:
                    continue
                ax.barh(row, t1 - t0, left=t0, color=cmap(share / cores), height=0.6, edgecolor="white")
                if t1 - t0 > 0.6:
                    ax.text(
                        (t0 + t1) / 2,
                        row,
                        f"{share:.2g}c/{int(thr)}t",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if share / cores < 0.6 else "black",
                    )
            if r.status != "ok":
                ax.plot([r.finished_s], [row], marker="x", color="red", ms=9)
        ax.set_yticks(range(len(j)))
        ax.set_yticklabels([f"job {x}" for x in j.sort_values("job")["job"]], fontsize=8)
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("time since the workload started (s)")
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, cores))
    fig.colorbar(sm, ax=axes[:, 0].tolist(), label="cores (cgroup quota) held", fraction=0.03)
    fig.suptitle(
        "Jobs and their core shares over time (grey hatch: waiting; labels: cores/threads)", fontsize=10
    )
    save_figure(fig, path)


def _plot_policy_bars(plt, pol: pd.DataFrame, path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    ok = pol[pol["status"] == "ok"] if not pol.empty else pol
    for ax, col, label in zip(
        axes,
        ("makespan_s", "mean_turnaround_s", "utilisation_frac"),
        ("makespan (s)", "mean turnaround (s)", "core utilisation (CPU time / cores x makespan)"),
        strict=True,
    ):
        if ok.empty:
            mark_no_data(ax, "no successful co-scheduling run")
            continue
        colors = ["C3" if p == "rigid" else "C0" for p in ok["policy"]]
        ax.bar(ok["policy"], ok[col], color=colors)
        for x, v in enumerate(ok[col]):
            ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(label, fontsize=9)
    fig.suptitle("Same workload, three policies (red: rigid; blue: malleable)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def _plot_iter_time(plt, series: pd.DataFrame, over: pd.DataFrame, cfg: dict, path) -> None:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    s = (
        series[(series["experiment"] == "response") & (series["variant"] != "quota")]
        if not series.empty
        else series
    )
    if s.empty:
        mark_no_data(a1, "no thread-only response run")
    else:
        g = s[s["iteration"] >= PHASE_SKIP].groupby("threads_run")["iter_s"]
        med = g.median()
        a1.bar(
            med.index.astype(str),
            med.values * 1000,
            yerr=[(med - g.quantile(0.25)).values * 1000, (g.quantile(0.75) - med).values * 1000],
            color="C0",
        )
        a1.set_xlabel("intra-op threads (no quota)")
        a1.set_ylabel("iteration time (ms), median and IQR")
    if over.empty:
        mark_no_data(a2, "no oversubscription run (needs writable cgroups)")
    else:
        for mode, g in over.groupby("mode"):
            a2.plot(g["quota_cores"], g["iter_s"] * 1000, marker="o", label=f"{mode} threads")
            o = g[g["oversubscribed"].astype(str).str.lower() == "true"]
            a2.scatter(
                o["quota_cores"],
                o["iter_s"] * 1000,
                s=160,
                facecolors="none",
                edgecolors="red",
                zorder=5,
                label="oversubscribed (threads > quota)" if mode == "keep" else None,
            )
        a2.set_xlabel("cgroup CPU quota (cores)")
        a2.set_ylabel("iteration time (ms), phase median")
        a2.invert_xaxis()
        a2.legend(fontsize=8)
    fig.suptitle(
        "Iteration time vs threads and vs quota: keeping threads under a cut quota costs time", fontsize=10
    )
    fig.tight_layout()
    save_figure(fig, path)


def _plot_utilisation(plt, util: pd.DataFrame, cfg: dict, path) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.4))
    if util.empty:
        mark_no_data(ax, "no co-scheduling run")
    for i, (policy, g) in enumerate(util.groupby("policy") if not util.empty else []):
        ax.plot(g["t_s"], g["utilisation_frac"], color=f"C{i}", label=f"{policy}: busy (CPU time)")
        ax.step(
            g["t_s"],
            g["allocated_cores"] / cfg["malleable"]["cores"],
            where="post",
            color=f"C{i}",
            ls=":",
            label=f"{policy}: allocated (quota)",
        )
    ax.set_xlabel("time since the workload started (s)")
    ax.set_ylabel("fraction of the cores")
    ax.set_ylim(0, 1.15)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Core utilisation over time per policy", fontsize=10)
    save_figure(fig, path)


# ---- claims ---------------------------------------------------------------------------------------
def claims(cfg: dict, study_dir: Path) -> list[dict]:
    study_dir = Path(study_dir)
    points = _points(study_dir)
    return [
        _claim_change(cfg, points, _table(study_dir, "response")),
        _claim_oversub(cfg, points, _table(study_dir, "oversub")),
        _claim_policies(cfg, _table(study_dir, "policies"), points),
    ]


def _claim_change(cfg, points, resp) -> dict:
    statement = (
        "a thread-count change requested by API, signal or quota takes effect within one iteration "
        "(at the first iteration boundary after the request: no iteration starts with the old count)"
    )
    holds, missing, lags, lat = {}, {}, {}, {}
    for method in cfg["malleable"]["response"]["methods"]:
        status, why = _status(points, "response", method)
        d = resp[resp["variant"] == method] if not resp.empty else resp
        if status != "ok" or d.empty:
            missing[method] = why or f"response point {method} logged no change"
            continue
        applied = d[d["outcome"] == "applied"]
        lags[method] = [int(x) for x in applied["lag_iters"]]
        lat[method] = [round(float(x), 2) for x in applied["latency_over_iter"].dropna()]
        holds[method] = len(applied) == len(d) and all(x == 0 for x in lags[method])
    return every(
        "change_within_one_iteration",
        statement,
        holds,
        missing,
        lag_iters=lags,
        latency_over_inprogress_iteration=lat,
        threshold="lag_iters == 0 for every change",
    )


def _claim_oversub(cfg, points, over) -> dict:
    statement = (
        "under a cut CPU quota, a job that follows the quota with its thread count runs an iteration "
        "faster than one that keeps its threads (oversubscribed)"
    )
    block = cfg["malleable"]
    holds, missing, ratios = {}, {}, {}
    for mode in ("keep", "follow"):
        status, why = _status(points, "oversub", mode)
        if status != "ok":
            missing[mode] = why
    cut = [q for q in block["oversub"]["quotas"] if q < block["cores"]]
    if not missing:
        for q in cut:
            d = over[np.isclose(over["quota_cores"].astype(float), q)] if not over.empty else over
            k, f = d[d["mode"] == "keep"], d[d["mode"] == "follow"]
            if k.empty or f.empty:
                missing[f"quota {q}"] = "no iterations in this phase"
                continue
            if int(k["threads"].iloc[0]) == int(f["threads"].iloc[0]):
                missing[f"quota {q}"] = "following this quota does not change the thread count"
                continue
            ratios[f"quota {q}"] = round(float(k["iter_s"].iloc[0] / f["iter_s"].iloc[0]), 3)
            holds[f"quota {q}"] = ratios[f"quota {q}"] > 1.0
    if not cut and not missing:
        return not_measured("follow_quota_faster", statement, "no quota below malleable.cores is configured")
    return every(
        "follow_quota_faster",
        statement,
        holds,
        missing,
        keep_over_follow_iter_time=ratios,
        threshold="keep / follow iteration time > 1 at every cut quota",
    )


def _claim_policies(cfg, pol, points) -> dict:
    statement = (
        "on the same workload, every malleable policy's makespan and mean turnaround are both below "
        "the rigid policy's"
    )
    names = _policies(cfg)
    malleable = [p for p in names if p in MALLEABLE]
    if "rigid" not in names or not malleable:
        return not_measured(
            "malleable_beats_rigid",
            statement,
            "malleable.cosched.policies must hold rigid and at least one malleable policy",
        )
    holds, missing, ratios = {}, {}, {}

    def usable(policy):
        status, why = _status(points, "cosched", policy)
        if status != "ok":
            return None, why
        r = pol[pol["policy"] == policy] if not pol.empty else pol
        if r.empty:
            return None, f"policy {policy} is not in the policies table"
        r = r.iloc[0]
        if r["jobs_failed"] > 0:
            return (
                None,
                f"policy {policy}: {int(r['jobs_failed'])} job(s) failed, the runs are not comparable",
            )
        return r, ""

    rigid, why = usable("rigid")
    for p in malleable:
        r, why_p = usable(p)
        if rigid is None or r is None:
            missing[p] = why if rigid is None else why_p
            continue
        ms, ta = (
            float(r["makespan_s"] / rigid["makespan_s"]),
            float(r["mean_turnaround_s"] / rigid["mean_turnaround_s"]),
        )
        ratios[p] = {"makespan_over_rigid": round(ms, 3), "turnaround_over_rigid": round(ta, 3)}
        holds[p] = ms < 1.0 and ta < 1.0
    return every(
        "malleable_beats_rigid",
        statement,
        holds,
        missing,
        ratios=ratios,
        threshold="both ratios < 1",
        enforcement=_enforcement(points),
    )


def _enforcement(points: pd.DataFrame) -> str:
    if points.empty or "enforcement" not in points:
        return "unknown"
    d = points[(points["experiment"] == "cosched") & (points["status"] == "ok")]
    vals = sorted(set(d["enforcement"].dropna().astype(str)))
    return ", ".join(vals) if vals else "unknown"
