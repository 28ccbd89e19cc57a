"""Figures stage of the spatial study: tables/ -> figures/*.png (scaling breakdowns, efficiency
against the ceiling, oracle parity, extrapolation, the papers' settings, memory, loss)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import StudyDir, mark_no_data, pyplot, read_table, save_figure
from hpcdl.studies.spatial.tables import COMPONENTS

COLORS = {"compute_s": "tab:blue", "halo_s": "tab:orange", "gather_s": "tab:purple",
          "allreduce_s": "tab:red", "io_s": "tab:green"}


def _stacked(ax, df: pd.DataFrame, title: str, legend: bool = True) -> None:
    labels = [f"{int(r.data)}x{int(r.depth_ranks)}x{int(r.height_ranks)}\n({int(r.ranks)} ranks)"
              for r in df.itertuples()]
    x = np.arange(len(df))
    bottom = np.zeros(len(df))
    for c in COMPONENTS:
        label = c.removesuffix("_s").replace("gather", "gather to head")
        ax.bar(x, df[c], bottom=bottom, color=COLORS[c], label=label)
        bottom += df[c].to_numpy()
    ax.plot(x, df["time_per_iter_s"], "k_", markersize=30, mew=2, label="iteration (slowest rank)")
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.7, len(df) - 0.3)
    ax.set_xlabel("layout: data groups x depth ranks x height ranks")
    ax.set_ylabel("time per iteration (s)")
    ax.set_title(title, fontsize=10)
    if legend:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))


def _grid(r) -> str:
    return f"{int(r.depth)}x{int(r.height)}x{int(r.width)}"


def _strong_panels(sel: pd.DataFrame, block: dict) -> list[tuple[str, pd.DataFrame]]:
    """The strong and hybrid runs, one panel per global input: a time per iteration compares only
    with runs of the same input, so a hybrid run on another grid than the strong runs' gets its own
    panel (beside, it read as a speedup of the strong runs)."""
    grids = sel.assign(grid=[_grid(r) for r in sel.itertuples()])
    strong = f"{block['strong']['grid']}x{block['strong']['grid']}x{block['strong']['grid']}"
    order = sorted(set(grids["grid"]), key=lambda g: (g != strong, g))
    panels = []
    for g in order:
        runs = grids[grids["grid"] == g]
        kinds = " and ".join(k for k in ("strong", "hybrid") if k in set(runs["kind"]))
        panels.append((f"global input {g} ({kinds} runs)", runs))
    return panels


def _plot_scaling(plt, df: pd.DataFrame, block: dict, kind: str, figs: Path) -> None:
    kinds = [kind, "hybrid"] if kind == "strong" else [kind]
    sel = df[df["kind"].isin(kinds)].copy()
    sel["order"] = sel["kind"] != kind  # this kind's runs first, then the hybrids
    sel = sel.sort_values(["order", "ranks", "data"])
    if sel.empty:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        mark_no_data(ax, f"no {kind} runs configured")
        save_figure(fig, figs / f"{kind}_scaling.png")
        return
    panels = (_strong_panels(sel, block) if kind == "strong"
              else [(f"Weak scaling ({block['weak']['grid']}^3 per depth rank)", sel)])
    widths = [max(2, len(runs)) for _, runs in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.2 * sum(widths) + 3.2, 4.5), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    for i, (ax, (title, runs)) in enumerate(zip(axes[0], panels, strict=True)):
        _stacked(ax, runs, title, legend=i == len(panels) - 1)
    if kind == "strong":
        fig.suptitle("Strong scaling: time per iteration, one panel per global input (compare the bars "
                     "within a panel)", fontsize=11)
    fig.tight_layout()
    save_figure(fig, figs / f"{kind}_scaling.png")


def draw(cfg: dict, study_dir: Path) -> None:
    plt = pyplot()
    study = StudyDir(study_dir)
    # the figures folder, as the plotting helpers below take it; a model-only figure's name stays a
    # literal "<name>.png" in its save_figure call (tests/test_captions.py reads them from the source)
    figs = study.figures
    figs.mkdir(parents=True, exist_ok=True)
    df = read_table(study.table("runs"))
    block = cfg["spatial"]
    for kind in ("strong", "weak"):
        _plot_scaling(plt, df, block, kind, figs)

    _plot_oracle(plt, df, block, figs)

    ext = read_table(study.table("extrapolation"))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for fam, g in ext.groupby("family"):
        g = g.sort_values("gpus")
        ok = g[g["feasible"]]
        line, = ax.plot(ok["gpus"], ok["total_s"], "o-", label=fam)
        bad = g[~g["feasible"]]
        ax.plot(bad["gpus"], bad["total_s"], "x", color=line.get_color(), alpha=0.5)
    pick = ext[ext["chosen"]]
    ax.plot(pick["gpus"], pick["total_s"], "*", color="k", markersize=14, label="oracle's pick")
    ex, m = block["extrapolate"], block["machine"]
    # the target machine as this run's config describes it (the caption names no number)
    target = (f"{m['peak_tflops'] * m['efficiency']:.1f} TFLOP/s per GPU, {m['intra_gbs']:g} GB/s within a "
              f"{m['gpus_per_node']}-GPU node, {m['inter_gbs']:g} GB/s per node between nodes, "
              f"{m['memory_gb']:g} GB per GPU")
    ax.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="predicted time per iteration (s)",
           title=f"CosmoFlow {ex['grid']}^3, batch {ex['batch_size']}: best of each strategy "
                 f"(x = exceeds {m['memory_gb']:g} GB)\ntarget (spatial.machine): {target}")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, figs / "extrapolation.png", model_only=True)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, g in df[df["kind"].isin(["strong", "weak"])].groupby("kind"):
        g = g.sort_values("ranks")
        line, = ax.plot(g["ranks"], g["peak_delta_mb_max"], "o-", label=f"{kind}: measured (peak RSS growth)")
        ax.plot(g["ranks"], g["pred_memory_mb"], "s--", color=line.get_color(), label=f"{kind}: oracle")
    ax.set(xlabel="ranks", ylabel="memory per rank (MiB)", title="Memory per rank vs ranks")
    ax.set_xticks(sorted(set(df.loc[df["kind"].isin(["strong", "weak"]), "ranks"].astype(int))))
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, study.figure("memory"))

    _plot_efficiency(plt, df, block, figs)
    _plot_papers(plt, read_table(study.table("paper_predictions")),
                 read_table(study.table("paper_breakdown")), figs)
    _plot_sensitivity(plt, read_table(study.table("paper_sensitivity")), figs)

    _plot_loss(plt, read_table(study.table("loss")), figs)


def _plot_loss(plt, loss: pd.DataFrame, figs: Path) -> None:
    """Loss per iteration on a log axis: where the first iterations' loss is orders of magnitude above
    the rest, a linear axis flattens every curve."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    positive = loss[loss["loss"] > 0] if not loss.empty else loss
    for run, g in positive.groupby("run"):
        train = run.startswith("train")
        ax.plot(g["iteration"], g["loss"], lw=2.5 if train else 1, alpha=1 if train else 0.6,
                color="k" if train else None, label=run + (" (longer training run)" if train else ""),
                zorder=3 if train else 2)
    if positive.empty:
        mark_no_data(ax, "no loss recorded in this run")
    else:
        ax.set_yscale("log")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set(xlabel="iteration", ylabel="training loss (MSE on normalised A, ns; log)",
           title="Training loss per run (log axis)")
    ax.title.set_fontsize(10)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, figs / "loss.png")


