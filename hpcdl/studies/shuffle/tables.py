"""Tables stage of the shuffle study: raw/ -> tables/ (docs/architecture.md, "Stages").

raw/ (written by tasks/shuffle.py): epochs.csv (point x run x epoch x rank), points.csv (status per point).
tables/: epochs.csv (point x run x epoch, ranks combined; the global baseline copied into both
partitionings), final.csv (point x run: last-epoch accuracy, times, bytes, samples held: distinct ids
and rows, each beside its own bound), gap.csv (accuracy gap to
global per partitioning, M and Q, paired by seed, with its interval), recovery.csv (the smallest Q
within tolerance of global per partitioning and M), kakurenbo_rounds.csv (each hiding fraction F
against F = 0 of the same interleaved round: time, work skipped, overhead) and kakurenbo.csv (the
rounds summarised with intervals). epochs.csv and final.csv name what each row was measured on: its
ranks' device (placement) and where their samples were held (`exchange_device`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import CONFIDENCE, StudyDir, mean_interval, read_table, started_at, write_table
from hpcdl.studies.shuffle.compute import SAMPLE_BYTES
from hpcdl.studies.shuffle.exchange_plan import exchange_count
from hpcdl.studies.shuffle.sweep import WARMUP_ROUND

PARTITIONINGS = ("random", "skewed")


def label(strategy: str, q: float) -> str:
    return strategy if strategy != "partial" else f"partial-{q:g}"


# What a row was measured on (hpcdl.studies.shuffle.train: the rank's placement, where its samples sat).
DEVICE_COLUMNS = ("device", "exchange_device")


def _distinct(values: pd.Series) -> str:
    """The ranks' devices of one row, each once (two ranks on two GPUs: "cuda:0 (nccl); cuda:1 (nccl)")."""
    return "; ".join(sorted({str(v) for v in values}))


