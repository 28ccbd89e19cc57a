"""Figures stage of the HPO study: tables/ -> figures/ (best-so-far accuracy, grid scaling) and
plots of the search's trials, rebuilt from the raw tables (hpcdl.studies.hpo.replay): Optuna's own
(importances, intermediate values) and a parallel coordinate plot of our own (`parallel_coordinate`:
Optuna's writes each axis's tick labels over the trials' lines)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from hpcdl.platform import StudyDir, mark_no_data, pyplot, read_table, read_tables, save_figure
from hpcdl.studies.hpo.sweep import pruning_baseline
from hpcdl.studies.hpo.tables import grid_device, repeat_of, worker_label


def _placeholder(path: Path, title: str, why: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.axis("off")
    ax.set_title(title)
    mark_no_data(ax, why)
    save_figure(fig, path)
    plt.close(fig)


def _plot_best_so_far(df: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    grids = [s for s in df["study"].unique() if s.startswith("grid-") and s.endswith("w")]
    # The grid's trials are the same for every worker count: show it once, at the most workers.
    keep = max(grids, key=lambda s: int(s[len("grid-"):-1]), default=None)
    df = df[~df["study"].isin([s for s in grids if s != keep])]
    for study, g in df.groupby("study", sort=False):
        ax.step(g["time_s"], 100 * g["best_val_acc"], where="post", marker="o", ms=3, label=study)
    ax.set_xlabel("wall time since the study's first trial started (s)")
    ax.set_ylabel("best validation accuracy so far (%)")
    ax.set_title("Best-so-far validation accuracy per sampler")
    ax.grid(alpha=0.3)
    ax.legend(title="study (sampler[-pruner])")
    save_figure(fig, path)
    plt.close(fig)


def _plot_scaling(df: pd.DataFrame, path: Path) -> None:
    fig = scaling_figure(df)
    save_figure(fig, path)
    pyplot().close(fig)


def scaling_figure(df: pd.DataFrame):
    """Elapsed time and speedup against the workers; on cuda a worker is a GPU (worker_label). With
    several timing repeats the lines are the means over repeats and each repeat is a small cross (its
    speedup over its own fewest-workers run, the pairing the claim judges)."""
    plt = pyplot()
    cuda = grid_device(df) == "cuda"
    unit = "GPU" if cuda else "worker"
    xlabel = worker_label(df)
    df = df.assign(repeat=repeat_of(df))
    w0 = df["workers"].min()
    base_busy = df[df["workers"] == w0].set_index("repeat")["busy_workers"]
    df = df.assign(busy_ratio=df["busy_workers"] / df["repeat"].map(base_busy))
    shown = ["elapsed_s", "trials_per_min", "speedup", "busy_ratio"]  # trials/min: not in older tables
    mean = df.groupby("workers", sort=True)[[c for c in shown if c in df]].mean().reindex(columns=shown)
    w = mean.index.to_numpy()
    n_rep = df["repeat"].nunique()
    several = n_rep > 1
    each = dict(ls="none", marker="x", ms=5, color="0.35", alpha=0.8)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.8))
    a1.plot(w, mean["elapsed_s"], "o-", label=f"mean of {n_rep} repeats" if several else None)
    if several:
        a1.plot(df["workers"], df["elapsed_s"], label="each repeat", **each)
        a1.legend(fontsize=8, loc="lower left")
    for x, t, tpm in zip(w, mean["elapsed_s"], mean["trials_per_min"], strict=True):
        if pd.notna(tpm):  # the throughput a device comparison reads
            a1.annotate(f"{tpm:.1f} trials/min", (x, t), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
    a1.set_xlabel(xlabel)
    a1.set_ylabel("elapsed time for the grid (s)")
    a1.set_title(f"{int(df['n_trials'].max())}-point grid" + (" on GPUs" if cuda else "")
                 + (f", {n_rep} repeats" if several else ""))
    a1.set_ylim(bottom=0)
    a2.plot(w, mean["speedup"], "o-", label="measured speedup" + (" (mean over repeats)" if several else ""))
    if several:
        a2.plot(df["workers"], df["speedup"], label="each repeat's speedup", **each)
    # Busy workers isolate the concurrency from the trials' own speed (see grid_scaling).
    a2.plot(w, mean["busy_ratio"], "s:", label=f"busy-{unit} ratio (Σ train time ÷ wall)")
    a2.plot(w, w / float(w0), "k--", label="ideal")
    a2.set_xlabel(xlabel)
    a2.set_ylabel(f"ratio over {int(w0)} {unit}(s) (x)")
    a2.set_title("Grid speedup")
    a2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), fontsize=8)  # inside, it hid the lines
    for a in (a1, a2):
        a.set_xticks(w)
        a.grid(alpha=0.3)
    fig.tight_layout()
    return fig


OPTUNA_FIGURES = ("optuna_param_importances", "optuna_parallel_coordinate", "optuna_intermediate_values")


def _axis_position(values: list, dist) -> tuple[list[float], list[tuple[float, str]]]:
    """Each value's height on its axis (0..1) and the axis's labelled ticks: a categorical parameter's
    choices evenly spaced, a numeric one over its distribution's range (log where it is sampled so)."""
    import math

    from optuna.distributions import CategoricalDistribution

    if isinstance(dist, CategoricalDistribution):
        seen = [c for c in dist.choices if c in values]
        step = 1 / max(1, len(seen) - 1)
        where = {c: (i * step if len(seen) > 1 else 0.5) for i, c in enumerate(seen)}
        return [where[v] for v in values], [(y, str(c)) for c, y in where.items()]
    log = bool(getattr(dist, "log", False))
    low, high = float(dist.low), float(dist.high)

    def scale(v: float) -> float:
        a, b, x = (math.log(low), math.log(high), math.log(v)) if log else (low, high, v)
        return (x - a) / (b - a) if b > a else 0.5
    return [scale(float(v)) for v in values], [(scale(low), f"{low:g}"), (scale(high), f"{high:g}")]


