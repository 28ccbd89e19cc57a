"""Figures stage of the hetmem study: tables/ -> figures/ (docs/architecture.md, "Stages").

parity (estimate vs simulated reference), error_vs_sampling (mean |error| vs the sampling period),
runtime_vs_fraction (each policy's simulated runtime vs fast capacity, per app) and
estimate_vs_reference_time (the cost of one estimate vs one native run of the app on this machine,
and vs one simulated reference run). Every axis and title says where the reference is simulated.
On a GPU (tables.on_hardware) the reference is the hardware and the axes say MEASURED; nothing is
sampled there (shares are counted from the kernels), so error_vs_sampling shows each placement's
|error| against its fast byte share instead, saying why.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcdl.platform import StudyDir, mark_no_data, pyplot, read_tables, save_figure
from hpcdl.studies.hetmem.gpu import SAMPLE_EVERY
from hpcdl.studies.hetmem.tables import on_hardware


def draw(cfg: dict, study_dir: Path) -> None:
    plt = pyplot()
    run = StudyDir(study_dir)
    block = cfg["hetmem"]
    val, errs, speed, pol, traces = read_tables(run.root, "validation", "errors", "speed", "policies",
                                                "tracing")
    hw = on_hardware(val) or on_hardware(traces)
    n = SAMPLE_EVERY if hw else block["sample_every"]
    tiers = ("GPU memory vs mapped pinned host" if hw
             else f"{block['tiers']['fast']['name']} vs {block['tiers']['slow']['name']}")
    ref = "MEASURED on the GPU" if hw else "SIMULATED two-tier"

    v = val[val["sample_every"].eq(n)] if not val.empty else val
    _plot_parity(plt, v, hw, n, tiers, ref, run.figure("parity"))
    _plot_error(plt, v, errs, hw, block["error_ceiling"], run.figure("error_vs_sampling"))
    _plot_policies(plt, pol, hw, run.figures)
    _plot_cost(plt, speed, hw, run.figure("estimate_vs_reference_time"))


def _plot_parity(plt, v, hw: bool, n: int, tiers: str, ref: str, path: Path) -> None:
    """Each app's estimate against its reference runtime, at sampling period `n`."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    if v.empty:
        mark_no_data(ax, "no validation rows (every app failed)")
    else:
        for app, g in v.groupby("app", sort=False):
            ax.scatter(g["ref_runtime_s"] * 1e6, g["est_runtime_s"] * 1e6, label=app, s=18)
        lo, hi = (
            v[["ref_runtime_s", "est_runtime_s"]].min().min() * 1e6,
            v[["ref_runtime_s", "est_runtime_s"]].max().max() * 1e6,
        )
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="estimate = reference")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    ax.set_xlabel(f"reference runtime, {ref} (µs)")
    ax.set_ylabel("object-granularity estimate, bytes counted (µs)" if hw
                  else f"differential-tracing estimate, N={n} (µs)")
    ax.set_title(f"Estimate vs {'measured' if hw else 'simulated'} reference ({tiers})", fontsize=10)
    save_figure(fig, path)


