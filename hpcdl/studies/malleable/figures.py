"""Figures stage of the malleability study: tables/ -> figures/*.png (the jobs' core shares over
time, the policies side by side, iteration time vs threads and quota, utilisation over time)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hpcdl.platform import StudyDir, mark_no_data, pyplot, save_figure
from hpcdl.studies.malleable.tables import PHASE_SKIP, raw, table

# One colour per policy in every figure: rigid red, the malleable ones blue and orange.
POLICY_COLOR = {"rigid": "C3", "equal": "C0", "proportional": "C1"}


def _policy_color(policy: str, i: int) -> str:
    return POLICY_COLOR.get(policy, f"C{4 + i}")


def draw(cfg: dict, study_dir: Path) -> None:
    plt = pyplot()
    run = StudyDir(study_dir)
    _plot_gantt(
        plt,
        raw(study_dir, "decisions"),
        table(study_dir, "jobs"),
        table(study_dir, "policies"),
        cfg,
        run.figure("gantt"),
    )
    _plot_policy_bars(plt, table(study_dir, "policies"), run.figure("policy_bars"))
    _plot_iter_time(
        plt, table(study_dir, "series"), table(study_dir, "oversub"), cfg, run.figure("iter_time")
    )
    _plot_utilisation(plt, table(study_dir, "utilisation"), cfg, run.figure("utilisation"))


def _first_repeat(df: pd.DataFrame) -> pd.DataFrame:
    """Timelines show one repeat (the first): the repeats' clocks each start at zero."""
    if df.empty or "repeat" not in df:
        return df
    return df[df["repeat"].fillna(0).astype(int) == int(df["repeat"].fillna(0).min())]


def _policies(cfg: dict) -> list[str]:
    return list(cfg["malleable"]["cosched"]["policies"])


def _plot_gantt(plt, decisions, jobs, policies, cfg, path) -> None:
    names = _policies(cfg)
    cores = cfg["malleable"]["cores"]
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 1.2 + 1.3 * len(names)), sharex=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, policy in zip(axes[:, 0], names, strict=True):
        ax.set_title(f"{policy}" + ("" if policy == "rigid" else " (malleable)"), fontsize=10, loc="left")
        j = _first_repeat(jobs[(jobs["variant"] == policy)]) if not jobs.empty else jobs
        d = _first_repeat(decisions[(decisions["variant"] == policy)]) if not decisions.empty else decisions
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
        mean = ok.groupby("policy", sort=False)[col].mean()
        colors = [_policy_color(p, i) for i, p in enumerate(mean.index)]
        ax.bar(mean.index, mean.values, color=colors, alpha=0.8)
        for x, p in enumerate(mean.index):  # each repeat a dot: the spread the claims' intervals judge
            vals = ok[ok["policy"] == p][col]
            ax.scatter([x] * len(vals), vals, color="k", s=10, zorder=5)
            ax.text(x, mean[p], f"{mean[p]:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(label, fontsize=9)
    fig.suptitle("Same workload, each policy: mean over repeats (bars) and each repeat (dots)", fontsize=10)
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
            a2.scatter(g["quota_cores"], g["iter_s"] * 1000, s=8, color="grey", zorder=4)  # each repeat
            g = g.groupby("quota_cores", as_index=False).agg(iter_s=("iter_s", "mean"),
                                                             oversubscribed=("oversubscribed", "first"))
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
        a2.set_ylabel("iteration time (ms), phase median\n(mean of repeats; grey: each)")
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
    util = _first_repeat(util)
    for i, (policy, g) in enumerate(util.groupby("policy") if not util.empty else []):
        ax.plot(g["t_s"], g["utilisation_frac"], color=_policy_color(policy, i),
                label=f"{policy}: busy (CPU time)")
        ax.step(
            g["t_s"],
            g["allocated_cores"] / cfg["malleable"]["cores"],
            where="post",
            color=_policy_color(policy, i),
            ls=":",
            label=f"{policy}: allocated (quota)",
        )
    ax.set_xlabel("time since the workload started (s)")
    ax.set_ylabel("fraction of the cores")
    ax.set_ylim(0, 1.15)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.18))  # not over the curves
    ax.set_title("Core utilisation over time per policy (first repeat)", fontsize=10)
    save_figure(fig, path)
