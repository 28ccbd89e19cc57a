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

from hpcdl.platform.results import mark_no_data, save_figure
from hpcdl.platform.stages import pyplot, read_or_empty
from hpcdl.studies.hetmem.gpu import SAMPLE_EVERY
from hpcdl.studies.hetmem.tables import on_hardware


def draw(cfg: dict, study_dir: Path) -> None:
    plt = pyplot()
    study_dir = Path(study_dir)
    block = cfg["hetmem"]
    tables, figs = study_dir / "tables", study_dir / "figures"
    val, errs = read_or_empty(tables / "validation.csv"), read_or_empty(tables / "errors.csv")
    speed, pol = read_or_empty(tables / "speed.csv"), read_or_empty(tables / "policies.csv")
    hw = on_hardware(val) or on_hardware(read_or_empty(tables / "tracing.csv"))
    n = SAMPLE_EVERY if hw else block["sample_every"]
    tiers = ("GPU memory vs mapped pinned host" if hw
             else f"{block['tiers']['fast']['name']} vs {block['tiers']['slow']['name']}")
    ref = "MEASURED on the GPU" if hw else "SIMULATED two-tier"

    fig, ax = plt.subplots(figsize=(5.5, 5))
    v = val[val["sample_every"].eq(n)] if not val.empty else val
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
    save_figure(fig, figs / "parity.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    if hw:
        _error_vs_share(ax, v, block["error_ceiling"])
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
        ax.axhline(100 * block["error_ceiling"], color="firebrick", ls=":", label="claim ceiling")
        ax.set_xscale("log")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))  # inside, it hid a curve
    if not hw:  # the GPU's axes are _error_vs_share's
        ax.set_xlabel("sampling period N (1 in N LLC misses sampled)")
        ax.set_ylabel("mean |error| vs simulated reference (%)")
        ax.set_title("Estimator error vs sampling rate (reference simulated)", fontsize=10)
    save_figure(fig, figs / "error_vs_sampling.png")

    apps = list(dict.fromkeys(pol["app"])) if not pol.empty else []
    fig, axes = plt.subplots(1, max(1, len(apps)), figsize=(3.6 * max(1, len(apps)), 3.6), squeeze=False)
    if not apps:
        mark_no_data(axes[0, 0], "no policy rows")
    for ax, app in zip(axes[0], apps, strict=False):
        g = pol[pol["app"].eq(app)]
        for policy, gp in g.groupby("policy", sort=False):
            gp = gp.sort_values("capacity")
            ax.plot(gp["capacity"], gp["ref_runtime_s"] / gp["all_fast_runtime_s"], "o-", label=policy)
        ax.axhline(1.0, color="k", ls="--", lw=1, label="all-fast bound")
        ax.axhline(
            float((g["all_slow_runtime_s"] / g["all_fast_runtime_s"]).iloc[0]),
            color="gray",
            ls=":",
            lw=1,
            label="all-slow",
        )
        ax.set_title(app, fontsize=10)
        ax.set_xlabel("fast capacity (fraction of footprint)")
    axes[0, 0].set_ylabel(f"{'measured' if hw else 'simulated'} runtime / all-fast")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"Placement policies: {'measured (GPU, whole objects)' if hw else 'simulated'} runtime vs "
                 "fast-memory capacity", fontsize=10)
    fig.tight_layout()
    save_figure(fig, figs / "runtime_vs_fraction.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    if speed.empty:
        mark_no_data(ax, "no timings")
    else:
        x = np.arange(len(speed))
        bars = (
            ("native_run_s", "one hardware run of a placement (place objects + one step; the claim uses it)"
             if hw else "one native run of the app (process wall, this machine; the claim uses it)"),
            ("native_compute_s", "its step alone" if hw else "its compute phase alone"),
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
    save_figure(fig, figs / "estimate_vs_reference_time.png")


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