def _plot_oracle(plt, df: pd.DataFrame, block: dict, figs: Path) -> None:
    """Predicted vs measured per run, the held-out runs (the claim's) apart from the in-sample ones."""
    df = df[df["kind"] != "ceiling"]
    sample = df["oracle_sample"] if "oracle_sample" in df else pd.Series("in_sample", index=df.index)
    held = sample == "held_out"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    lim = [0.8 * min(df["time_per_iter_s"].min(), df["pred_time_per_iter_s"].min()),
           1.25 * max(df["time_per_iter_s"].max(), df["pred_time_per_iter_s"].max())]
    ax1.plot(lim, lim, "k-", lw=1, label="exact")
    tol = block["claims"]["max_oracle_error"]
    ax1.fill_between(lim, [v * (1 - tol) for v in lim], [v * (1 + tol) for v in lim], color="0.9",
                     label=f"±{tol:.0%}")
    for i, (kind, g) in enumerate(df.groupby("kind")):
        for out in (True, False):  # held out: filled circles; in sample: open squares
            sel = g[held.loc[g.index] == out]
            if len(sel):
                ax1.scatter(sel["time_per_iter_s"], sel["pred_time_per_iter_s"], marker="o" if out else "s",
                            facecolors=f"C{i}" if out else "none", edgecolors=f"C{i}",
                            label=f"{kind} ({'held out' if out else 'in sample'})")
    ax1.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="measured time per iteration (s)",
            ylabel="predicted time per iteration (s)", title="Oracle: predicted vs measured")
    ax1.legend(fontsize=7)
    ax2.bar(df["run"], 100 * df["oracle_error"], color=["tab:red" if abs(e) > tol else "tab:blue"
                                                          for e in df["oracle_error"]],
            hatch=["" if h else "//" for h in held])
    ax2.axhline(0, color="k", lw=1)
    ax2.set_ylabel("prediction error (%)")
    ax2.set_xlabel("run (hatched: in sample, its layer shapes calibrated)")

    def mae(sel):
        return f"{100 * df.loc[sel, 'oracle_error'].abs().mean():.1f} %" if sel.any() else "none"
    ax2.set_title(f"Mean |error|: held out {mae(held)} (the claim), in sample {mae(~held)}")
    ax2.tick_params(axis="x", rotation=60, labelsize=7)
    fig.tight_layout()
    save_figure(fig, figs / "oracle_parity.png")


