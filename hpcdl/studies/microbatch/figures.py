"""Figures stage of the micro-batched convolution study: tables/ -> figures/ (per-layer speedup,
speedup vs workspace budget, the chosen micro-batches, predicted vs measured time, and on CUDA
μ-cuDNN's speedup over the undivided cuDNN baseline vs workspace limit, with cudnn.figures' three:
the time per limit split into kernels, DeepBench per layer and limit, and why dividing pays or not)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import StudyDir, mark_no_data, pyplot, read_or_empty, read_tables, save_figure
from hpcdl.studies.microbatch.cudnn import figures as cudnn_figures
from hpcdl.studies.microbatch.cudnn.claims import PAPER_SPEEDUP
from hpcdl.studies.microbatch.cudnn.plan import DEFAULT_LIMIT_MIB, MODE_LABEL
from hpcdl.studies.microbatch.tables import SEED_SPEEDUP

MiB = 2**20
POLICY_ORDER = ["undivided", "powerOfTwo", "all"]
POLICY_COLOR = {"undivided": "C0", "powerOfTwo": "C1", "all": "C2"}


def _networks(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["network"])) if not df.empty else []


def _per_network(plt, df: pd.DataFrame, panel: tuple[float, float], empty: str, rows: bool = False,
                 **subplots):
    """One panel per network of `df` (stacked when `rows`), or a single panel saying `empty`:
    the figure and its (axes, network) pairs."""
    names = _networks(df)
    n = max(1, len(names))
    shape, size = ((n, 1), (panel[0], panel[1] * n)) if rows else ((1, n), (panel[0] * n, panel[1]))
    fig, axes = plt.subplots(*shape, figsize=size, squeeze=False, **subplots)
    axes = axes[:, 0] if rows else axes[0]
    if not names:
        mark_no_data(axes[0], empty)
    return fig, list(zip(axes, names, strict=False))


def _device_word(df: pd.DataFrame) -> str:
    if df.empty or "device" not in df:
        return ""
    return ", ".join(sorted(set(map(str, df["device"])))).upper()


def _who(shared_by: str, policies: list[str]) -> str:
    """Who chose one executed plan, from its `shared_by` ("policy/planner ..."), in a few words:
    "every policy, DP and ILP", "powerOfTwo, all (ILP)", or the pairs where they are no product."""
    pairs = [tuple(x.split("/", 1)) for x in str(shared_by).split()]
    named = {q for q, _ in pairs}
    pols = [p for p in POLICY_ORDER + sorted(set(policies) - set(POLICY_ORDER)) if p in named]
    planners = [k for k in ("dp", "ilp") if k in {k2 for _, k2 in pairs}]
    if len(pairs) != len(pols) * len(planners):
        return ", ".join(f"{q} {k.upper()}" for q, k in pairs)
    who = "every policy" if len(pols) > 1 and set(pols) >= set(policies) else ", ".join(pols)
    return f"{who} ({' and '.join(k.upper() for k in planners)})"


SAME = 0.01  # a policy's predicted speedups within 1 % of the richest policy's are not drawn apart


def _budget_lines(d: pd.DataFrame, policies: list[str]) -> list[tuple[str, str]]:
    """The predicted lines of one network: (policy, label). The richest policy (the last: its candidate
    micro-batches include the others') is always drawn; another policy only where its predictions
    differ from it by more than SAME at some budget it can meet, else it is named in the richest
    line's label (with the budgets it cannot meet): three identical curves drawn on top of one another
    read as one, under three legend entries."""
    series = {p: dict(zip(e["budget_bytes"], e["predicted_speedup"], strict=True))
              for p in policies
              for e in [d[(d["policy"] == p) & d["feasible"].astype(bool)]]}
    base = policies[-1]
    same, notes, lines = [], [], []
    for p in policies[:-1]:
        if all(b in series[base] and abs(v / series[base][b] - 1) <= SAME for b, v in series[p].items()):
            same.append(p)
            short = ", ".join(f"{b / MiB:.3g}" for b in sorted(set(series[base]) - set(series[p])))
            notes += [f"{p} infeasible at {short} MiB"] if short else []
        else:
            lines.append((p, f"predicted: {p}"))
    also = f"\n({', '.join(same)}: within {SAME:.0%}" if same else ""
    also += "".join(f";\n{n}" for n in notes) + (")" if same else "")
    return [(base, f"predicted: {base}{also}"), *lines]


def draw(cfg: dict, study_dir: Path) -> None:
    plt = pyplot()

    run = StudyDir(study_dir)
    layers, nets, budget, plans = read_tables(run.root, "layer_speedup", "network_speedup", "budget_speedup",
                                              "plans")
    dev = _device_word(nets)
    _layer_speedup(plt, layers, dev, run)
    _budget_speedup(plt, budget, nets, dev, run)
    _microbatch_sizes(plt, plans, run)
    _predicted_vs_measured(plt, nets, cfg["microbatch"]["prediction_tolerance"], dev, run)
    _cudnn_limits(plt, read_or_empty(run.table("cudnn_networks")), run.figures)
    lim = read_or_empty(run.table("cudnn_limits"))
    cudnn_figures.draw_kernels(plt, lim, run.figure("cudnn_kernels"))
    cudnn_figures.draw_deepbench(plt, lim, run.figure("cudnn_deepbench"))
    cudnn_figures.draw_why(plt, read_or_empty(run.table("cudnn_why")), run.figure("cudnn_why"))


def _layer_speedup(plt, layers: pd.DataFrame, dev: str, run: StudyDir) -> None:
    """1. per-layer measured speedup of the ILP plan, one bar per policy (predicted as markers)."""
    # constrained layout: each panel's rotated layer names clear the next panel's title
    fig, panels = _per_network(plt, layers, (11, 3.6), "no executed plans in this run", rows=True,
                               layout="constrained")
    for ax, net in panels:
        d = layers[(layers["network"] == net) & (layers["planner"] == "ilp")]
        order = list(dict.fromkeys(d["layer"]))
        pols = [p for p in POLICY_ORDER if p in set(d["policy"])]
        width = 0.8 / max(1, len(pols))
        for i, p in enumerate(pols):
            e = d[d["policy"] == p].set_index("layer").reindex(order)
            x = np.arange(len(order)) + (i - (len(pols) - 1) / 2) * width
            ax.bar(x, e["measured_speedup"], width, color=POLICY_COLOR[p], label=f"{p}: measured")
            ax.plot(
                x, e["predicted_speedup"], "k_", ms=10, mew=2, label="predicted (DP+ILP)" if i == 0 else None
            )
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(order)), order, rotation=20, fontsize=8)
        ax.set(
            ylabel="default time / plan time", title=f"{net}: per-layer speedup of the executed plan ({dev})"
        )
        ax.legend(fontsize=7, ncol=4, loc="lower left", bbox_to_anchor=(0, 1.1))  # above, not on the bars
        ax.grid(True, axis="y", alpha=0.3)
    save_figure(fig, run.figure("layer_speedup"))


def _budget_speedup(plt, budget: pd.DataFrame, nets: pd.DataFrame, dev: str, run: StudyDir) -> None:
    """2. network speedup vs total workspace budget, one line per policy, the seed as a reference."""
    fig, panels = _per_network(plt, budget, (5, 4), "no budget sweep in this run")
    for ax, net in panels:
        d = budget[(budget["network"] == net)]
        pols = [p for p in POLICY_ORDER if p in set(d["policy"])]
        # series that differ only slightly still overlap: each group its own marker and line style
        for k, (policy, label) in enumerate(_budget_lines(d, pols) if pols else []):
            e = d[(d["policy"] == policy) & d["feasible"].astype(bool)].sort_values("budget_bytes")
            ax.plot(e["budget_bytes"] / MiB, e["predicted_speedup"], ["o-", "s--", "^:"][k % 3],
                    ms=[7, 5, 4][k % 3], color=POLICY_COLOR[policy], label=label)
        # one star per distinct executed plan (the ILP's at the default's own workspace), however many
        # policies chose it
        m = nets[(nets["network"] == net) & (nets["planner"] == "ilp")] if not nets.empty else nets
        full = d[d["budget_fraction"] == 1]
        for _, r in (m.drop_duplicates("plan_id").iterrows() if len(full) else ()):
            single = len({x.split("/")[0] for x in str(r["shared_by"]).split()}) == 1
            ax.plot(full["budget_bytes"].iloc[:1] / MiB, [r["measured_speedup"]], "*", ms=14,
                    color=POLICY_COLOR.get(r["policy"], "k") if single else "0.35", markeredgecolor="k",
                    label=f"executed: {_who(r['shared_by'], pols)}")
        if net in SEED_SPEEDUP:
            ax.axhline(SEED_SPEEDUP[net], color="gray", ls="--",
                       label=f"μ-cuDNN on a V100 (paper): {SEED_SPEEDUP[net]}x")
        ax.axhline(1.0, color="k", lw=0.8)
        from matplotlib.ticker import NullFormatter

        ax.set(
            xscale="log",
            xlabel="total workspace budget (MiB)",
            ylabel="default time / plan time",
            title=f"{net} ({dev})",
        )
        # after set_xscale, which installs its own formatters: the swept budgets as plain numbers
        swept = sorted(set(d["budget_bytes"] / MiB))
        ax.set_xticks(swept, [f"{v:.3g}" for v in swept])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        # below the axes: inside, it covered the paper's reference line
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    save_figure(fig, run.figure("budget_speedup"))


def _microbatch_sizes(plt, plans: pd.DataFrame, run: StudyDir) -> None:
    """3. chosen micro-batches per layer and kernel (policy all, ILP): segments coloured by algorithm."""
    fig, panels = _per_network(plt, plans, (6.5, 5), "no plans in this run", gridspec_kw={"wspace": 0.75})
    algs = sorted(set("+".join(plans["algorithms"]).split("+"))) if not plans.empty else []
    acol = {a: f"C{i}" for i, a in enumerate(algs)}
    for ax, net in panels:
        pol = "all" if "all" in set(plans["policy"]) else plans["policy"].iloc[-1]
        d = plans[(plans["network"] == net) & (plans["policy"] == pol) & (plans["planner"] == "ilp")]
        labels = []
        for y, r in enumerate(d.itertuples()):
            left = 0
            for size, alg in zip(str(r.micro_batches).split("+"), str(r.algorithms).split("+"), strict=True):
                ax.barh(y, int(size), left=left, color=acol[alg], edgecolor="k", lw=0.5)
                left += int(size)
            labels.append(f"{r.layer} {r.kernel.replace('backward_', 'bwd-')}")
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
        ax.invert_yaxis()
        ax.set(xlabel="samples of the mini-batch", title=f"{net}: micro-batches ({pol}, ILP)")
    if acol:
        from matplotlib.patches import Patch

        fig.axes[0].legend(
            handles=[Patch(color=c, label=a) for a, c in acol.items()],
            fontsize=7,
            loc="lower right",
            framealpha=0.9,
        )
    save_figure(fig, run.figure("microbatch_sizes"))


def _predicted_vs_measured(plt, nets: pd.DataFrame, tol: float, dev: str, run: StudyDir) -> None:
    """4. predicted vs measured time of the plans (and of the default), per network and policy."""
    fig, ax = plt.subplots(figsize=(6, 5.5))
    if nets.empty:
        mark_no_data(ax, "no executed plans in this run")
    else:
        names = _networks(nets)
        style = {n: (f"C{i % 10}", m) for i, (n, m) in enumerate(zip(names, "osD^v<>ph", strict=False))}
        pols = [p for p in POLICY_ORDER if p in set(nets["policy"])]
        fills = ("full", "none", "left", "bottom", "right", "top")
        for net in names:
            color, mk = style[net]
            plans = nets[nets["network"] == net].drop_duplicates("plan_id")  # one point per distinct plan
            for k, (_, r) in enumerate(plans.iterrows()):  # named in the legend by who chose it
                ax.plot(r["predicted_plan_s"] * 1e3, r["measured_plan_s"] * 1e3, mk, color=color, ms=8,
                        fillstyle=fills[k % len(fills)], mew=1.5, ls="none",
                        label=f"{net}: plan of {_who(r['shared_by'], pols)}")
            dflt = nets[nets["network"] == net].iloc[0]
            ax.plot(dflt["predicted_default_s"] * 1e3, dflt["measured_default_s"] * 1e3, "x", color=color,
                    ms=9, mew=2)
        ax.plot([], [], "x", color="k", ms=9, mew=2, label="default layers (in the network's colour)")
        lim = (
            np.array(
                [
                    min(nets[["predicted_plan_s", "measured_plan_s"]].min()) * 0.8,
                    max(nets[["predicted_plan_s", "measured_plan_s", "measured_default_s"]].max()) * 1.2,
                ]
            )
            * 1e3
        )
        ax.plot(lim, lim, "k-", lw=0.8)
        ax.fill_between(
            lim,
            lim / (1 + tol),
            lim / (1 - tol),
            color="gray",
            alpha=0.2,
            label=f"prediction within {tol:.0%}",
        )
        ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))  # off the band
    ax.set(
        xlabel="predicted conv time per iteration (ms, sum of benchmarked kernels)",
        ylabel="measured fwd+bwd conv time (ms, executed)",
        title=f"Predicted vs measured ({dev})",
    )
    ax.grid(True, which="both", alpha=0.3)
    save_figure(fig, run.figure("predicted_vs_measured"))


def _cudnn_limits(plt, nets: pd.DataFrame, figs: Path) -> None:
    """5. μ-cuDNN's network speedup over the undivided baseline vs the per-kernel workspace limit,
    measured (DP and ILP, per policy), the planned speedup beside it, the papers' as references."""
    fig, panels = _per_network(plt, nets, (7.5, 4.2),  # wide enough for two legend columns of modes
                               "no cuDNN-engine run: it needs a GPU and microbatch.cudnn.engines")
    for ax, net in panels:
        d = nets[(nets["network"] == net) & nets["feasible"].astype(str).str.lower().eq("true")]
        for (policy, planner), g in d.groupby(["policy", "planner"], sort=False):
            g = g.sort_values("limit_mib")
            style = dict(color=POLICY_COLOR.get(policy, "k"), ls="-" if planner == "dp" else "--")
            mode = MODE_LABEL.get(planner, planner)
            ax.plot(g["limit_mib"], g["measured_speedup"], "o", label=f"{policy} {mode} (executed)",
                    **style)
            ax.plot(g["limit_mib"], g["planned_speedup"], "x", ms=7, alpha=0.6, color=style["color"],
                    label=f"{policy} {mode} (planned)")
        paper = PAPER_SPEEDUP.get(net, {})
        for (gpu, v), ls in zip(paper.items(), (":", "-."), strict=False):
            ax.axhline(v, color="gray", ls=ls, label=f"μ-cuDNN {gpu} (paper) {v:.2f}x")
        ax.axhline(1.0, color="k", lw=0.8)
        top = max([*paper.values(), *d["measured_speedup"].dropna(), *d["planned_speedup"].dropna(), 1.0])
        ax.set_ylim(top=top * 1.05 + 0.02)  # the papers' lines stay in view
        limits = sorted(set(d["limit_mib"]))
        ax.set(xscale="log", xlabel="workspace limit per kernel (MiB)",
               ylabel="undivided baseline time / plan time", title=f"{net}: μ-cuDNN on cuDNN engines (CUDA)")
        if limits:
            from matplotlib.ticker import NullFormatter

            names = [f"{v:g}\n(default)" if v == DEFAULT_LIMIT_MIB else f"{v:g}" for v in limits]
            ax.set_xticks(limits, names)
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.26))
    save_figure(fig, figs / "cudnn_limits.png")