def epoch_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Ranks combined: accuracy is the same on every rank; volumes summed; times averaged."""
    # raw tables written before rows named their device say so rather than guess
    raw = raw.assign(**{c: "not recorded" for c in DEVICE_COLUMNS if c not in raw.columns})
    keys = ["point", "strategy", "q", "partitioning", "world_size", "seed", "kakurenbo_fraction", "round",
            "slot", "epoch"]
    agg = raw.groupby(keys, sort=False).agg(
        val_acc=("val_acc", "mean"), val_loss=("val_loss", "mean"), train_loss=("train_loss", "mean"),
        samples_sent=("samples_sent", "sum"), samples_recv=("samples_recv", "sum"),
        bytes_sent=("bytes_sent", "sum"), bytes_recv=("bytes_recv", "sum"),
        exchange_s=("exchange_s", "mean"), exposed_exchange_s=("exposed_exchange_s", "mean"),
        load_s=("load_s", "mean"), fwd_bwd_s=("fwd_bwd_s", "mean"), update_s=("update_s", "mean"),
        hidden_forward_s=("hidden_forward_s", "mean"), record_s=("record_s", "mean"),
        select_s=("select_s", "mean"), compute_s=("compute_s", "mean"),
        epoch_s=("epoch_s", "mean"), samples_held_max=("samples_held", "max"),
        held_rows_max=("held_rows", "max"),
        samples_trained=("samples_trained", "sum"), hidden=("hidden", "max"),
        moved_back=("moved_back", "max"), n_train=("n_train", "max"),
        partition_skew_tv=("partition_skew_tv", "mean"),
        device=("device", _distinct), exchange_device=("exchange_device", _distinct),
    ).reset_index()
    agg["label"] = [label(s, q) for s, q in zip(agg["strategy"], agg["q"], strict=True)]
    # the global baseline does not depend on the partitioning: show it in both panels
    shared = agg[agg["partitioning"].eq("shared")]
    parts = [agg[~agg["partitioning"].eq("shared")]]
    parts += [shared.assign(partitioning=p) for p in PARTITIONINGS]
    return pd.concat(parts, ignore_index=True)


RUN = ["point", "partitioning", "seed", "kakurenbo_fraction", "round", "slot"]


def final_table(epochs: pd.DataFrame, n_train: int) -> pd.DataFrame:
    """One row per run of a point: last-epoch accuracy, time and volume totals."""
    last = epochs.sort_values("epoch").groupby(RUN, sort=False).tail(1)
    e = epochs.assign(skipped_fraction=epochs["hidden"] / n_train,
                      train_compute_s=epochs["fwd_bwd_s"] + epochs["update_s"],
                      overhead_s=epochs["record_s"] + epochs["select_s"] + epochs["hidden_forward_s"])
    totals = e.groupby(RUN, sort=False).agg(
        train_time_s=("epoch_s", "sum"), epoch_time_s=("epoch_s", "mean"),
        bytes_per_epoch=("bytes_sent", "mean"), samples_per_epoch=("samples_sent", "mean"),
        exchange_s=("exchange_s", "mean"), exposed_exchange_s=("exposed_exchange_s", "mean"),
        load_s=("load_s", "mean"), fwd_bwd_s=("fwd_bwd_s", "mean"), update_s=("update_s", "mean"),
        train_compute_total_s=("train_compute_s", "sum"), overhead_total_s=("overhead_s", "sum"),
        skipped_fraction=("skipped_fraction", "mean"),
        samples_held_max=("samples_held_max", "max"), held_rows_max=("held_rows_max", "max")).reset_index()
    out = last[["point", "strategy", "q", "label", "partitioning", "world_size", "seed", "kakurenbo_fraction",
                "round", "slot", "val_acc", "train_loss", *DEVICE_COLUMNS]].rename(
        columns={"val_acc": "final_val_acc"})
    out = out.merge(totals, on=RUN)
    out["expected_bytes_per_epoch"] = [
        exchange_count(n_train, int(m), q) * int(m) * SAMPLE_BYTES if s == "partial" else 0
        for s, q, m in zip(out["strategy"], out["q"], out["world_size"], strict=True)]
    m = out["world_size"]
    # samples_held_max counts distinct ids against (1+Q) N/M; held_rows_max counts rows, which also hold
    # the staged copies of the Q N/M sent samples, against (1+2Q) N/M (N/M rounded up)
    out["held_distinct_bound"] = np.ceil(n_train / m) + out["q"] * n_train / m
    out["held_rows_bound"] = np.ceil(n_train / m) + 2 * out["q"] * n_train / m
    return out.reset_index(drop=True)


def _frame(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """A table with its columns even when the config gives it no rows (a header-only CSV reads back)."""
    return pd.DataFrame(rows, columns=columns) if rows else pd.DataFrame(columns=columns)


def _interval_columns(values: list[float], prefix: str) -> dict:
    if len(values) < 2:
        return {f"{prefix}_mean": float(np.mean(values)) if values else np.nan,
                f"{prefix}_low": np.nan, f"{prefix}_high": np.nan}
    iv = mean_interval(values)
    return {f"{prefix}_mean": iv.mean, f"{prefix}_low": iv.low, f"{prefix}_high": iv.high}


def plain_runs(final: pd.DataFrame) -> pd.DataFrame:
    """Runs of the sweep points (not the KAKURENBO point, whose F = 0 runs are its own baseline)."""
    return final[~final["point"].str.startswith("kakurenbo-")]


def gap_table(final: pd.DataFrame) -> pd.DataFrame:
    """Per partitioning, M and strategy/Q: final accuracy minus global's, paired by seed (pt)."""
    plain = plain_runs(final)
    rows = []
    for (part, m), g in plain.groupby(["partitioning", "world_size"]):
        glob = g[g["strategy"].eq("global")].set_index("seed")["final_val_acc"]
        for (lbl, q), h in g[~g["strategy"].eq("global")].groupby(["label", "q"]):
            acc = h.set_index("seed")["final_val_acc"]
            seeds = [s for s in acc.index if s in glob.index]
            gaps = [100 * (acc[s] - glob[s]) for s in seeds]
            rows.append({"partitioning": part, "world_size": m, "label": lbl, "q": q, "seeds": len(seeds),
                         "gap_pt_per_seed": ";".join(f"{s}:{v:.2f}"
                                                     for s, v in zip(seeds, gaps, strict=True)),
                         **_interval_columns(gaps, "gap_pt"), "confidence": CONFIDENCE})
    return _frame(rows, ["partitioning", "world_size", "label", "q", "seeds", "gap_pt_per_seed",
                         "gap_pt_mean", "gap_pt_low", "gap_pt_high", "confidence"])


