"""Tables, figures and claims of the shuffle study (used by `python -m hpcdl.platform.cli <step> shuffle`).

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

from hpcdl.platform.claims import claim, every, not_measured
from hpcdl.platform.results import read_table, save_figure, write_table
from hpcdl.studies.shuffle.plan import exchange_count
from hpcdl.studies.shuffle.run import SAMPLE_BYTES
from hpcdl.studies.shuffle.sweep import expand

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
        held_rows_max=("held_rows", "max"),
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
        samples_held_max=("samples_held_max", "max"), held_rows_max=("held_rows_max", "max")).reset_index()
    out = last[["point", "strategy", "q", "label", "partitioning", "world_size", "seed", "kakurenbo_fraction",
                "val_acc", "train_loss"]].rename(columns={"val_acc": "final_val_acc"})
    out = out.merge(totals, on=["point", "partitioning"])
    out["expected_bytes_per_epoch"] = [
        exchange_count(n_train, int(m), q) * int(m) * SAMPLE_BYTES if s == "partial" else 0
        for s, q, m in zip(out["strategy"], out["q"], out["world_size"], strict=True)]
    m = out["world_size"]
    out["held_bound"] = np.ceil(n_train / m) + out["q"] * n_train / m   # (1+Q) N/M, N/M rounded up
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

CLAIMS = ("random_local_partial_match_global_M{M}", "skewed_partial_recovers_global_M{M}",
          "bytes_per_epoch_equal_QN", "held_at_most_1_plus_Q_N_over_M", "kakurenbo_saves_time")
CLAIM_Q = 0.1  # the papers' partial-Q headline


def _acc(final: pd.DataFrame, part: str, m: int, label: str) -> float | None:
    g = final[final["partitioning"].eq(part) & final["world_size"].eq(m) & final["label"].eq(label)
              & final["kakurenbo_fraction"].eq(0)]
    return float(g["final_val_acc"].mean()) if not g.empty and g["final_val_acc"].notna().all() else None


def _pt(x):
    return None if x is None else round(100 * x, 2)


def _table(path: Path) -> pd.DataFrame:
    """A table, or an empty one where an earlier step wrote none (its claims are then not measured)."""
    try:
        return read_table(path)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()


class _Points:
    """The sweep points the config asks for, and why one has no result (failed, absent)."""

    def __init__(self, block: dict, status: pd.DataFrame, final: pd.DataFrame):
        self.expected = {p["point"]: p for p in expand(block)}
        self.status = status.set_index("point") if "point" in status else pd.DataFrame()
        self.measured = set(final["point"]) if "point" in final else set()

    def find(self, strategy: str, q: float, partitioning: str, m: int, f: float = 0.0) -> list[str]:
        part = "shared" if strategy == "global" else partitioning
        return [pid for pid, p in self.expected.items()
                if (p["strategy"], p["q"], p["partitioning"], p["world_size"], p["kakurenbo_fraction"])
                == (strategy, float(q), part, int(m), float(f))]

    def missing(self, pids: list[str], what: str) -> list[str]:
        """Reasons the points have no result; `what` names the input when the config has none."""
        if not pids:
            return [f"the config runs no {what} point"]
        out = []
        for pid in pids:
            if pid in self.measured:
                continue
            if pid in self.status.index and self.status.loc[pid, "status"] == "failed":
                err = [ln for ln in str(self.status.loc[pid, "error"]).strip().splitlines() if ln.strip()]
                out.append(f"point {pid} failed: {(err or ['no error text'])[-1][:300]}")
            else:
                out.append(f"point {pid} has no result")
        return out


def claims(cfg: dict, study_dir: Path) -> list[dict]:
    study_dir = Path(study_dir)
    block = cfg["shuffle"]
    final = _table(study_dir / "tables" / "final.csv")
    epochs = _table(study_dir / "tables" / "epochs.csv")
    pts = _Points(block, _table(study_dir / "raw" / "points.csv"), final)
    sizes = sorted({m for g in block["grids"] for m in g["world_sizes"]})
    out = []
    for m in sizes:
        out += [_claim_random(block, final, pts, m), _claim_skewed(block, final, pts, m)]
    out += [_claim_bytes(block, epochs, pts), _claim_held(block, final, pts),
            _claim_kakurenbo(block, final, pts)]
    return out


def _three(block: dict, final: pd.DataFrame, pts: _Points, part: str, m: int) -> tuple[dict, list[str]]:
    """Final accuracy (pt) of global, local and partial-0.1 at (partitioning, M), and what is missing."""
    want = {"global": ("global", 1.0), "local": ("local", 0.0), "partial_0_1": ("partial", CLAIM_Q)}
    acc, missing = {}, []
    for key, (strategy, q) in want.items():
        why = pts.missing(pts.find(strategy, q, part, m), f"{_label(strategy, q)} {part} M={m}")
        a = None if final.empty else _acc(final, part, m, _label(strategy, q))
        if why or a is None:
            missing += why or [f"{_label(strategy, q)} {part} M={m} has no final accuracy"]
        else:
            acc[f"{key}_pt"] = _pt(a)
    return acc, missing


def _claim_random(block: dict, final: pd.DataFrame, pts: _Points, m: int) -> dict:
    tol = block["tolerance_pt"]
    cid = f"random_local_partial_match_global_M{m}"
    statement = (f"Random partitioning, M={m}: local and partial-{CLAIM_Q:g} shuffling reach a final "
                 f"validation accuracy no more than {tol:g} pt below global shuffling.")
    acc, missing = _three(block, final, pts, "random", m)
    if missing:
        return not_measured(cid, statement, missing, **acc, tolerance_pt=tol)
    ok = acc["local_pt"] >= acc["global_pt"] - tol and acc["partial_0_1_pt"] >= acc["global_pt"] - tol
    return claim(cid, statement, ok, **acc, tolerance_pt=tol)


def _claim_skewed(block: dict, final: pd.DataFrame, pts: _Points, m: int) -> dict:
    tol = block["tolerance_pt"]
    cid = f"skewed_partial_recovers_global_M{m}"
    statement = (f"Label-skewed partitioning (Dirichlet alpha={block['alpha']:g}), M={m}: "
                 f"partial-{CLAIM_Q:g} is no more than {tol:g} pt below global, while local is more than "
                 "that below global.")
    acc, missing = _three(block, final, pts, "skewed", m)
    if missing:
        return not_measured(cid, statement, missing, **acc, tolerance_pt=tol)
    ok = acc["partial_0_1_pt"] >= acc["global_pt"] - tol and acc["local_pt"] < acc["global_pt"] - tol
    return claim(cid, statement, ok, **acc, tolerance_pt=tol)


def _partial_points(pts: _Points) -> list[str]:
    return [pid for pid, p in pts.expected.items() if p["strategy"] == "partial"]


def _claim_bytes(block: dict, epochs: pd.DataFrame, pts: _Points) -> dict:
    n, n_epochs = block["n_train"], block["epochs"]
    statement = (f"Partial-Q exchange moves exactly Q*N samples ({SAMPLE_BYTES} bytes each: image, label, "
                 "id) per epoch, summed over ranks and counted from the tensors sent and received, in every "
                 f"epoch of every partial point (N={n}).")
    holds, missing, deviation = {}, {}, {}
    for pid in _partial_points(pts):
        why = pts.missing([pid], "partial")
        e = epochs[epochs["point"] == pid] if "point" in epochs else epochs
        if why or len(e) < n_epochs:
            missing[pid] = "; ".join(why) or f"{len(e)} of {n_epochs} epochs recorded"
            continue
        expect_bytes = e["q"] * n * SAMPLE_BYTES
        dev = max((e["bytes_sent"] - expect_bytes).abs().max(), (e["bytes_recv"] - expect_bytes).abs().max())
        deviation[pid] = float(dev)
        holds[pid] = bool(dev == 0 and (e["samples_sent"] == e["q"] * n).all())
    if not holds and not missing:
        return not_measured("bytes_per_epoch_equal_QN", statement, "the config runs no partial point (0<Q<1)")
    return every("bytes_per_epoch_equal_QN", statement, holds, missing, max_abs_deviation_bytes=deviation,
                 threshold_bytes=0)


def _claim_held(block: dict, final: pd.DataFrame, pts: _Points) -> dict:
    n = block["n_train"]
    cid = "held_at_most_1_plus_Q_N_over_M"
    statement = ("No rank ever holds more than (1+Q)*N/M distinct samples (N/M rounded up for uneven N), "
                 "counted from its buffers at the peak of each epoch: its partition, the staged sent samples "
                 "and the received ones.")
    holds, missing, held, bound, rows = {}, {}, {}, {}, {}
    for pid in _partial_points(pts):
        p = pts.expected[pid]
        why = pts.missing([pid], "partial")
        f = final[final["point"] == pid] if "point" in final else final
        if why or f.empty or "samples_held_max" not in f or f["samples_held_max"].isna().any():
            missing[pid] = "; ".join(why) or "no samples_held measurement"
            continue
        m = p["world_size"]
        bound[pid] = float(np.ceil(n / m) + p["q"] * n / m)
        held[pid] = int(f["samples_held_max"].max())
        if "held_rows_max" in f:
            rows[pid] = int(f["held_rows_max"].max())
        holds[pid] = held[pid] <= bound[pid]
    if not holds and not missing:
        return not_measured(cid, statement, "the config runs no partial point (0<Q<1)")
    return every(cid, statement, holds, missing, samples_held_max=held, bound=bound,
                 buffer_rows_max=rows)


def _claim_kakurenbo(block: dict, final: pd.DataFrame, pts: _Points) -> dict:
    tol = block["tolerance_pt"]
    kk = block["kakurenbo"]
    m = kk["world_size"]
    fractions = sorted(f for f in kk["fractions"] if f > 0)
    cid = "kakurenbo_saves_time"
    statement = (f"KAKURENBO saves training time at no more than {tol:g} pt accuracy loss vs F=0, M={m}, for "
                 f"every configured hiding fraction F in {fractions}.")
    if not fractions:
        return not_measured(cid, statement, "the config runs no hiding fraction F > 0", tolerance_pt=tol)
    base_why = pts.missing(pts.find("global", 1.0, "shared", m, 0.0), f"global M={m} F=0 baseline")
    k = kakurenbo_table(final, m) if not final.empty else pd.DataFrame()
    if base_why or "time_saving" not in k:
        return not_measured(cid, statement, base_why or [f"the F=0 baseline at M={m} has no result"],
                            tolerance_pt=tol)
    holds, missing, saving, change = {}, {}, {}, {}
    for f in fractions:
        why = pts.missing(pts.find("global", 1.0, "shared", m, f), f"F={f:g}")
        row = k[np.isclose(k["kakurenbo_fraction"], f)]
        if why or row.empty:
            missing[f"F={f:g}"] = "; ".join(why) or "no result"
            continue
        saving[f"F={f:g}"] = round(float(row["time_saving"].iloc[0]), 4)
        change[f"F={f:g}"] = round(float(row["acc_change_pt"].iloc[0]), 2)
        holds[f"F={f:g}"] = saving[f"F={f:g}"] > 0 and change[f"F={f:g}"] >= -tol
    return every(cid, statement, holds, missing, time_saving=saving, acc_change_pt=change, tolerance_pt=tol,
                 min_time_saving=0)
