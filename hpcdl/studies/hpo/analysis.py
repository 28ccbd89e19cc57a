"""Tables, figures and claims of the HPO study (used by `python -m hpcdl.platform.cli <step> hpo`).

raw/ (written by tasks/hpo.py from the journal): trials.csv, intermediate.csv, studies.csv.
tables/: trials, intermediate, best_so_far, grid_scaling, best_config, pruning.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform.claims import claim, not_measured
from hpcdl.studies.hpo.plan import grid_size, pruning_baseline
from hpcdl.platform.results import mark_no_data, read_table, save_figure, write_table

SPEEDUP_EFFICIENCY = 0.8  # 2 workers >= 1.6x faster than 1
BEST_TEST_ACC = 0.85
PRUNING_SAVING = 0.30
PRUNING_MAX_LOSS = 0.01  # 1 accuracy point


def _started(study_dir: Path) -> float:
    import json

    prov = Path(study_dir) / "raw" / "trials.provenance.json"
    try:
        return pd.Timestamp(json.loads(prov.read_text())["start_time"]).timestamp()
    except (OSError, KeyError, ValueError):
        return pd.Timestamp.now().timestamp()


# ---------------------------------------------------------------------------------------- tables
def best_so_far(trials: pd.DataFrame) -> pd.DataFrame:
    """Per study, after each finished trial (in completion order): best validation accuracy so far."""
    rows = []
    for study, g in trials[trials["counted"]].groupby("study", sort=False):
        best = -np.inf
        for _, t in g.sort_values("end_s").iterrows():
            if t["state"] == "COMPLETE" and pd.notna(t["val_acc"]):
                best = max(best, float(t["val_acc"]))
            rows.append({"study": study, "sampler": t["sampler"], "pruner": t["pruner"], "trial": t["trial"],
                         "time_s": t["end_s"], "best_val_acc": best if np.isfinite(best) else np.nan})
    return pd.DataFrame(rows, columns=["study", "sampler", "pruner", "trial", "time_s", "best_val_acc"])


def grid_scaling(studies: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Elapsed time of the grid per worker count, and the speedup split into its two factors:
    busy_workers (sum of the trials' training time / wall time: how well the workers are kept
    busy) and the trials' own mean training time (the same 27 trials can train at a different
    speed when another process shares the machine): speedup = busy ratio x train-time ratio."""
    g = studies[studies["kind"].eq("grid") & studies["pruner"].eq("none")].sort_values("workers")
    cols = ["study", "workers", "n_trials", "elapsed_s", "trials_per_min", "speedup", "efficiency",
            "train_time_s", "mean_trial_train_s", "busy_workers", "sessions"]
    if g.empty:
        return pd.DataFrame(columns=cols)
    train = trials.groupby("study")["train_time_s"].sum(min_count=1)
    base = g.iloc[0]
    out = pd.DataFrame({
        "study": g["study"], "workers": g["workers"], "n_trials": g["n_finished"],
        "elapsed_s": g["elapsed_s"],
        "trials_per_min": g["n_finished"] / g["elapsed_s"] * 60.0,
        "speedup": base["elapsed_s"] / g["elapsed_s"],
        "train_time_s": g["study"].map(train),
        "sessions": g["sessions"]})
    out["efficiency"] = out["speedup"] / (out["workers"] / base["workers"])
    out["mean_trial_train_s"] = out["train_time_s"] / out["n_trials"]
    out["busy_workers"] = out["train_time_s"] / out["elapsed_s"]
    return out[cols].reset_index(drop=True)


def best_config(studies: pd.DataFrame) -> pd.DataFrame:
    cols = ["study", "best_trial", "best_val_acc", "best_test_acc"] + [
        c for c in studies.columns if c.startswith("best_") and c not in
        ("best_trial", "best_val_acc", "best_test_acc")]
    out = studies[cols].rename(columns=lambda c: c.removeprefix("best_") if c not in cols[:4] else c)
    out = out.rename(columns={"best_trial": "trial", "best_val_acc": "val_acc", "best_test_acc": "test_acc"})
    overall = out["val_acc"].idxmax() if out["val_acc"].notna().any() else None
    out["overall_best"] = out.index == overall
    return out.reset_index(drop=True)


def pruning_table(hpo: dict, studies: pd.DataFrame) -> pd.DataFrame:
    pair = pruning_baseline(hpo)
    cols = ["baseline", "pruned", "baseline_trial_epochs", "pruned_trial_epochs", "saving_fraction",
            "baseline_best_val_acc", "pruned_best_val_acc", "loss_pts", "n_pruned"]
    if pair is None or not set(pair) <= set(studies["study"]):
        return pd.DataFrame(columns=cols)
    b = studies.set_index("study").loc[pair[0]]
    p = studies.set_index("study").loc[pair[1]]
    return pd.DataFrame([{
        "baseline": pair[0], "pruned": pair[1], "baseline_trial_epochs": b["trial_epochs"],
        "pruned_trial_epochs": p["trial_epochs"],
        "saving_fraction": 1.0 - p["trial_epochs"] / b["trial_epochs"] if b["trial_epochs"] else np.nan,
        "baseline_best_val_acc": b["best_val_acc"], "pruned_best_val_acc": p["best_val_acc"],
        "loss_pts": 100.0 * (b["best_val_acc"] - p["best_val_acc"]), "n_pruned": p["n_pruned"]}],
        columns=cols)


