"""Tables, figures and claims of the shuffle study (used by `python -m hpcdl.cli <step> shuffle`).

raw/ (written by tasks/shuffle.py): epochs.csv (point x epoch x rank), points.csv (status per point).
tables/: epochs.csv (point x epoch, ranks combined; the global baseline copied into both
partitionings), final.csv (point: last-epoch accuracy, times, bytes), kakurenbo.csv.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.io import claim, read_table, save_figure, write_table
from hpcdl.shuffle.plan import exchange_count
from hpcdl.shuffle.run import SAMPLE_BYTES

PARTITIONINGS = ("random", "skewed")
TIME_PARTS = [("load_s", "data loading"), ("exposed_exchange_s", "exposed exchange"),
              ("fwd_bwd_s", "forward + backward"), ("update_s", "update")]


def _started(study_dir: Path) -> float:
    try:
        prov = json.loads((study_dir / "raw" / "epochs.provenance.json").read_text())
        return pd.Timestamp(prov["start_time"]).timestamp()
    except (OSError, KeyError, ValueError):
        return time.time()


def _label(strategy: str, q: float) -> str:
    return strategy if strategy != "partial" else f"partial-{q:g}"


# ---------------------------------------------------------------------------------------- tables
def epoch_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Ranks combined: accuracy is the same on every rank; volumes summed; times averaged."""
    keys = ["point", "strategy", "q", "partitioning", "world_size", "seed", "kakurenbo_fraction", "epoch"]
    agg = raw.groupby(keys, sort=False).agg(
        val_acc=("val_acc", "mean"), val_loss=("val_loss", "mean"), train_loss=("train_loss", "mean"),
        samples_sent=("samples_sent", "sum"), samples_recv=("samples_recv", "sum"),
        bytes_sent=("bytes_sent", "sum"), bytes_recv=("bytes_recv", "sum"),
        exchange_s=("exchange_s", "mean"), exposed_exchange_s=("exposed_exchange_s", "mean"),
        load_s=("load_s", "mean"), fwd_bwd_s=("fwd_bwd_s", "mean"), update_s=("update_s", "mean"),
        hidden_forward_s=("hidden_forward_s", "mean"), compute_s=("compute_s", "mean"),
        epoch_s=("epoch_s", "mean"), samples_held_max=("samples_held", "max"),
        samples_trained=("samples_trained", "sum"), hidden=("hidden", "max"),
        moved_back=("moved_back", "max"),
        partition_skew_tv=("partition_skew_tv", "mean"),
    ).reset_index()
    agg["label"] = [_label(s, q) for s, q in zip(agg["strategy"], agg["q"], strict=True)]
    # the global baseline does not depend on the partitioning: show it in both panels
    shared = agg[agg["partitioning"].eq("shared")]
    parts = [agg[~agg["partitioning"].eq("shared")]]
    parts += [shared.assign(partitioning=p) for p in PARTITIONINGS]
    return pd.concat(parts, ignore_index=True)


def final_table(epochs: pd.DataFrame, n_train: int) -> pd.DataFrame:
    last = epochs.sort_values("epoch").groupby(["point", "partitioning"], sort=False).tail(1)
    totals = epochs.groupby(["point", "partitioning"], sort=False).agg(
        train_time_s=("epoch_s", "sum"), epoch_time_s=("epoch_s", "mean"),
        bytes_per_epoch=("bytes_sent", "mean"), samples_per_epoch=("samples_sent", "mean"),
        exchange_s=("exchange_s", "mean"), exposed_exchange_s=("exposed_exchange_s", "mean"),
        load_s=("load_s", "mean"), fwd_bwd_s=("fwd_bwd_s", "mean"), update_s=("update_s", "mean"),
        samples_held_max=("samples_held_max", "max")).reset_index()
    out = last[["point", "strategy", "q", "label", "partitioning", "world_size", "seed", "kakurenbo_fraction",
                "val_acc", "train_loss"]].rename(columns={"val_acc": "final_val_acc"})
    out = out.merge(totals, on=["point", "partitioning"])
    out["expected_bytes_per_epoch"] = [
        exchange_count(n_train, int(m), q) * int(m) * SAMPLE_BYTES if s == "partial" else 0
        for s, q, m in zip(out["strategy"], out["q"], out["world_size"], strict=True)]
    m = out["world_size"]
    out["held_bound"] = np.ceil(n_train / m) + np.floor(out["q"] * n_train / m)
    return out.reset_index(drop=True)


def kakurenbo_table(final: pd.DataFrame, world_size: int) -> pd.DataFrame:
    k = final[final["strategy"].eq("global") & final["world_size"].eq(world_size)
              & final["partitioning"].eq("random")]
    k = k.groupby("kakurenbo_fraction").agg(final_val_acc=("final_val_acc", "mean"),
                                            train_time_s=("train_time_s", "mean"), seeds=("seed", "nunique"))
    k = k.reset_index()
    base = k[k["kakurenbo_fraction"].eq(0)]
    if not base.empty:
        k["time_saving"] = 1 - k["train_time_s"] / float(base["train_time_s"].iloc[0])
        k["acc_change_pt"] = 100 * (k["final_val_acc"] - float(base["final_val_acc"].iloc[0]))
    return k