def _plot_efficiency(plt, df: pd.DataFrame, block: dict, figs: Path) -> None:
    """Raw speedup next to the machine's own ceiling (same run), efficiency = their ratio."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sel = df[(df["kind"] == "strong") & (df["ranks"] > 1)] if "ceiling_speedup" in df else df[:0]
    sel = sel[sel["ceiling_speedup"].notna()]
    if sel.empty:
        mark_no_data(ax, "no multi-rank strong run with a ceiling run (spatial.ceiling)")
    else:
        x = np.arange(len(sel))
        ax.bar(x - 0.15, sel["speedup"], 0.3, label="speedup over 1 rank (spatial, communicating)")
        ax.bar(x + 0.15, sel["ceiling_speedup"], 0.3, color="0.6",
               label="ceiling: same per-rank compute, no communication")
        for i, r in enumerate(sel.itertuples()):
            load = getattr(r, "other_load_cores", float("nan"))
            ax.text(i, max(r.speedup, r.ceiling_speedup) * 1.03,
                    f"efficiency {r.efficiency_vs_ceiling:.2f}\n(other load {load:.2f} cores)",
                    ha="center", fontsize=9)
        ax.set_xlim(-0.8, len(sel) - 0.2)
        ax.set_ylim(0, max(2.2, 1.25 * float(sel[["speedup", "ceiling_speedup"]].max().max())))
        ax.axhline(1, color="k", lw=0.8)
        ax.set_xticks(x, [f"{int(r.depth_ranks)}x{int(r.height_ranks)} ({int(r.ranks)} ranks)"
                          for r in sel.itertuples()])
        need = block["claims"]["min_efficiency"]
        ax.set(xlabel="spatial layout (depth x height ranks)", ylabel="speedup over 1 rank",
               title=f"Strong scaling {block['strong']['grid']}^3 against the machine's own ceiling "
                     f"(goal efficiency >= {need:.2f})")
        ax.legend(fontsize=8, loc="lower right")  # the annotations sit above the bars
    fig.tight_layout()
    save_figure(fig, figs / "efficiency.png")


BREAKDOWN_TERMS = (("compute", "tab:blue"), ("optimizer", "tab:cyan"), ("halo", "tab:orange"),
                   ("allreduce", "tab:red"), ("gather", "tab:purple"), ("input", "tab:green"))


def _items_label(r) -> str:
    """How much of a row's layout the calibration measured: "m measured / i interpolated" (none: assumed)."""
    m, i = getattr(r, "measured_items", None), getattr(r, "interpolated_items", None)
    if m is None or i is None or (pd.isna(m) or int(m) + int(i) == 0):
        return "compute assumed"
    return f"{int(m)} measured / {int(i)} interp."


