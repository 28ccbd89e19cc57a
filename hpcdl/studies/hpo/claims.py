"""Claims stage of the HPO study: the grid's speedup with more workers, the best trial's test
accuracy, and what pruning saves at what accuracy loss (tables/ -> claims)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hpcdl.platform.claims import claim, not_measured
from hpcdl.platform.results import read_table
from hpcdl.studies.hpo.sweep import grid_size, pruning_baseline

CLAIMS = ("hpo.grid_speedup", "hpo.best_test_acc", "hpo.pruning")
SPEEDUP_EFFICIENCY = 0.8  # 2 workers >= 1.6x faster than 1
BEST_TEST_ACC = 0.85
PRUNING_SAVING = 0.30
PRUNING_MAX_LOSS = 0.01  # 1 accuracy point


def _by_workers(scaling: pd.DataFrame, col: str) -> dict:
    return {int(w): round(float(v), 3) for w, v in zip(scaling["workers"], scaling[col], strict=True)}


def judge(cfg: dict, study_dir: Path) -> list[dict]:
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