def aggregate(cfg: dict, study_dir: Path) -> None:
    study_dir = Path(study_dir)
    block = cfg["shuffle"]
    raw = read_table(study_dir / "raw" / "epochs.csv")
    started = _started(study_dir)
    tables = study_dir / "tables"
    if raw.empty:
        raise ValueError(f"{study_dir / 'raw' / 'epochs.csv'} has no rows: every sweep point failed "
                         f"(see {study_dir / 'raw' / 'points.csv'})")
    epochs = epoch_table(raw)
    final = final_table(epochs, block["n_train"])
    write_table(epochs, tables / "epochs.csv", cfg, started)
    write_table(final, tables / "final.csv", cfg, started)
    kk = kakurenbo_table(final, block["kakurenbo"]["world_size"])
    write_table(kk, tables / "kakurenbo.csv", cfg, started)


# ---------------------------------------------------------------------------------------- figures
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt




def _order(labels) -> list[str]:
    def key(lbl):
        return -1.0 if lbl == "local" else 2.0 if lbl == "global" else float(lbl.split("-")[1])
    return sorted(set(labels), key=key)


def plot(cfg: dict, study_dir: Path) -> None:
    plt = _plt()
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
    axes[1].legend(fontsize=7, ncol=2)
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
    axes[0][-1].legend(fontsize=8)
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


# ---------------------------------------------------------------------------------------- claims
def _acc(final: pd.DataFrame, part: str, m: int, label: str) -> float | None:
    g = final[final["partitioning"].eq(part) & final["world_size"].eq(m) & final["label"].eq(label)
              & final["kakurenbo_fraction"].eq(0)]
    return float(g["final_val_acc"].mean()) if not g.empty else None


def _pt(x):
    return None if x is None else round(100 * x, 2)


def claims(cfg: dict, study_dir: Path) -> list[dict]:
    study_dir = Path(study_dir)
    block = cfg["shuffle"]
    tol = block["tolerance_pt"] / 100
    final = read_table(study_dir / "tables" / "final.csv")
    epochs = read_table(study_dir / "tables" / "epochs.csv")
    out = []
    for m in sorted(final["world_size"].unique()):
        glob = {p: _acc(final, p, m, "global") for p in PARTITIONINGS}
        loc = {p: _acc(final, p, m, "local") for p in PARTITIONINGS}
        p01 = {p: _acc(final, p, m, "partial-0.1") for p in PARTITIONINGS}
        if glob["random"] is not None and loc["random"] is not None and p01["random"] is not None:
            ok = loc["random"] >= glob["random"] - tol and p01["random"] >= glob["random"] - tol
            out.append(claim(
                f"random_local_partial_match_global_M{m}",
                f"Random partitioning, M={m}: local and partial-0.1 shuffling reach a final validation "
                f"accuracy no more than {block['tolerance_pt']:g} pt below global shuffling.",
                ok, global_pt=_pt(glob["random"]), local_pt=_pt(loc["random"]),
                partial_0_1_pt=_pt(p01["random"]), tolerance_pt=block["tolerance_pt"]))
        if glob["skewed"] is not None and loc["skewed"] is not None and p01["skewed"] is not None:
            ok = p01["skewed"] >= glob["skewed"] - tol and loc["skewed"] < glob["skewed"] - tol
            out.append(claim(
                f"skewed_partial_recovers_global_M{m}",
                f"Label-skewed partitioning (Dirichlet alpha={block['alpha']:g}), M={m}: partial-0.1 is no "
                f"more than {block['tolerance_pt']:g} pt below global, while local is more than that "
                "below global.",
                ok, global_pt=_pt(glob["skewed"]), local_pt=_pt(loc["skewed"]),
                partial_0_1_pt=_pt(p01["skewed"]), tolerance_pt=block["tolerance_pt"]))
    part = epochs[epochs["strategy"].eq("partial") & epochs["kakurenbo_fraction"].eq(0)]
    if not part.empty:
        n = block["n_train"]
        expect = part["q"] * n * SAMPLE_BYTES
        exact = bool(np.all(part["bytes_sent"] == expect) and np.all(part["bytes_recv"] == expect)
                     and np.all(part["samples_sent"] == part["q"] * n))
        out.append(claim(
            "bytes_per_epoch_equal_QN",
            f"Partial-Q exchange moves exactly Q*N samples ({SAMPLE_BYTES} bytes each: image, label, id) per "
            f"epoch, summed over ranks, in every epoch of every partial point (N={n}).",
            exact, epochs_checked=len(part),
            max_abs_deviation_bytes=float((part["bytes_sent"] - expect).abs().max()),
            qs=sorted(part["q"].unique().tolist())))
        fin = final[final["strategy"].eq("partial")]
        out.append(claim(
            "held_at_most_1_plus_Q_N_over_M",
            "No rank ever holds more than (1+Q)*N/M samples (its partition plus the received ones, "
            "N/M rounded up for uneven N).",
            bool(np.all(fin["samples_held_max"] <= fin["held_bound"])),
            max_held=int(fin["samples_held_max"].max()), bound=float(fin["held_bound"].max())))
    k = read_table(study_dir / "tables" / "kakurenbo.csv")
    if "time_saving" in k and (k["kakurenbo_fraction"] > 0).any():
        good = k[(k["kakurenbo_fraction"] > 0) & (k["time_saving"] > 0)
                 & (k["acc_change_pt"] >= -block["tolerance_pt"])]
        fr = k["kakurenbo_fraction"].astype(str)
        out.append(claim(
            "kakurenbo_saves_time",
            f"KAKURENBO saves training time at no more than {block['tolerance_pt']:g} pt accuracy loss for "
            "some hiding fraction F > 0.",
            not good.empty, fractions_that_hold=good["kakurenbo_fraction"].tolist(),
            time_saving=dict(zip(fr, k["time_saving"].round(3), strict=True)),
            acc_change_pt=dict(zip(fr, k["acc_change_pt"].round(2), strict=True))))
    return out