def _plot_breakdown(ax, bd: pd.DataFrame) -> None:
    """The headline basis's terms per setting, stacked (ms), the published speedup's gap written above."""
    if bd.empty or "compute_basis" not in bd:
        mark_no_data(ax, "no paper_breakdown rows")
        return
    bd = bd[bd["compute_basis"] == bd["compute_basis"].iloc[0]].reset_index(drop=True)
    x = np.arange(len(bd))
    bottom = np.zeros(len(bd))
    for term, color in BREAKDOWN_TERMS:
        v = bd[f"{term}_ms"].fillna(0).to_numpy()
        ax.bar(x, v, bottom=bottom, color=color, label=term)
        bottom += v
    for i, r in bd.iterrows():
        note = ""
        if isinstance(r.get("paper_speedup"), float) and np.isfinite(r["paper_speedup"]):
            note = f"paper {r['paper_speedup']:g}x\nours {r['predicted_speedup']:.2f}x"
        ax.annotate(note, (i, bottom[i]), ha="center", va="bottom", fontsize=6, xytext=(0, 2),
                    textcoords="offset points")
    ax.set_xticks(x, [f"{r.network}\n{int(r.gpus)}" for r in bd.itertuples()], fontsize=7)
    ax.set(ylabel="predicted ms per iteration",
           title=f"Terms per setting ({bd['compute_basis'].iloc[0]} basis)")
    ax.set_ylim(0, 1.25 * max(bottom.max(), 1e-9))
    ax.legend(fontsize=7)


def _published(bd: pd.DataFrame, network: str, first: int) -> tuple[int, float] | None:
    """(GPUs, speedup) of the published speedup of `network` over its `first` setting (paper_breakdown)."""
    if bd.empty or "paper_gpus" not in bd:
        return None
    rows = bd[(bd["network"] == network) & bd["paper_gpus"].notna()]
    for r in rows.itertuples():
        lo, hi = (int(v) for v in str(r.paper_gpus).split("->"))
        if lo == first:
            return hi, float(r.paper_speedup)
    return None


def _plot_papers(plt, pp: pd.DataFrame, bd: pd.DataFrame, figs: Path) -> None:
    """Predicted time per iteration and speedup at the papers' exact settings, and the terms of each
    (model only); each point says how many of its layout's calibration items were measured and how many
    interpolated."""
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.8))
    for j, (net, g) in enumerate(pp.groupby("network")):
        g = g.sort_values("gpus")
        label = f"{net} {int(g['grid'].iloc[0])}^3, batch {int(g['batch_size'].iloc[0])}"
        line, = ax1.plot(g["gpus"], g["time_per_iter_s"], "o-", label=label)
        for r in g.itertuples():
            ax1.annotate(f"{r.data}x{r.depth}x{r.height}\npick: {r.chosen_family}\n{_items_label(r)}",
                         (r.gpus, r.time_per_iter_s),
                         fontsize=6, textcoords="offset points", xytext=(4, 4 if j % 2 == 0 else -28))
        ax2.plot(g["gpus"], g["speedup_vs_first"], "o-", color=line.get_color(), label=f"{net}: predicted")
        ax2.plot(g["gpus"], g["ideal_speedup_vs_first"], ":", color=line.get_color(), label=f"{net}: ideal")
        pub = _published(bd, net, int(g["gpus"].min()))
        if pub is not None:  # the paper's speedup over the same first setting, set beside (never fitted)
            ax2.plot(*pub, "*", ms=12, color=line.get_color(), label=f"{net}: published")
    ax1.set(xscale="log", yscale="log", xlabel="GPUs (ABCI V100, model)",
            ylabel="predicted time per iteration (s)",
            title="Papers' settings: data x depth x height, oracle's pick")
    ax2.set(xscale="log", xlabel="GPUs (ABCI V100, model)",
            ylabel="predicted speedup vs the smallest setting",
            title="Predicted strong scaling at the papers' settings (simulated)")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    _plot_breakdown(ax3, bd)
    fig.tight_layout()
    save_figure(fig, figs / "paper_predictions.png", model_only=True)


