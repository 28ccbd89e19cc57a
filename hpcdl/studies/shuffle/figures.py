"""Figures stage of the shuffle study: tables/ -> figures/ (accuracy vs epoch, final accuracy vs Q,
the accuracy gap to global vs Q with its interval (the Q that recovers global), time per epoch vs
Q, bytes exchanged vs Q, KAKURENBO's time saved against the work it skips and its overhead)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcdl.platform import StudyDir, mark_no_data, pyplot, read_table, save_figure
from hpcdl.studies.shuffle.compute import SAMPLE_BYTES
from hpcdl.studies.shuffle.tables import PARTITIONINGS, plain_runs

TIME_PARTS = [("load_s", "data loading"), ("exposed_exchange_s", "exposed exchange"),
              ("fwd_bwd_s", "forward + backward"), ("update_s", "update")]


def _order(labels) -> list[str]:
    def key(lbl):
        return -1.0 if lbl == "local" else 2.0 if lbl == "global" else float(lbl.split("-")[1])
    return sorted(set(labels), key=key)


STYLES = ["-", "--", ":", "-."]  # one per world size


def draw(cfg: dict, study_dir: Path) -> None:
    plt = pyplot()
    run = StudyDir(study_dir)
    epochs = read_table(run.table("epochs"))
    final = read_table(run.table("final"))
    plain = epochs[~epochs["point"].str.startswith("kakurenbo-")]
    plain_final = plain_runs(final)
    sizes = sorted(plain["world_size"].unique())

    # 1. validation accuracy vs epoch, one panel per partitioning
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    labels = _order(plain["label"])
    colors = {lbl: plt.cm.viridis(i / max(1, len(labels) - 1)) for i, lbl in enumerate(labels)}
    for ax, part in zip(axes, PARTITIONINGS, strict=True):
        sub = plain[plain["partitioning"].eq(part)]
        for (lbl, m), g in sub.groupby(["label", "world_size"]):
            curve = g.groupby("epoch")["val_acc"].mean()
            ax.plot(curve.index + 1, 100 * curve.values, STYLES[sizes.index(m) % 4], color=colors[lbl],
                    marker="o", ms=3, label=f"{lbl}, M={m}")
        ax.set_title(f"{part} partitioning (mean over seeds)")
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation accuracy (%)")
    # beside the panels: inside, it covered the skewed curves
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    save_figure(fig, run.figure("acc_vs_epoch"))
    plt.close(fig)

    _final_acc_figure(plt, plain_final, sizes, run)

    # 3. stacked time per epoch vs Q, one panel per M (random partitioning)
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False, sharey=True)
    for ax, m in zip(axes[0], sizes, strict=True):
        g = plain_final[plain_final["world_size"].eq(m) & plain_final["partitioning"].eq("random")]
        g = g.groupby("q")[[c for c, _ in TIME_PARTS]].mean()
        bottom = np.zeros(len(g))
        for col, name in TIME_PARTS:
            ax.bar(range(len(g)), g[col].values, bottom=bottom, label=name)
            bottom += g[col].values
        ax.set_xticks(range(len(g)), [f"{q:g}" for q in g.index])
        ax.set_xlabel("shuffle fraction Q")
        ax.set_title(f"M = {m} ranks")
    axes[0][0].set_ylabel("time per epoch per rank (s)")
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))  # not over the bars
    where = _measured_where(plain_final)
    if where:
        fig.suptitle(where, fontsize=9)
    save_figure(fig, run.figure("time_per_epoch_vs_q"))
    plt.close(fig)

    _bytes_figure(plt, cfg, plain_final, sizes, run)
    _gap_figure(plt, cfg, run)
    _kakurenbo_figure(plt, cfg, run)


def _final_acc_figure(plt, plain_final, sizes: list, run: StudyDir) -> None:
    """Final accuracy vs Q (Q on a categorical axis: 0 = local, 1 = global)."""
    qs = sorted(plain_final["q"].unique())
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (part, m), g in plain_final.groupby(["partitioning", "world_size"]):
        acc = g.groupby("q")["final_val_acc"].mean()
        ax.plot([qs.index(q) for q in acc.index], 100 * acc.values, STYLES[sizes.index(m) % 4], marker="o",
                color="tab:blue" if part == "random" else "tab:red", label=f"{part}, M={m}")
    ax.set_xticks(range(len(qs)), [f"{q:g}" for q in qs])
    ax.set_xlabel("shuffle fraction Q (0 = local, 1 = global)")
    ax.set_ylabel("final validation accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, run.figure("final_acc_vs_q"))
    plt.close(fig)


def _bytes_figure(plt, cfg: dict, plain_final, sizes: list, run: StudyDir) -> None:
    """Bytes exchanged per epoch vs Q, against Q * N samples."""
    fig, ax = plt.subplots(figsize=(6, 4))
    n = cfg["shuffle"]["n_train"]
    for m, g in plain_final.groupby("world_size"):
        g = g[g["strategy"].eq("partial")].groupby("q")["bytes_per_epoch"].mean()
        ax.plot(g.index, g.values / 1e6, "o", ms=8 - 2 * sizes.index(m), label=f"measured, M={m}")
    qline = np.linspace(0.0, 1.0, 50)
    ax.plot(qline, qline * n * SAMPLE_BYTES / 1e6, "k-", lw=0.8, label=f"Q x N samples (N={n})")
    ax.set_xlabel("shuffle fraction Q")
    ax.set_ylabel("bytes exchanged per epoch, all ranks (MB)")
    ax.set_xscale("symlog", linthresh=0.01)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, run.figure("bytes_vs_q"))
    plt.close(fig)


def _gap_figure(plt, cfg: dict, run: StudyDir) -> None:
    """Accuracy gap to global vs Q per partitioning: mean over paired seeds with its 95 % interval
    (one-seed points hollow, no interval), the tolerance line, and the smallest Q within it."""
    gap = read_table(run.table("gap"))
    rec = read_table(run.table("recovery"))
    tol = cfg["shuffle"]["tolerance_pt"]
    if gap.empty:
        _nothing(plt, run.figure("acc_gap_vs_q"), "no local or partial point to compare "
                 "with global in this config")
        return
    sizes = sorted(gap["world_size"].unique())
    qs = sorted(gap["q"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, part in zip(axes, PARTITIONINGS, strict=True):
        for i, m in enumerate(sizes):
            g = gap[gap["partitioning"].eq(part) & gap["world_size"].eq(m)].sort_values("q")
            if g.empty:
                continue
            x = np.array([qs.index(q) for q in g["q"]]) + (i - (len(sizes) - 1) / 2) * 0.12
            color = plt.cm.tab10(i)
            ax.plot(x, g["gap_pt_mean"], "-", color=color, lw=0.8)
            many = g["seeds"].ge(2).to_numpy()
            err = np.vstack([g["gap_pt_mean"] - g["gap_pt_low"], g["gap_pt_high"] - g["gap_pt_mean"]])
            ax.errorbar(x[many], g["gap_pt_mean"][many], yerr=err[:, many], fmt="o", color=color, capsize=3,
                        label=f"M={m}, mean of {int(g['seeds'].max())} seeds, 95 % interval")
            if (~many).any():
                ax.plot(x[~many], g["gap_pt_mean"][~many], "o", mfc="white", color=color,
                        label=f"M={m}, one seed (no interval)")
            r = rec[rec["partitioning"].eq(part) & rec["world_size"].eq(m)]
            if not r.empty and np.isfinite(r["q_recovers"].iloc[0]):
                qr = float(r["q_recovers"].iloc[0])
                ax.annotate(f"Q={qr:g}", (qs.index(qr) + (i - (len(sizes) - 1) / 2) * 0.12, -tol),
                            textcoords="offset points", xytext=(0, -22 - 10 * i), ha="center", fontsize=8,
                            color=color, arrowprops={"arrowstyle": "->", "color": color, "lw": 0.8})
        ax.axhline(-tol, color="gray", ls="--", lw=0.8, label=f"-{tol:g} pt (tolerance)")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_xticks(range(len(qs)), [f"{q:g}" for q in qs])
        ax.set_xlabel("shuffle fraction Q (0 = local)")
        ax.set_title(f"{part} partitioning")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("final accuracy minus global's (pt)")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    save_figure(fig, run.figure("acc_gap_vs_q"))
    plt.close(fig)


def _kakurenbo_figure(plt, cfg: dict, run: StudyDir) -> None:
    """Per hiding fraction F: wall time saved (paired with F = 0 of the same round, 95 % interval)
    beside the backward work skipped and the overhead added; and the accuracy change."""
    k = read_table(run.table("kakurenbo"))
    tol = cfg["shuffle"]["tolerance_pt"]
    if k.empty:
        _nothing(plt, run.figure("kakurenbo"), "no KAKURENBO round with F > 0 in this run")
        return
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    x = np.arange(len(k))
    w = 0.26
    ax.bar(x - w, 100 * k["work_saved"], w, color="palegreen", label="work skipped: samples x F=0's compute")
    ax.bar(x - w, 100 * k["compute_saved"], w * 0.5, color="tab:green", label="compute time saved (measured)")
    ax.bar(x, -100 * k["overhead"], w, color="tab:red", label="overhead: loss recording, re-selection,\n"
           "hidden samples' forward")
    err = 100 * np.vstack([k["time_saving_mean"] - k["time_saving_low"],
                           k["time_saving_high"] - k["time_saving_mean"]])
    ax.bar(x + w, 100 * k["time_saving_mean"], w, yerr=err, capsize=3, color="tab:blue",
           label="wall time saved (mean, 95 % interval)")
    ax.axhline(0, color="black", lw=0.5)
    net_err = 100 * np.vstack([k["net_saving_mean"] - k["net_saving_low"],
                               k["net_saving_high"] - k["net_saving_mean"]])
    ax.errorbar(x - w / 2, 100 * k["net_saving_mean"], yerr=net_err, fmt="D", color="black", ms=4, capsize=3,
                label="net saving by the method's account\n(work skipped - overhead, 95 % interval)")
    ax.axhline(100 * k["min_net_saving"].iloc[0], color="gray", ls="--", lw=0.8,
               label="regime floor (kakurenbo.min_net_saving)")
    ax.set_xticks(x, [f"F={f:g}" + ("" if in_regime else "\n(outside regime)")
                      for f, in_regime in zip(k["kakurenbo_fraction"], k["in_regime"], strict=True)])
    ax.set_ylabel("% of F=0's training time")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high + 0.6 * (high - low))   # headroom: the legend sits above the bars
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3, axis="y")
    err = np.vstack([k["acc_change_pt_mean"] - k["acc_change_pt_low"],
                     k["acc_change_pt_high"] - k["acc_change_pt_mean"]])
    bx.errorbar(x, k["acc_change_pt_mean"], yerr=err, fmt="o", capsize=3)
    bx.axhline(-tol, color="gray", ls="--", lw=0.8, label=f"-{tol:g} pt (tolerance)")
    bx.axhline(0, color="black", lw=0.5)
    bx.set_xticks(x, [f"F={f:g}" for f in k["kakurenbo_fraction"]])
    bx.set_ylabel("accuracy change vs F=0 (pt)")
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3)
    kk = cfg["shuffle"]["kakurenbo"]
    rounds = int(k["rounds"].max()) if not k.empty else 0
    fig.suptitle(f"KAKURENBO on global shuffling, M = {kk['world_size']}, {rounds} interleaved rounds")
    save_figure(fig, run.figure("kakurenbo"))
    plt.close(fig)


SAMPLES_HELD = {"host": "host memory", "device": "GPU memory"}


def _measured_where(final) -> str:
    """The ranks' devices and where their samples were held (tables' device columns), for a timing
    figure's title: a shared GPU or a GPU-held exchange changes what the times mean. Empty for tables
    from before rows named their device."""
    if "device" not in final.columns or final.empty:
        return ""
    devices = sorted({d.strip() for v in final["device"].astype(str) for d in v.split(";")}
                     - {"not recorded"})
    held = sorted(set(final["exchange_device"].astype(str)) - {"not recorded"})
    if not devices:
        return ""
    return (f"ranks on {', '.join(devices)}; samples held in "
            f"{' and '.join(SAMPLES_HELD.get(h, h) for h in held)}")


def _nothing(plt, path: Path, why: str) -> None:
    """A figure the config gives no data for still exists, and says why."""
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    mark_no_data(ax, why)
    save_figure(fig, path)
    plt.close(fig)
