"""Figures stage of the checkpoint-cost study: tables/ -> figures/ (save/load time, bandwidth vs the
ceiling, sync vs async blocking, overhead vs interval, bytes on disk, DCP by ranks). Each figure says
the device its run was measured on where that changes what a line means: on the GPU a save starts
from GPU memory, and the ceiling is the D2H copy ceiling plus the storage ceiling."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import StudyDir, mark_no_data, pyplot, read_table, read_tables, save_figure
from hpcdl.studies.checkpoint.instruments import CEILINGS
from hpcdl.studies.checkpoint.tables import MiB, run_device, single_process

FORMAT_ORDER = ["torch", "safetensors", "dcp", "hdf5", "npz"]


def _formats(df: pd.DataFrame) -> list[str]:
    present = set(df["format"]) if not df.empty else set()
    return [f for f in FORMAT_ORDER if f in present]


def _colors() -> dict[str, str]:
    return dict(zip(FORMAT_ORDER, ["C0", "C1", "C2", "C3", "C4"], strict=True))


def _size_axis(ax) -> None:
    """Log x axis of state sizes in MiB with plain tick labels (no 2x10^-2 clutter)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _ranks_label(device: str, placement: str) -> str:
    """How a DCP launch's ranks talked: gloo on the CPU, NCCL between GPUs, gloo on a shared GPU."""
    if device != "cuda":
        return "gloo"
    return "shared-GPU gloo" if "shared" in placement else "NCCL GPU"


@dataclass(frozen=True)
class _View:
    """What every figure of a run shares: the formats' colours and the device it ran on."""

    col: dict
    device: str

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def on(self) -> str:
        return {"cpu": " (CPU)", "cuda": " (GPU, CUDA)"}.get(self.device, f" ({self.device})")


def draw(cfg: dict, study_dir: Path) -> None:
    plt = pyplot()
    run = StudyDir(study_dir)
    io = read_table(run.table("io_cost"))
    one = single_process(io)
    sync = one[one["mode"] == "sync"] if not one.empty else one
    view = _View(_colors(), run_device(io, study_dir))
    _plot_save_load(plt, view, sync, run.figure("save_load_time"))
    _plot_bandwidth(plt, view, sync, run.figure("bandwidth"))
    _plot_blocking(plt, view, one, run.figure("blocking"))
    # throughput overhead vs interval with the Young/Daly points
    _plot_overhead(plt, *read_tables(run.root, "overhead", "young_daly"), run.figure("overhead"))
    _plot_bytes_on_disk(plt, view, sync, run.figure("bytes_on_disk"))
    _plot_dcp_ranks(plt, view, io, run.figure("dcp_ranks"))


def _plot_save_load(plt, view: _View, sync: pd.DataFrame, path: Path) -> None:
    """Save and load time vs size (log-log), synchronous, one process."""
    gpu = view.gpu
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, column, title in ((axes[0], "commit_s", "save (D2H copy + write, to committed, fsync'd)" if gpu
                               else "save (to committed, fsync'd)"),
                              (axes[1], "load_s", "load (verified, back onto the GPU)" if gpu
                               else "load (verified)")):
        for f in _formats(sync):
            d = sync[sync["format"] == f].sort_values("state_bytes")
            ax.plot(d["state_bytes"] / MiB, d[column], "o-", color=view.col[f], label=f)
        if sync.empty:
            mark_no_data(ax, "no successful sync points in this run")
        _size_axis(ax)
        ax.set(yscale="log", xlabel="model state (MiB, fp32)", title=title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("time (s)")
    axes[0].legend()
    save_figure(fig, path)


def _plot_bandwidth(plt, view: _View, sync: pd.DataFrame, path: Path) -> None:
    """Write bandwidth vs size with the storage ceiling."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for f in _formats(sync):
        d = sync[sync["format"] == f].sort_values("state_bytes")
        ax.plot(d["state_bytes"] / MiB, d["write_bw_bytes_per_s"] / MiB, "o-", color=view.col[f], label=f)
    if not sync.empty:
        ceil = sync.groupby("state_bytes")["ceiling_bw_bytes_per_s"].median().dropna()
        fio = "ceiling_source" in sync and sync["ceiling_source"].eq("fio").any()
        label = f"ceiling: {CEILINGS.get(view.device, 'storage (write+fsync)')}" + (", fio" if fio else "")
        # a line where the ceiling was measured at several sizes, a mark where at one (ceiling_sizes)
        if not ceil.empty:
            ax.plot(ceil.index / MiB, ceil.values / MiB, "k--" if len(ceil) > 1 else "kx", lw=2, ms=10,
                    label=label)
        errors = [e for e in sync.get("ceiling_error", pd.Series(dtype=object))
                  if isinstance(e, str) and e and "ceiling_sizes" not in e]  # a CSV's empty text reads as NaN
        if ceil.empty and errors:
            ax.text(0.5, 0.5, f"no storage ceiling: {errors[0]}", transform=ax.transAxes, ha="center",
                    va="center", fontsize=8, wrap=True)
    else:
        mark_no_data(ax, "no successful sync points in this run")
    _size_axis(ax)
    ax.set(xlabel="model state (MiB, fp32)",
           ylabel=("GPU memory to durable bytes" if view.gpu else "write bandwidth to durable bytes")
           + " (MiB/s)",
           title=("Checkpoint bandwidth vs D2H + storage ceiling" if view.gpu
                  else "Checkpoint write bandwidth vs storage ceiling") + view.on)
    ax.set_ylim(bottom=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def _plot_blocking(plt, view: _View, one: pd.DataFrame, path: Path) -> None:
    """Sync vs async blocking time."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for f in _formats(one):
        for mode, style in (("sync", "o-"), ("async", "s--")):
            d = one[(one["format"] == f) & (one["mode"] == mode)].sort_values("state_bytes")
            if not d.empty:
                ax.plot(d["state_bytes"] / MiB, d["blocking_s"], style, color=view.col[f],
                        label=f"{f} {mode}")
    if one.empty:
        mark_no_data(ax, "no successful I/O points in this run")
    _size_axis(ax)
    ax.set(yscale="log", xlabel="model state (MiB, fp32)", ylabel="training stall per checkpoint (s)",
           title=("Blocking: sync (solid) vs pinned snapshot (dashed)" if view.gpu
                  else "Blocking time: sync (solid) vs async (dashed)") + view.on)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, path)


