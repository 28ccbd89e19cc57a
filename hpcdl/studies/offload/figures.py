"""Figures stage of the memory-offload study: tables/ (+ raw/timeline.csv) -> figures/ (memory vs
step time, step-time split, capacity under the budget, one step's timeline)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import StudyDir, mark_no_data, pyplot, read_or_empty, read_tables, save_figure
from hpcdl.studies.offload.tables import ORDER

MiB = 2**20
COLORS = dict(zip(ORDER, ["C0", "C1", "C2", "C3", "C4", "C6"], strict=True))


def _tier_label(df: pd.DataFrame) -> str:
    if df.empty or "tier" not in df:
        return ""
    tier = str(df["tier"].iloc[0])
    precision = f"; {df['precision'].iloc[0]}" if "precision" in df else ""
    if tier == "ram>file":
        return f"CPU analogue: fast = process memory, slow = files ({df['io_mode'].iloc[0]}){precision}"
    return f"CUDA: fast = GPU memory, slow = pinned host memory{precision}"


def draw(cfg: dict, study_dir: Path) -> None:
    plt = pyplot()
    run = StudyDir(study_dir)
    tr, cap = read_tables(run.root, "tradeoff", "capacity")
    tier = _tier_label(tr)
    _plot_tradeoff(plt, tr, tier, run.figure("tradeoff"))
    _plot_breakdown(plt, tr, tier, run.figure("breakdown"))
    _plot_capacity(plt, cap, tr, run.figure("capacity"))
    # one step's timeline: compute vs transfer lanes
    _plot_timeline(plt, read_or_empty(run.raw_table("timeline")), tr, run.figure("timeline"))


def _plot_tradeoff(plt, tr, tier: str, path: Path) -> None:
    """Peak fast-tier memory vs step time, one point per size."""
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for s in [s for s in ORDER if not tr.empty and s in set(tr["strategy"])]:
        d = tr[tr["strategy"] == s].sort_values("depth")
        ax.plot(d["step_s"] * 1000, d["peak_fast_bytes"] / MiB, "o-", color=COLORS[s], label=s)
        for _, r in d.iterrows():
            ax.annotate(
                f"{int(r['depth'])}L",
                (r["step_s"] * 1000, r["peak_fast_bytes"] / MiB),
                textcoords="offset points",
                xytext=(4, 3),
                fontsize=7,
                color=COLORS[s],
            )
    if tr.empty:
        mark_no_data(ax, "no successful sweep points in this run")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="step time (ms, median step)",
        ylabel="peak fast-tier memory (MiB)",
        title=f"Memory vs time per strategy (labels: depth)\n{tier}",
    )
    ax.title.set_fontsize(9)
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):  # plain numbers, not 2x10^2
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def _plot_breakdown(plt, tr, tier: str, path: Path) -> None:
    """The stacked step-time breakdown at every depth."""
    parts = [
        ("forward_s", "forward", "C0"),
        ("backward_s", "backward", "C2"),
        ("optimizer_s", "optimizer", "C1"),
        ("exposed_transfer_s", "exposed transfer", "C3"),
    ]
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * max(1, len(tr))), 4.6))
    if not tr.empty:
        labels = [f"{r.strategy}\n{int(r.depth)}L" for r in tr.itertuples()]
        bottom = np.zeros(len(tr))
        for col, name, color in parts:
            vals = tr[col].fillna(0).to_numpy() * 1000
            ax.bar(range(len(tr)), vals, bottom=bottom, color=color, label=name)
            bottom += vals
        ax.set_xticks(range(len(tr)), labels, fontsize=6, rotation=90)
        ax.legend(fontsize=8)
    else:
        mark_no_data(ax, "no successful sweep points in this run")
    ax.set(ylabel="time per step (ms, median step)", title=f"Step time split\n{tier}")
    ax.title.set_fontsize(9)
    ax.grid(True, axis="y", alpha=0.3)
    save_figure(fig, path)


def _plot_capacity(plt, cap, tr, path: Path) -> None:
    """The largest trainable model per strategy under the budget."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    if not cap.empty:
        c = cap.set_index("strategy").reindex([s for s in ORDER if s in set(cap["strategy"])])
        bars = ax.bar(c.index, c["max_params"] / 1e6, color=[COLORS[s] for s in c.index])
        for b, (_, r) in zip(bars, c.iterrows(), strict=True):
            ax.annotate(
                f"{int(r['max_depth'])} layers\nx{r['capacity_ratio']:.2f}",
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_title(
            f"Largest model under a {c['budget_mb'].iloc[0]:g} MiB fast-tier budget\n{_tier_label(tr)}",
            fontsize=9,
        )
    else:
        mark_no_data(ax, "no successful capacity search in this run")
    ax.set(xlabel="strategy", ylabel="parameters that train (millions)")
    ax.margins(y=0.2)
    save_figure(fig, path)


TIMELINE_COLORS = {"forward": "C0", "backward": "C2", "optimizer": "C1", "optimizer_update": "C5",
                   "wait": "C3", "to_slow": "C4", "from_slow": "C9"}


def _plot_timeline(plt, tl: pd.DataFrame, tr: pd.DataFrame, path: Path) -> None:
    """One step's lanes: compute, its waits on a copy, the copies each way. Tall enough to read (a
    4-lane strip under a one-line title was not), with a legend of the colours under it."""
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(11, 5.4))
    lanes = [
        ("compute", "compute (fwd / bwd / optimizer)"),
        ("wait", "compute waits on a copy (exposed)"),
        ("to_slow", "copy fast -> slow"),
        ("from_slow", "copy slow -> fast"),
    ]
    pick = None
    if not tl.empty and not tr.empty:
        both = tr[tr["strategy"] == "both"]
        src = both if not both.empty else tr[tr["strategy"] != "none"]
        if not src.empty:
            r = src.sort_values("depth").iloc[-1]
            pick = (r["strategy"], int(r["depth"]))
    if pick is None:
        mark_no_data(ax, "no offload strategy's timeline in this run")
    else:
        d = tl[(tl["strategy"] == pick[0]) & (tl["depth"] == pick[1])]
        colors = TIMELINE_COLORS
        for y, (lane, _) in enumerate(lanes):
            for _, s in d[d["lane"] == lane].iterrows():
                color = colors.get(s["kind"], colors.get(lane, "C9"))
                h = 0.4 if s["kind"] == "optimizer_update" else 0.8
                ax.broken_barh(
                    [(s["start_s"] * 1000, max(1e-3, (s["end_s"] - s["start_s"]) * 1000))],
                    (y - h / 2, h),
                    color=color,
                    alpha=0.8 if s["kind"] != "optimizer" else 0.35,
                    linewidth=0,
                )
        r = tr[(tr["strategy"] == pick[0]) & (tr["depth"] == pick[1])].iloc[0]
        ax.set_title(
            f"One step of '{pick[0]}' at {pick[1]} layers; {r['hidden_frac']:.0%} of transfer time hidden "
            f"over all measured steps\n{_tier_label(tr)}",
            fontsize=10,
        )
        names = {"forward": "forward", "backward": "backward", "optimizer": "optimizer",
                 "optimizer_update": "optimizer: a bucket's update", "wait": "compute waits on a copy",
                 "to_slow": "copy fast -> slow", "from_slow": "copy slow -> fast"}
        ax.legend(handles=[Patch(color=c, label=names[k]) for k, c in colors.items()], fontsize=8, ncol=4,
                  loc="upper center", bbox_to_anchor=(0.5, -0.14))
    ax.set_yticks(range(len(lanes)), [lbl for _, lbl in lanes], fontsize=9)
    ax.set_ylim(len(lanes) - 0.4, -0.6)
    ax.set_xlabel("time since the step started (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    save_figure(fig, path)