def recovery_table(gap: pd.DataFrame, tolerance_pt: float) -> pd.DataFrame:
    """Per partitioning and M: the smallest swept Q whose mean gap to global is within tolerance, and
    whether its interval confirms it (lower end above -tolerance; seeds < 2: not judged)."""
    rows = []
    for (part, m), g in (gap.groupby(["partitioning", "world_size"]) if not gap.empty else []):
        g = g.sort_values("q")
        within = g[g["gap_pt_mean"] >= -tolerance_pt]
        first = within.iloc[0] if not within.empty else None
        rows.append({"partitioning": part, "world_size": m, "tolerance_pt": tolerance_pt,
                     "q_recovers": float(first["q"]) if first is not None else np.nan,
                     "seeds": int(first["seeds"]) if first is not None else 0,
                     "interval_confirms": (bool(first["gap_pt_low"] > -tolerance_pt)
                                           if first is not None and first["seeds"] >= 2 else None),
                     "qs_swept": ";".join(f"{q:g}" for q in g["q"])})
    return _frame(rows, ["partitioning", "world_size", "tolerance_pt", "q_recovers", "seeds",
                         "interval_confirms", "qs_swept"])


def kakurenbo_rounds(final: pd.DataFrame) -> pd.DataFrame:
    """Each F > 0 of the KAKURENBO point against the two F = 0 runs bracketing it in its round (same
    seed, seconds apart): time against their mean, accuracy against the first (the same training)."""
    k = final[final["point"].str.startswith("kakurenbo-") & final["partitioning"].eq("random")
              & final["round"].ne(WARMUP_ROUND)]
    base = k[k["kakurenbo_fraction"].eq(0)].sort_values("slot")
    rows = []
    for _, r in k[k["kakurenbo_fraction"].gt(0)].iterrows():
        b = base[base["round"].eq(r["round"])]
        if len(b) < 2:
            continue
        t0 = float(b["train_time_s"].mean())
        c0 = float(b["train_compute_total_s"].mean())
        rows.append({"kakurenbo_fraction": r["kakurenbo_fraction"], "round": int(r["round"]),
                     "seed": int(r["seed"]), "world_size": int(r["world_size"]),
                     "train_time_s": r["train_time_s"], "baseline_time_s": t0,
                     # the two F = 0 runs of the round against each other: the noise of a pair
                     "baseline_pair_change": float(b["train_time_s"].iloc[-1]
                                                   / b["train_time_s"].iloc[0] - 1),
                     "time_saving": 1 - r["train_time_s"] / t0,
                     "acc_change_pt": 100 * (r["final_val_acc"] - b["final_val_acc"].iloc[0]),
                     "skipped_fraction": r["skipped_fraction"],
                     # the backward work hidden samples skip, at F = 0's measured cost per sample
                     "work_saved": r["skipped_fraction"] * c0 / t0,
                     "compute_saved": (c0 - r["train_compute_total_s"]) / t0,
                     "overhead": r["overhead_total_s"] / t0})
    return _frame(rows, ["kakurenbo_fraction", "round", "seed", "world_size", "train_time_s",
                         "baseline_time_s", "baseline_pair_change", "time_saving", "acc_change_pt",
                         "skipped_fraction", "work_saved", "compute_saved", "overhead"])