def _plot_sensitivity(plt, sens: pd.DataFrame, figs: Path) -> None:
    """For each network, how far each assumption of spatial.assumptions moves the predicted speedup of
    its largest over its smallest GPU count: one bar per assumption from the lowest to the highest
    speedup over its range (the value at each end written there), widest on top, a star at the
    configured value, ideal scaling dotted (model only). The label right of a bar reads "value at its
    left end … value at its right end"."""
    nets = list(dict.fromkeys(sens["network"])) if len(sens) else []
    n_rows = sens["assumption"].nunique() if len(sens) else 1
    fig, axes = plt.subplots(1, max(1, len(nets)), figsize=(7 * max(1, len(nets)), 1.2 + 0.5 * n_rows),
                             squeeze=False)
    if not nets:
        mark_no_data(axes[0][0], "spatial.assumptions is empty")
    for ax, net in zip(axes[0], nets, strict=False):
        g = sens[sens["network"] == net]
        bars, ranges = [], {}
        for name, a in g.groupby("assumption", sort=False):
            ranges[name] = f"{a['value'].iloc[0]} … {a['value'].iloc[-1]}"
            lo, hi = a.loc[a["speedup"].idxmin()], a.loc[a["speedup"].idxmax()]
            conf = a[a["configured"].astype(str).str.lower() == "true"]
            bars.append((name, lo, hi, float(conf["speedup"].iloc[0]) if len(conf) else np.nan))
        bars.sort(key=lambda b: b[2]["speedup"] - b[1]["speedup"])  # widest last: at the top
        for y, (name, lo, hi, conf) in enumerate(bars):
            width = max(hi["speedup"] - lo["speedup"], 1e-9)
            ax.barh(y, width, left=lo["speedup"], height=0.5, color="tab:blue", alpha=0.75)
            ax.plot(conf, y, "*", color="k", ms=11, zorder=3)
            # one label right of the bar (two at its ends collide where the bar is short)
            moved = hi["speedup"] - lo["speedup"] > 1e-3 * max(1.0, abs(hi["speedup"]))
            text = (f"{lo['value']} … {hi['value']}" if moved
                    else f"no change over {ranges[name]}")
            ax.annotate(text, (max(hi["speedup"], conf if np.isfinite(conf) else -np.inf), y), xytext=(8, 0),
                        textcoords="offset points", ha="left", va="center", fontsize=8)
        ideal = float(g["ideal_speedup"].iloc[0])
        ax.axvline(ideal, color="k", ls=":", lw=1)
        ax.axvline(1, color="0.5", lw=0.8)
        ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=9)
        ax.set_ylim(-0.6, len(bars) - 0.1)
        ax.text(ideal, len(bars) - 0.35, f"ideal {ideal:g}x", ha="center", va="center", fontsize=8,
                bbox={"fc": "white", "ec": "none", "pad": 1})
        low = min(1.0, min(b[1]["speedup"] for b in bars))
        high = max(ideal, max(b[2]["speedup"] for b in bars))
        ax.set_xlim(low - 0.08 * (high - low), high + 0.3 * (high - low))  # room for the labels
        ax.set(xlabel=f"predicted speedup {int(g['gpus_from'].iloc[0])} -> {int(g['gpus_to'].iloc[0])} GPUs "
                      "(bar: over the assumption's range; * configured)",
               title=f"{net}: what each assumption decides (model)")
    fig.tight_layout()
    save_figure(fig, figs / "paper_sensitivity.png", model_only=True)
