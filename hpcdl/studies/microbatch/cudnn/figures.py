"""Figures of μ-cuDNN's own experiment on CUDA (figures.draw calls them; each draws a panel saying why it
is empty where the run had no cuDNN-engine experiment):

cudnn_kernels    each network's time per workspace limit split into its kernels, in the papers' form:
                 per limit the undivided baseline, the DP per kernel (WR) and the ILP network budget
                 (WD), each bar stacked by layer and kernel, with the speedup and the kernels divided
cudnn_deepbench  DeepBench's speedup per layer and limit (the DP per kernel, WR, as the spcl/ucudnn
                 README's DeepBench figure), its 3x3 and 5x5 layers apart, the README's maxima beside
cudnn_why        why dividing does or does not pay (tables/cudnn_why.csv): the kernels by cause at each
                 limit, the fastest engine's workspace at each micro-batch size against the limits,
                 and the per-call overhead (a micro-batch call's time over its share of the undivided)
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import mark_no_data, save_figure
from hpcdl.studies.microbatch.cudnn.plan import MODE_LABEL
from hpcdl.studies.microbatch.cudnn.why import CAUSE_TEXT, CAUSES

MiB = 2**20
NO_RUN = "no cuDNN-engine run: it needs a GPU and microbatch.cudnn.engines"
KERNEL_HATCH = {"forward": "", "backward_data": "//", "backward_filter": ".."}
KERNEL_COLOR = {"forward": "C0", "backward_data": "C1", "backward_filter": "C2"}
CAUSE_COLOR = {"no_baseline": "0.3", "not_binding": "0.75", "workspace": "C3", "overhead": "C1",
               "divides": "C2", "planner_missed": "C4"}
# spcl/ucudnn README (resources/papers.yaml, microbatch deepbench_p100_limits): "μ-cuDNN achieves up to
# speedups of 2.31x for 3x3 layers and 3.85x for 5x5 layers" (P100-SXM2, mini-batch 256, 128-512 MiB)
README_MAX = {"3x3": 2.31, "5x5": 3.85}


def _true(s: pd.Series) -> pd.Series:
    return s.astype(str).str.lower().eq("true")


def _networks(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["network"])) if not df.empty and "network" in df else []


def _policy(df: pd.DataFrame) -> str | None:
    """The policy the figures show: powerOfTwo (μ-cuDNN's default) where planned, else the first."""
    pols = list(dict.fromkeys(df["policy"])) if not df.empty and "policy" in df else []
    return "powerOfTwo" if "powerOfTwo" in pols else (pols[0] if pols else None)


def _times(d: pd.DataFrame) -> tuple[pd.Series, pd.Series, str]:
    """Per row its baseline's and its plan's time, measured where executed (else planned)."""
    if "measured_time_s" in d and d["measured_time_s"].notna().any():
        return d["baseline_measured_time_s"], d["measured_time_s"], "measured"
    return d["baseline_time_s"], d["planned_time_s"], "planned"


def kernel_bars(lim: pd.DataFrame, network: str) -> pd.DataFrame:
    """One network's bars: per limit, the baseline and each planner's plan as count-weighted kernel
    times (ms) in layer/kernel order, the speedup and the kernels divided (the figure's numbers)."""
    cols = ["limit_mib", "limit_label", "bar", "layer", "kernel", "time_ms", "speedup", "divided", "kernels",
            "how"]
    pol = _policy(lim)
    d = lim[(lim["network"] == network) & (lim["policy"] == pol)] if pol else lim[:0]
    d = d[_true(d["feasible"]) & d["baseline_time_s"].notna()] if not d.empty else d
    out = []
    for (limit, label), g in d.groupby(["limit_mib", "limit_label"], sort=True):
        for planner in ("dp", "ilp"):
            p = g[g["planner"] == planner]
            if p.empty:
                continue
            base, plan, how = _times(p)
            w = p["count"].astype(float)
            total_b, total_p = float((base * w).sum()), float((plan * w).sum())
            bars = [("baseline", base)] if planner == "dp" else []
            bars.append((MODE_LABEL[planner], plan))
            for name, t in bars:
                speed = 1.0 if name == "baseline" else total_b / total_p
                div = 0 if name == "baseline" else int(_true(p["divided"]).sum())
                for r, v in zip(p.itertuples(index=False), t * w * 1e3, strict=True):
                    out.append({"limit_mib": float(limit), "limit_label": label, "bar": name,
                                "layer": r.layer, "kernel": r.kernel, "time_ms": float(v), "speedup": speed,
                                "divided": div, "kernels": len(p), "how": how})
    return pd.DataFrame(out, columns=cols)


def draw_kernels(plt, lim: pd.DataFrame, path: Path) -> None:
    nets = _networks(lim)
    fig, axes = plt.subplots(max(1, len(nets)), 1, figsize=(12, 4.6 * max(1, len(nets))), squeeze=False,
                             layout="constrained")
    if not nets:
        mark_no_data(axes[0, 0], NO_RUN)
    for ax, net in zip(axes[:, 0], nets, strict=False):
        bars = kernel_bars(lim, net)
        if bars.empty:
            mark_no_data(ax, f"{net}: no feasible plan")
            continue
        layers = list(dict.fromkeys(bars["layer"]))
        cmap = plt.get_cmap("tab20")
        color = {ly: cmap(i % 20) for i, ly in enumerate(layers)}
        order = ["baseline", MODE_LABEL["dp"], MODE_LABEL["ilp"]]
        ticks, names, x = [], [], 0.0
        for (_, label), g in bars.groupby(["limit_mib", "limit_label"], sort=True):
            for name in order:
                b = g[g["bar"] == name]
                if b.empty:
                    continue
                bottom = 0.0
                for r in b.itertuples(index=False):
                    ax.bar(x, r.time_ms, 0.8, bottom=bottom, color=color[r.layer],
                           hatch=KERNEL_HATCH.get(r.kernel), edgecolor="k", lw=0.3)
                    bottom += r.time_ms
                first = b.iloc[0]
                text = "baseline" if name == "baseline" else (
                    f"{first['speedup']:.2f}x\n{int(first['divided'])}/{int(first['kernels'])} divided")
                ax.text(x, bottom, text, ha="center", va="bottom", fontsize=7)
                ticks.append(x)
                names.append(f"{label}\n{'undivided' if name == 'baseline' else name.split(' (')[-1][:-1]}")
                x += 1
            x += 0.6
        ax.set_xticks(ticks, names, fontsize=7)
        how = bars["how"].iloc[0]
        ax.set(ylabel=f"conv time per iteration (ms, {how})",
               title=f"{net}: undivided cuDNN vs μ-cuDNN's plans under each workspace limit ({_policy(lim)}; "
                     "WR = DP per kernel, WD = ILP network budget)")
        ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
        from matplotlib.patches import Patch

        handles = [Patch(facecolor=color[ly], label=ly) for ly in layers]
        handles += [Patch(facecolor="white", edgecolor="k", hatch=h, label=k.replace("_", " "))
                    for k, h in KERNEL_HATCH.items()]
        ax.legend(handles=handles, fontsize=6, ncol=min(8, len(handles)), loc="upper center",
                  bbox_to_anchor=(0.5, -0.14))
        ax.grid(True, axis="y", alpha=0.3)
    save_figure(fig, path)


def _filter(layer: str) -> str:
    """A DeepBench layer's filter from its name ("..._3x3", "..._5x5_s2"), else "other"."""
    m = re.search(r"[_.](\d)x\1(?:_s\d+)?$", layer)  # the filter ends the name (or its stride does)
    return f"{m.group(1)}x{m.group(1)}" if m else "other"


def deepbench_bars(lim: pd.DataFrame) -> pd.DataFrame:
    """DeepBench's per-layer speedup of the DP per kernel (WR) at each limit: its kernels' baseline
    time over the plan's (measured where executed), planned beside, kernels divided."""
    cols = ["layer", "filter", "limit_mib", "limit_label", "speedup", "planned_speedup", "divided", "how"]
    pol = _policy(lim)
    d = lim[(lim["network"] == "deepbench") & (lim["planner"] == "dp") & (lim["policy"] == pol)] \
        if pol else lim[:0]
    d = d[_true(d["feasible"]) & d["baseline_time_s"].notna()] if not d.empty else d
    out = []
    for (layer, limit, label), g in d.groupby(["layer", "limit_mib", "limit_label"], sort=False):
        base, plan, how = _times(g)
        out.append({"layer": layer, "filter": _filter(str(layer)), "limit_mib": float(limit),
                    "limit_label": label, "speedup": float(base.sum() / plan.sum()),
                    "planned_speedup": float(g["baseline_time_s"].sum() / g["planned_time_s"].sum()),
                    "divided": int(_true(g["divided"]).sum()), "how": how})
    return pd.DataFrame(out, columns=cols)


def draw_deepbench(plt, lim: pd.DataFrame, path: Path) -> None:
    bars = deepbench_bars(lim)
    groups = [f for f in ("3x3", "5x5", "other") if f in set(bars["filter"])]
    fig, axes = plt.subplots(max(1, len(groups)), 1, figsize=(13, 4.2 * max(1, len(groups))), squeeze=False,
                             layout="constrained")
    if not groups:
        mark_no_data(axes[0, 0],
                     NO_RUN if lim.empty else "no DeepBench plan in this run (microbatch.cudnn.networks)")
    for ax, f in zip(axes[:, 0], groups, strict=False):
        d = bars[bars["filter"] == f]
        layers = list(dict.fromkeys(d["layer"]))
        limits = sorted(set(d["limit_mib"]))
        width = 0.8 / len(limits)
        for i, limit in enumerate(limits):
            e = d[d["limit_mib"] == limit].set_index("layer").reindex(layers)
            x = np.arange(len(layers)) + (i - (len(limits) - 1) / 2) * width
            named = f"{e['limit_label'].dropna().iloc[0]} ({e['how'].dropna().iloc[0]})"
            ax.bar(x, e["speedup"], width, color=f"C{i}", label=named)
            ax.plot(x, e["planned_speedup"], "k_", ms=6, mew=1.5, label="planned" if i == 0 else None)
        if f in README_MAX:
            ax.axhline(README_MAX[f], color="gray", ls=":",
                       label=f"μ-cuDNN README, P100-SXM2: up to {README_MAX[f]}x for {f} layers")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(layers)), layers, rotation=30, ha="right", fontsize=7)
        ax.set(ylabel="undivided baseline time / plan time",
               title=f"DeepBench {f} layers: speedup of μ-cuDNN's DP per kernel (WR) at each workspace limit "
                     f"({_policy(lim)})")
        top = max([README_MAX.get(f, 1.0), *d["speedup"].dropna(), *d["planned_speedup"].dropna()])
        ax.set_ylim(0, top * 1.12)  # the README's line stays in view
        ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.3))
        ax.grid(True, axis="y", alpha=0.3)
    save_figure(fig, path)