def timing_resolution(rounds: pd.DataFrame) -> float:
    """The smallest time saving (fraction of F = 0's time) this run's rounds resolve: the 95 % interval
    half-width of the two F = 0 runs of each round against each other, a pair with nothing to find."""
    pairs = rounds.drop_duplicates("round")["baseline_pair_change"]
    if len(pairs) < 2:
        return float("nan")
    iv = mean_interval(pairs)
    return float(iv.high - iv.mean)


def in_regime(net_saving_low: float, min_net_saving: float) -> bool:
    """Whether F is in the method's regime at this scale: by the method's own account (the work its
    hidden samples skip, less the overhead it adds, both timed apart from the wall time), it saves at
    least `min_net_saving` of F = 0's time, the low end of the 95 % interval over rounds above that
    line (NaN, fewer than two rounds: not in it). The account is per sample and per phase, so it does
    not move with the wall time's noise; whether the saving reaches the wall time is the claim's
    question, asked at every F (the regime is shown beside it and gates nothing)."""
    return bool(np.isfinite(net_saving_low) and net_saving_low >= min_net_saving)


def kakurenbo_table(rounds: pd.DataFrame, min_net_saving: float) -> pd.DataFrame:
    """Per F: the rounds summarised, the net saving the method accounts for (work saved less
    overhead, with its interval), whether F is in the method's regime (`in_regime`), and the timing
    resolution of the run (from the F = 0 runs' spread), a diagnostic shown beside the verdict."""
    rows = []
    res = timing_resolution(rounds) if not rounds.empty else float("nan")
    for f, g in rounds.groupby("kakurenbo_fraction"):
        net = _interval_columns(list(g["work_saved"] - g["overhead"]), "net_saving")
        rows.append({"kakurenbo_fraction": f, "rounds": len(g), **net, "min_net_saving": min_net_saving,
                     "in_regime": in_regime(net["net_saving_low"], min_net_saving),
                     "timing_resolution": res,
                     **_interval_columns(list(g["time_saving"]), "time_saving"),
                     **_interval_columns(list(g["acc_change_pt"]), "acc_change_pt"),
                     "skipped_fraction": g["skipped_fraction"].mean(), "work_saved": g["work_saved"].mean(),
                     "compute_saved": g["compute_saved"].mean(), "overhead": g["overhead"].mean(),
                     "confidence": CONFIDENCE})
    return _frame(rows, ["kakurenbo_fraction", "rounds", "net_saving_mean", "net_saving_low",
                         "net_saving_high", "min_net_saving", "in_regime", "timing_resolution",
                         "time_saving_mean", "time_saving_low", "time_saving_high", "acc_change_pt_mean",
                         "acc_change_pt_low", "acc_change_pt_high", "skipped_fraction", "work_saved",
                         "compute_saved", "overhead", "confidence"])


def write(cfg: dict, study_dir: Path) -> None:
    run = StudyDir(study_dir)
    block = cfg["shuffle"]
    raw = read_table(run.raw_table("epochs"))
    started = started_at(study_dir, "epochs")
    if raw.empty:
        raise ValueError(f"{run.raw_table('epochs')} has no rows: every sweep point failed "
                         f"(see {run.raw_table('points')})")
    epochs = epoch_table(raw)
    final = final_table(epochs, block["n_train"])
    write_table(epochs, run.table("epochs"), cfg, started)
    write_table(final, run.table("final"), cfg, started)
    gap = gap_table(final)
    write_table(gap, run.table("gap"), cfg, started)
    write_table(recovery_table(gap, block["tolerance_pt"]), run.table("recovery"), cfg, started)
    rounds = kakurenbo_rounds(final)
    write_table(rounds, run.table("kakurenbo_rounds"), cfg, started)
    write_table(kakurenbo_table(rounds, block["kakurenbo"]["min_net_saving"]), run.table("kakurenbo"), cfg,
                started)