def parallel_coordinate(study):
    """`_parallel_coordinate` in matplotlib's default style (Optuna's own plots switch pyplot to their
    grey "ggplot" one)."""
    with pyplot().style.context("default"):
        return _parallel_coordinate(study)


def _parallel_coordinate(study):
    """One line per complete trial across an axis per hyperparameter that varied (and the validation
    accuracy first), coloured by that accuracy, the best drawn last and thickest; tick labels sit
    left of their axis on a white box, clear of the lines. The parameters that did not vary are named
    in the title instead of given an axis."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize
    from matplotlib.patheffects import withStroke
    from optuna.trial import TrialState

    plt = pyplot()
    trials = sorted((t for t in study.trials if t.state == TrialState.COMPLETE and t.value is not None),
                    key=lambda t: t.value)
    if len(trials) < 2:
        raise ValueError(f"{len(trials)} complete trial(s): a parallel-coordinate plot needs two")
    names = sorted({n for t in trials for n in t.params})
    varied = [n for n in names if len({repr(t.params.get(n)) for t in trials}) > 1]
    fixed = [f"{n}={trials[-1].params[n]}" for n in names if n not in varied and n in trials[-1].params]
    acc = [100 * t.value for t in trials]
    lo, hi = min(acc), max(acc)
    heights = [(a - lo) / (hi - lo) if hi > lo else 0.5 for a in acc]
    cols = [(heights, [(0.0, f"{lo:.1f}"), (1.0, f"{hi:.1f}")])]
    for n in varied:
        dist = next(t.distributions[n] for t in trials if n in t.distributions)
        cols.append(_axis_position([t.params.get(n, dist.low if hasattr(dist, "low") else dist.choices[0])
                                    for t in trials], dist))
    fig, ax = plt.subplots(figsize=(max(7.0, 1.45 * len(cols) + 2), 4.6))
    cmap, norm = colormaps["viridis"], Normalize(lo, hi)
    x = list(range(len(cols)))
    for i in range(len(trials)):  # worst first: the best lines end on top
        best = i == len(trials) - 1
        ax.plot(x, [c[0][i] for c in cols], color=cmap(norm(acc[i])), lw=2.4 if best else 1.3,
                alpha=1 if best else 0.8, zorder=3 if best else 2,
                path_effects=[withStroke(linewidth=4.2, foreground="black")] if best else None)
    halo = [withStroke(linewidth=3, foreground="white")]
    for j, (_, ticks) in enumerate(cols):
        ax.axvline(j, color="0.35", lw=1, zorder=1)
        for y, text in ticks:
            ax.text(j - 0.04, y, text, ha="right", va="center", fontsize=7.5, zorder=4, path_effects=halo,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
    ax.set_xticks(x, ["validation\naccuracy (%)", *[n.replace("_", " ") for n in varied]], fontsize=9)
    ax.set(xlim=(-0.6, len(cols) - 0.6), ylim=(-0.06, 1.06), yticks=[])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.02,
                 label="validation accuracy (%)")
    ax.set_title(f"{len(trials)} complete trials, one line each (best thickest)"
                 + (f"; the same in every trial: {', '.join(fixed)}" if fixed else ""), fontsize=9)
    return fig


def _optuna_figures(cfg: dict, run: StudyDir) -> None:
    """Optuna's own matplotlib plots: importances and parallel coordinates of the main unpruned
    search, intermediate values of the pruned one (where the pruner's cuts show), each drawn from the
    study rebuilt from the run's raw tables (hpcdl.studies.hpo.replay: the stage reads no journal)."""
    from optuna.visualization import matplotlib as ovm

    from hpcdl.studies.hpo.replay import rebuilt_study

    plt = pyplot()
    hpo = cfg["hpo"]
    pair = pruning_baseline(hpo)
    main = pair[0] if pair else hpo["sampler"]
    pruned = pair[1] if pair else main
    trials, intermediate = read_tables(run.root, "trials", "intermediate", folder="raw")
    jobs = {"optuna_param_importances": (main, ovm.plot_param_importances,
                                         ("importance (fraction of val. accuracy variance)", None)),
            "optuna_parallel_coordinate": (main, None, (None, None)),
            "optuna_intermediate_values": (pruned, ovm.plot_intermediate_values,
                                           ("epoch (pruner step)", "validation accuracy (fraction)"))}
    for name, (study_name, fn, (xlabel, ylabel)) in jobs.items():
        path = run.figure(name)
        try:
            study = rebuilt_study(hpo, trials, intermediate, study_name)
            if fn is None:
                fig = parallel_coordinate(study)
                fig.suptitle(f"study {study_name}", y=1.02)
                save_figure(fig, path)
                continue
            # Optuna's plots switch pyplot's style for the whole process: keep the switch to this one
            with plt.rc_context(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # optuna's matplotlib backend is marked experimental
                ax = fn(study)
                first = ax.flat[0] if hasattr(ax, "flat") else ax
                if xlabel:
                    first.set_xlabel(xlabel)
                if ylabel:
                    first.set_ylabel(ylabel)
                fig = first.figure
                fig.suptitle(f"study {study_name}", y=1.02)
                save_figure(fig, path)
        except Exception as exc:  # noqa: BLE001 - e.g. too few complete trials: keep the workflow going
            _placeholder(path, f"{name} ({study_name})", f"not available for this run:\n{exc}")


def draw(cfg: dict, study_dir: Path) -> None:
    run = StudyDir(study_dir)
    bsf = read_table(run.table("best_so_far"))
    if bsf["best_val_acc"].notna().any():
        _plot_best_so_far(bsf, run.figure("best_so_far"))
    else:
        _placeholder(run.figure("best_so_far"), "best so far", "no completed trial")
    scaling = read_table(run.table("grid_scaling"))
    if len(scaling):
        _plot_scaling(scaling, run.figure("grid_scaling"))
    else:
        _placeholder(run.figure("grid_scaling"), "grid scaling", "no grid study in this config")
    _optuna_figures(cfg, run)