def aggregate(cfg: dict, study_dir: Path) -> None:
    study_dir = Path(study_dir)
    started = _started(study_dir)
    trials = read_table(study_dir / "raw" / "trials.csv")
    studies = read_table(study_dir / "raw" / "studies.csv")
    tables = study_dir / "tables"
    write_table(trials, tables / "trials.csv", cfg, started)
    write_table(read_table(study_dir / "raw" / "intermediate.csv"), tables / "intermediate.csv", cfg, started)
    write_table(best_so_far(trials), tables / "best_so_far.csv", cfg, started)
    write_table(grid_scaling(studies, trials), tables / "grid_scaling.csv", cfg, started)
    write_table(best_config(studies), tables / "best_config.csv", cfg, started)
    write_table(pruning_table(cfg["hpo"], studies), tables / "pruning.csv", cfg, started)


# --------------------------------------------------------------------------------------- figures


def _placeholder(path: Path, title: str, why: str) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.axis("off")
    ax.set_title(title)
    mark_no_data(ax, why)
    save_figure(fig, path)
    plt.close(fig)


def _plot_best_so_far(df: pd.DataFrame, path: Path) -> None:
    import matplotlib.pyplot as plt

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
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.8))
    a1.plot(df["workers"], df["elapsed_s"], "o-")
    a1.set_xlabel("concurrent workers")
    a1.set_ylabel("elapsed time for the grid (s)")
    a1.set_title(f"{int(df['n_trials'].iloc[0])}-point grid")
    a1.set_ylim(bottom=0)
    a2.plot(df["workers"], df["speedup"], "o-", label="measured speedup")
    w = df["workers"].to_numpy(dtype=float)
    # Busy workers isolate the concurrency from the trials' own speed (see grid_scaling).
    a2.plot(w, df["busy_workers"] / df["busy_workers"].iloc[0], "s:",
            label="busy-worker ratio (Σ train time ÷ wall)")
    a2.plot(w, w / w[0], "k--", label="ideal")
    a2.set_xlabel("concurrent workers")
    a2.set_ylabel(f"ratio over {int(w[0])} worker(s) (x)")
    a2.set_title("Grid speedup")
    a2.legend()
    for a in (a1, a2):
        a.set_xticks(df["workers"])
        a.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


OPTUNA_FIGURES = ("optuna_param_importances", "optuna_parallel_coordinate", "optuna_intermediate_values")


def _optuna_figures(cfg: dict, figures: Path) -> None:
    """Optuna's own matplotlib plots: importances and parallel coordinates of the main unpruned
    search, intermediate values of the pruned one (where the pruner's cuts show)."""
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as ovm

    from hpcdl.studies.hpo.storage import journal_path, study_storage

    hpo = cfg["hpo"]
    pair = pruning_baseline(hpo)
    main = pair[0] if pair else hpo["sampler"]
    pruned = pair[1] if pair else main
    has_store = hpo.get("storage_url") or journal_path(cfg).exists()
    storage = study_storage(cfg) if has_store else None
    jobs = {"optuna_param_importances": (main, ovm.plot_param_importances,
                                         ("importance (fraction of val. accuracy variance)", None)),
            "optuna_parallel_coordinate": (main, ovm.plot_parallel_coordinate, (None, None)),
            "optuna_intermediate_values": (pruned, ovm.plot_intermediate_values,
                                           ("epoch (pruner step)", "validation accuracy (fraction)"))}
    for name, (study_name, fn, (xlabel, ylabel)) in jobs.items():
        path = figures / f"{name}.png"
        try:
            if storage is None:
                raise FileNotFoundError(f"no journal at {journal_path(cfg)}")
            study = optuna.load_study(study_name=study_name, storage=storage)
            with warnings.catch_warnings():
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
            plt.close(fig)
        except Exception as exc:  # noqa: BLE001 - e.g. too few complete trials: keep the workflow going
            _placeholder(path, f"{name} ({study_name})", f"not available for this run:\n{exc}")