def draw_why(plt, why: pd.DataFrame, path: Path) -> None:
    from hpcdl.studies.microbatch.cudnn.why import causes

    nets = _networks(why)
    n = max(1, len(nets))
    fig, axes = plt.subplots(3, n, figsize=(5.6 * n, 12), squeeze=False, layout="constrained")
    if not nets:
        for ax in axes[:, 0]:
            mark_no_data(ax, NO_RUN)
    summary = causes(why)
    for j, net in enumerate(nets):
        d = why[why["network"] == net]
        batch = int(d["batch_size"].iloc[0])
        # 1. kernels by cause at each limit
        ax = axes[0, j]
        s = summary[summary["network"] == net]
        labels = list(dict.fromkeys(s.sort_values("limit_mib")["limit_label"]))
        bottom = np.zeros(len(labels))
        for c in CAUSES:
            v = s[s["cause"] == c].set_index("limit_label").reindex(labels)["kernels"].fillna(0).to_numpy()
            if v.any():
                ax.bar(range(len(labels)), v, 0.6, bottom=bottom, color=CAUSE_COLOR[c], label=CAUSE_TEXT[c])
                bottom += v
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set(ylabel="kernels", title=f"{net} (mini-batch {batch}): why each kernel divides or not")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
        # 2. the fastest engine's workspace at each micro-batch size (it does not depend on the limit)
        ax = axes[1, j]
        one = d[d["limit_mib"] == d["limit_mib"].min()]
        for (_, kernel), g in one.groupby(["layer", "kernel"], sort=False):
            ax.plot(g["micro_batch"], g["fastest_workspace_bytes"] / MiB, "-",
                    color=KERNEL_COLOR.get(kernel, "k"), alpha=0.45, lw=1)
        for limit in sorted(set(d["limit_mib"])):
            ax.axhline(limit, color="k", ls="--", lw=0.7)
            ax.text(1, limit, f" {limit:g} MiB", fontsize=6, va="bottom")
        ax.set_yscale("symlog", linthresh=1)  # 0 MiB (no workspace) stays on the axis
        top = max(float(one["fastest_workspace_bytes"].max()) / MiB, max(d["limit_mib"]))
        ax.set(xscale="log", xlabel="micro-batch size", ylabel="fastest engine's workspace (MiB)",
               title="the fastest engine's workspace (a line per kernel) vs the limits", ylim=(0, top * 2))
        # 3. the per-call overhead
        ax = axes[2, j]
        for (_, kernel), g in one.groupby(["layer", "kernel"], sort=False):
            g = g[g["micro_batch"] < batch]
            ax.plot(g["micro_batch"], g["call_over_share"], "-", color=KERNEL_COLOR.get(kernel, "k"),
                    alpha=0.45, lw=1)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="micro-batch size b",
               ylabel="fastest call at b / (b/B x fastest undivided call)",
               title="per-call overhead: above 1, B/b calls cost more than one")
        for k, c in KERNEL_COLOR.items():
            ax.plot([], [], color=c, label=k.replace("_", " "))
        ax.legend(fontsize=7, loc="upper right")
        for ax in axes[1:, j]:
            ax.set_xticks(sorted(set(one["micro_batch"])), [str(b) for b in sorted(set(one["micro_batch"]))],
                          fontsize=7)
            ax.xaxis.set_minor_formatter(plt.NullFormatter())
            ax.grid(True, which="both", alpha=0.3)
    save_figure(fig, path)
