"""Figures stage of the shuffle study: tables/ -> figures/ (accuracy vs epoch, final accuracy vs Q,
time per epoch vs Q, bytes exchanged vs Q, KAKURENBO time vs accuracy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcdl.platform.results import read_table, save_figure
from hpcdl.platform.stages import pyplot
from hpcdl.studies.shuffle.compute import SAMPLE_BYTES
from hpcdl.studies.shuffle.tables import PARTITIONINGS

TIME_PARTS = [("load_s", "data loading"), ("exposed_exchange_s", "exposed exchange"),
              ("fwd_bwd_s", "forward + backward"), ("update_s", "update")]


def _order(labels) -> list[str]:
    def key(lbl):
        return -1.0 if lbl == "local" else 2.0 if lbl == "global" else float(lbl.split("-")[1])
    return sorted(set(labels), key=key)


def draw(cfg: dict, study_dir: Path) -> None:
    plt = pyplot()
    study_dir = Path(study_dir)
    epochs = read_table(study_dir / "tables" / "epochs.csv")
    final = read_table(study_dir / "tables" / "final.csv")
    figs = study_dir / "figures"
    plain = epochs[epochs["kakurenbo_fraction"].eq(0)]
    plain_final = final[final["kakurenbo_fraction"].eq(0)]
    sizes = sorted(plain["world_size"].unique())
    styles = ["-", "--", ":", "-."]

    # 1. validation accuracy vs epoch, one panel per partitioning
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    labels = _order(plain["label"])
    colors = {lbl: plt.cm.viridis(i / max(1, len(labels) - 1)) for i, lbl in enumerate(labels)}
    for ax, part in zip(axes, PARTITIONINGS, strict=True):
        sub = plain[plain["partitioning"].eq(part)]
        for (lbl, m), g in sub.groupby(["label", "world_size"]):
            curve = g.groupby("epoch")["val_acc"].mean()
            ax.plot(curve.index + 1, 100 * curve.values, styles[sizes.index(m) % 4], color=colors[lbl],
                    marker="o", ms=3, label=f"{lbl}, M={m}")
        ax.set_title(f"{part} partitioning")
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation accuracy (%)")
    # beside the panels: inside, it covered the skewed curves
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    save_figure(fig, figs / "acc_vs_epoch.png")
    plt.close(fig)

    # 2. final accuracy vs Q (Q on a categorical axis: 0 = local, 1 = global)
    qs = sorted(plain_final["q"].unique())
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (part, m), g in plain_final.groupby(["partitioning", "world_size"]):
        acc = g.groupby("q")["final_val_acc"].mean()
        ax.plot([qs.index(q) for q in acc.index], 100 * acc.values, styles[sizes.index(m) % 4], marker="o",
                color="tab:blue" if part == "random" else "tab:red", label=f"{part}, M={m}")
    ax.set_xticks(range(len(qs)), [f"{q:g}" for q in qs])
    ax.set_xlabel("shuffle fraction Q (0 = local, 1 = global)")
    ax.set_ylabel("final validation accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, figs / "final_acc_vs_q.png")
    plt.close(fig)

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
    save_figure(fig, figs / "time_per_epoch_vs_q.png")
    plt.close(fig)

    # 4. bytes exchanged per epoch vs Q, against Q * N samples
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
    save_figure(fig, figs / "bytes_vs_q.png")
    plt.close(fig)

    # 5. KAKURENBO: training time vs accuracy per F
    k = read_table(study_dir / "tables" / "kakurenbo.csv")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(k["train_time_s"], 100 * k["final_val_acc"], "o-")
    for _, r in k.iterrows():
        ax.annotate(f"F={r['kakurenbo_fraction']:g}", (r["train_time_s"], 100 * r["final_val_acc"]),
                    textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel("training time, all epochs (s)")
    ax.set_ylabel("final validation accuracy (%)")
    ax.set_title(f"KAKURENBO on global shuffling, M = {cfg['shuffle']['kakurenbo']['world_size']}")
    ax.grid(alpha=0.3)
    save_figure(fig, figs / "kakurenbo.png")
    plt.close(fig)