def _plot_bytes_on_disk(plt, view: _View, sync: pd.DataFrame, path: Path) -> None:
    """Bytes on disk per format: total at the largest size, and the bytes beyond the raw tensors."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    if not sync.empty:
        d = sync[sync["n_params"] == sync["n_params"].max()].set_index("format").reindex(_formats(sync))
        ratio = d["file_bytes"] / d["state_bytes"]
        bars = ax.bar(d.index, d["file_bytes"] / MiB, color=[view.col[f] for f in d.index])
        ax.axhline(float(d["state_bytes"].iloc[0]) / MiB, color="k", ls="--", label="raw tensor bytes")
        for b, r in zip(bars, ratio, strict=True):
            ax.annotate(f"x{r:.4f}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                        va="bottom", fontsize=8)
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.08))  # above the axes, not over a bar
        ax.set_title(f"Bytes on disk at {float(d['state_bytes'].iloc[0]) / MiB:.3g} MiB of state")
        for f in _formats(sync):
            e = sync[sync["format"] == f].sort_values("state_bytes")
            ax2.plot(e["state_bytes"] / MiB, (e["file_bytes"] - e["state_bytes"]).clip(lower=1) / 1024, "o-",
                     color=view.col[f], label=f)
        ax2.legend(fontsize=8)
    else:
        mark_no_data(ax, "no successful sync points in this run")
    ax.set(xlabel="format", ylabel="checkpoint size on disk (MiB)")
    _size_axis(ax2)
    ax2.set(yscale="log", xlabel="model state (MiB, fp32)", ylabel="bytes beyond the raw tensors (KiB)",
            title="Format overhead (headers, metadata, padding)")
    ax2.grid(True, which="both", alpha=0.3)
    save_figure(fig, path)


def _plot_dcp_ranks(plt, view: _View, io: pd.DataFrame, path: Path) -> None:
    """DCP save and load from N ranks."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    dcp = io[(io["format"] == "dcp") & (io["mode"] == "sync")] if not io.empty else io
    groups = sorted(set(zip(dcp["process_group"], dcp["ranks"], strict=True))) if not dcp.empty else []
    for i, (pg, r) in enumerate(groups):
        d = dcp[(dcp["process_group"] == pg) & (dcp["ranks"] == r)].sort_values("state_bytes")
        placement = str(d["placement"].fillna("").iloc[0]) if "placement" in d else ""
        label = (f"{r} {_ranks_label(view.device, placement)} rank(s), sharded DTensor" if pg
                 else "1 process, no process group")
        ax.plot(d["state_bytes"] / MiB, d["commit_s"], "o-", color=f"C{i}", label=f"save, {label}")
        ax.plot(d["state_bytes"] / MiB, d["load_s"], "s:", color=f"C{i}", label=f"load, {label}")
    if dcp.empty:
        mark_no_data(ax, "no successful DCP points in this run")
    _size_axis(ax)
    ax.set(yscale="log", xlabel="model state (MiB, fp32, all ranks)", ylabel="time (s)",
           title=f"DCP save/load by number of {'GPU ranks' if view.gpu else 'gloo ranks'}{view.on}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, path)


def _plot_overhead(plt, ovh: pd.DataFrame, yd: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if ovh.empty:
        mark_no_data(ax, "no successful overhead points in this run")
        save_figure(fig, path)
        return
    base = float(ovh["baseline_steps_per_s"].median())
    mode_col = {"sync": "C3", "async": "C0"}
    xs = []
    for mode, d in ovh.groupby("mode"):
        d = d.sort_values("interval_steps")
        ax.plot(d["interval_steps"], 100 * d["overhead_frac"].clip(lower=1e-4), "o-",
                color=mode_col.get(mode), label=f"{mode}: measured")
        xs += list(d["interval_steps"])
    for (mode, m), d in yd.groupby(["mode", "mtbf_s"]) if not yd.empty else []:
        r = d.iloc[0]
        if r["cost_s"] <= 0:
            continue
        k = np.geomspace(min(xs + [r["interval_steps"]]) / 2, max(xs + [r["interval_steps"]]) * 2, 200)
        t = k / base
        waste = r["cost_s"] / t + t / (2 * m)
        ax.plot(k, 100 * waste, "-", lw=0.8, alpha=0.6, color=mode_col.get(mode))
        ax.plot([r["interval_steps"]], [100 * r["expected_waste_frac"]], "*", ms=12, color=mode_col.get(mode),
                markeredgecolor="k")
        ax.annotate(f"MTBF {m:g}s", (r["interval_steps"], 100 * r["expected_waste_frac"]),
                    textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax.plot([], [], "k-", lw=0.8, alpha=0.6, label="C/T + T/(2 MTBF) (expected waste)")
    ax.plot([], [], "k*", ms=10, label="Young/Daly T = sqrt(2 MTBF C)")
    ax.set(xscale="log", yscale="log", xlabel=f"checkpoint interval (steps; 1 step = {1 / base:.3f} s)",
           ylabel="extra training time vs no checkpoint (%)",
           title="Training overhead vs checkpoint interval")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, path)
