"""Tables stage of the shuffle study: raw/ -> tables/ (docs/architecture.md, "Stages").

raw/ (written by tasks/shuffle.py): epochs.csv (point x epoch x rank), points.csv (status per point).
tables/: epochs.csv (point x epoch, ranks combined; the global baseline copied into both
partitionings), final.csv (point: last-epoch accuracy, times, bytes), kakurenbo.csv.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform.results import read_table, write_table
from hpcdl.platform.stages import started_at
from hpcdl.studies.shuffle.compute import SAMPLE_BYTES
from hpcdl.studies.shuffle.exchange_plan import exchange_count

PARTITIONINGS = ("random", "skewed")


def label(strategy: str, q: float) -> str:
    return strategy if strategy != "partial" else f"partial-{q:g}"


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
    agg["label"] = [label(s, q) for s, q in zip(agg["strategy"], agg["q"], strict=True)]
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


def write(cfg: dict, study_dir: Path) -> None:
    study_dir = Path(study_dir)
    block = cfg["shuffle"]
    raw = read_table(study_dir / "raw" / "epochs.csv")
    started = started_at(study_dir, "epochs")
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