def _plot_error(plt, v, errs, hw: bool, ceiling: float, path: Path) -> None:
    """The estimator's error: vs the sampling rate (simulated), or vs the objects' share (GPU)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    if hw:
        _error_vs_share(ax, v, ceiling)
    elif errs.empty:
        mark_no_data(ax, "no validation rows")
    else:
        for app, g in errs.groupby("app", sort=False):
            g = g.sort_values("sample_every")
            ax.plot(
                g["sample_every"],
                100 * g["mean_abs_error"],
                "o-",
                lw=2.5 if app == "all" else 1.2,
                color="k" if app == "all" else None,
                label=app,
            )
        ax.axhline(100 * ceiling, color="firebrick", ls=":", label="claim ceiling")
        ax.set_xscale("log")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))  # inside, it hid a curve
    if not hw:  # the GPU's axes are _error_vs_share's
        ax.set_xlabel("sampling period N (1 in N LLC misses sampled)")
        ax.set_ylabel("mean |error| vs simulated reference (%)")
        ax.set_title("Estimator error vs sampling rate (reference simulated)", fontsize=10)
    save_figure(fig, path)


def _plot_cost(plt, speed, hw: bool, path: Path) -> None:
    """The cost of one estimate against one run of a placement."""
    fig, ax = plt.subplots(figsize=(6, 4))
    if speed.empty:
        mark_no_data(ax, "no timings")
    else:
        x = np.arange(len(speed))
        bars = (
            ("native_run_s", "one hardware run of a placement (place objects + one step)"
             if hw else "one native run of the app (process wall, start-up included: context)"),
            ("native_compute_s", "its step alone (the claim uses it)" if hw
             else "its compute phase alone (the claim uses it)"),
            ("simulated_reference_s", "one simulated reference run (cache sim + timing)"),
            ("estimate_s",
             "one estimate (object byte shares)" if hw else "one estimate (differential tracing)"),
        )
        # nothing is simulated on the GPU: its bar is left out, not drawn as zero
        bars = tuple(b for b in bars if speed[b[0]].notna().any())
        for i, (col, label) in enumerate(bars):
            ax.bar(x + 0.2 * (i - (len(bars) - 1) / 2), speed[col], 0.2, label=label)
        ax.set_xticks(x, speed["app"])
        ax.set_yscale("log")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12))  # not over the bars
    ax.set_ylabel("wall time per placement (s, log)")
    ax.set_title("Cost of one estimate vs one hardware run of a placement (GPU)" if hw
                 else "Cost of one estimate vs one native run of the app", fontsize=10)
    save_figure(fig, path)


def _error_vs_share(ax, v, ceiling: float) -> None:
    """The GPU path's stand-in for error vs sampling period: nothing is sampled there, so each
    placement's |error| against the share of the step's bytes in fast objects."""
    if v.empty or "fast_byte_share" not in v:
        mark_no_data(ax, "no validation rows (every app failed)")
    else:
        for app, g in v.groupby("app", sort=False):
            ax.scatter(g["fast_byte_share"], 100 * g["error"].abs(), s=18, label=app)
        ax.axhline(100 * ceiling, color="firebrick", ls=":", label="claim ceiling")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    ax.set_xlabel("share of the step's bytes in fast objects (s)")
    ax.set_ylabel("|error| vs measured time (%)")
    ax.set_title("GPU: no sampling (bytes counted from the kernels); estimator error per placement",
                 fontsize=10)


def _plot_policies(plt, pol, hw: bool, figs) -> None:
    """Each policy's runtime relative to the all-fast bound against the fast tier's capacity, one panel
    per app in a grid of at most three columns (one row of five was a strip too thin to read), the
    capacity axis over its whole range 0..1, one legend for all."""
    import math

    apps = list(dict.fromkeys(pol["app"])) if not pol.empty else []
    cols = min(3, max(1, len(apps)))
    rows = max(1, math.ceil(len(apps) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.3 * rows + 0.8), squeeze=False)
    flat = list(axes.flat)
    if not apps:
        mark_no_data(flat[0], "no policy rows")
    for ax, app in zip(flat, apps, strict=False):
        g = pol[pol["app"].eq(app)]
        for policy, gp in g.groupby("policy", sort=False):
            gp = gp.sort_values("capacity")
            ax.plot(gp["capacity"], gp["ref_runtime_s"] / gp["all_fast_runtime_s"], "o-", label=policy)
        ax.axhline(1.0, color="k", ls="--", lw=1, label="all-fast bound")
        slow = float((g["all_slow_runtime_s"] / g["all_fast_runtime_s"]).iloc[0])
        ax.axhline(slow, color="gray", ls=":", lw=1, label="all-slow")
        ax.set_xlim(0, 1)
        ax.set_ylim(0.9, 1.08 * slow)
        ax.set_title(app, fontsize=10)
        ax.grid(True, alpha=0.3)
    for ax in flat[len(apps):]:
        ax.axis("off")
    for ax in flat[max(0, len(apps) - cols):len(apps)]:  # the lowest panel of each column
        ax.set_xlabel("fast capacity (fraction of footprint)")
    for ax in axes[:, 0]:
        ax.set_ylabel(f"{'measured' if hw else 'simulated'} runtime / all-fast")
    handles, labels = flat[0].get_legend_handles_labels()
    if handles:  # in the grid's empty cell where there is one, else under the grid
        spare = flat[len(apps)] if len(apps) < len(flat) else None
        if spare is not None:
            spare.legend(handles, labels, loc="center", fontsize=9)
        else:
            fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    fig.suptitle(f"Placement policies: {'measured (GPU, whole objects)' if hw else 'simulated'} runtime vs "
                 "fast-memory capacity", fontsize=11)
    fig.tight_layout(rect=(0, 0.06 if len(apps) == len(flat) else 0, 1, 1))
    save_figure(fig, figs / "runtime_vs_fraction.png")