def plot(cfg: dict, study_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    study_dir = Path(study_dir)
    figures = study_dir / "figures"
    tables = study_dir / "tables"
    bsf = read_table(tables / "best_so_far.csv")
    if bsf["best_val_acc"].notna().any():
        _plot_best_so_far(bsf, figures / "best_so_far.png")
    else:
        _placeholder(figures / "best_so_far.png", "best so far", "no completed trial")
    scaling = read_table(tables / "grid_scaling.csv")
    if len(scaling):
        _plot_scaling(scaling, figures / "grid_scaling.png")
    else:
        _placeholder(figures / "grid_scaling.png", "grid scaling", "no grid study in this config")
    _optuna_figures(cfg, figures)


# ---------------------------------------------------------------------------------------- claims
def _by_workers(scaling: pd.DataFrame, col: str) -> dict:
    return {int(w): round(float(v), 3) for w, v in zip(scaling["workers"], scaling[col], strict=True)}


CLAIMS = ("hpo.grid_speedup", "hpo.best_test_acc", "hpo.pruning")


def claims(cfg: dict, study_dir: Path) -> list[dict]:
    tables = Path(study_dir) / "tables"
    hpo = cfg["hpo"]
    return [_claim_speedup(hpo, read_table(tables / "grid_scaling.csv")),
            _claim_test_acc(read_table(tables / "best_config.csv")),
            _claim_pruning(hpo, read_table(tables / "pruning.csv"))]


def _claim_speedup(hpo: dict, scaling: pd.DataFrame) -> dict:
    cid = "hpo.grid_speedup"
    workers = sorted(set(hpo["grid"]["workers"]))
    n_grid = grid_size(hpo["grid"])
    if len(workers) < 2:
        return not_measured(cid, f"the {n_grid}-point grid is timed on two worker counts",
                            f"hpo.grid.workers is {workers}: the speedup needs two worker counts",
                            threshold_efficiency=SPEEDUP_EFFICIENCY)
    lo, hi = workers[0], workers[-1]
    need = SPEEDUP_EFFICIENCY * hi / lo
    statement = f"{hi} workers finish the {n_grid}-point grid >= {need:.2f}x faster than {lo}"
    rows = {w: scaling[scaling["workers"] == w] for w in (lo, hi)}
    missing = [f"grid-{w}w is not in grid_scaling.csv" if r.empty else
               f"grid-{w}w finished {int(r['n_trials'].iloc[0])}/{n_grid} trials"
               for w, r in rows.items() if r.empty or int(r["n_trials"].iloc[0]) < n_grid]
    evidence = dict(required=round(need, 3), lo_workers=lo, hi_workers=hi,
                    **{col: _by_workers(scaling, col) for col in ("elapsed_s", "busy_workers",
                                                                  "mean_trial_train_s") if col in scaling})
    if missing:
        return not_measured(cid, statement, missing, **evidence)
    speedup = float(rows[lo]["elapsed_s"].iloc[0] / rows[hi]["elapsed_s"].iloc[0])
    return claim(cid, statement, speedup >= need, speedup=round(speedup, 3), **evidence)


def _claim_test_acc(best: pd.DataFrame) -> dict:
    cid = "hpo.best_test_acc"
    statement = f"the best trial's test accuracy >= {BEST_TEST_ACC}"
    overall = best[best["overall_best"].astype(str).str.lower() == "true"] if len(best) else best
    if overall.empty:
        return not_measured(cid, statement, "no study completed a trial (no best trial)",
                            threshold=BEST_TEST_ACC)
    r = overall.iloc[0]
    evidence = dict(study=str(r["study"]), val_acc=float(r["val_acc"]), threshold=BEST_TEST_ACC)
    if pd.isna(r["test_acc"]):
        return not_measured(cid, statement, f"the best trial of study {r['study']} has no test accuracy",
                            **evidence)
    test_acc = float(r["test_acc"])
    return claim(cid, statement, test_acc >= BEST_TEST_ACC, test_acc=test_acc, **evidence)


def _claim_pruning(hpo: dict, pr: pd.DataFrame) -> dict:
    cid = "hpo.pruning"
    thresholds = dict(min_saving_fraction=PRUNING_SAVING, max_loss_pts=100 * PRUNING_MAX_LOSS)
    pair = pruning_baseline(hpo)
    if pair is None:
        return not_measured(cid, "a pruned study saves trial-epochs at little accuracy loss vs its baseline",
                            f"hpo.pruner is {hpo['pruner']!r}: no pruned study to compare", **thresholds)
    statement = (f"{pair[1]} saves >= {PRUNING_SAVING:.0%} of trial-epochs at <= "
                 f"{100 * PRUNING_MAX_LOSS:.0f} pt loss of best validation accuracy vs {pair[0]}")
    if pr.empty or pr[["saving_fraction", "loss_pts"]].isna().any(axis=None):
        return not_measured(cid, statement, f"{pair[0]} or {pair[1]} is missing or has no completed trial",
                            **thresholds)
    r = pr.iloc[0]
    ok = bool(r["saving_fraction"] >= PRUNING_SAVING and r["loss_pts"] <= 100 * PRUNING_MAX_LOSS)
    return claim(cid, statement, ok, saving_fraction=round(float(r["saving_fraction"]), 3),
                 loss_pts=round(float(r["loss_pts"]), 2),
                 trial_epochs={"baseline": int(r["baseline_trial_epochs"]),
                               "pruned": int(r["pruned_trial_epochs"])},
                 **thresholds)
