"""Tidy rows from the journal: one per trial, one per intermediate (per-epoch) report, one per study.

Everything comes from the Optuna storage, so trials finished by an earlier (killed) driver are
reported exactly like those of the last run.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from hpcdl.studies.hpo.storage import counted

PARAM_COLUMNS = ("model", "optimizer", "batch_size", "lr", "width", "depth", "dropout", "epochs")


def _params(t: optuna.trial.FrozenTrial) -> dict:
    return {**t.user_attrs.get("fixed_params", {}), **t.params}


def study_origin(study: optuna.Study) -> float | None:
    starts = [t.datetime_start.timestamp() for t in study.get_trials(deepcopy=False) if t.datetime_start]
    return min(starts) if starts else None


def trial_rows(study: optuna.Study) -> list[dict]:
    plan = study.user_attrs.get("plan", {})
    origin = study_origin(study)
    rows = []
    for t in study.get_trials(deepcopy=False):
        params = _params(t)
        epochs = t.user_attrs.get("epochs", [])
        start = t.datetime_start.timestamp() if t.datetime_start else None
        end = t.datetime_complete.timestamp() if t.datetime_complete else None
        workers = sorted({e["worker"] for e in epochs})
        rows.append({
            "study": study.study_name, "sampler": plan.get("sampler"), "pruner": plan.get("pruner"),
            "workers": plan.get("workers"), "repeat": plan.get("repeat", 0),  # the grid's timing repeat
            "trial": t.number, "state": t.state.name,
            "counted": counted(t), "val_acc": t.value if t.state == TrialState.COMPLETE else None,
            "last_val_acc": epochs[-1]["val_acc"] if epochs else None,
            **{f"param_{k}": params.get(k) for k in PARAM_COLUMNS},
            "epochs_trained": len(epochs),
            # the training images its chunks saw (hpo.grid.train_limit may give the grid fewer)
            "train_samples": epochs[-1].get("train_samples") if epochs else None,
            "start_s": None if start is None or origin is None else start - origin,
            "end_s": None if end is None or origin is None else end - origin,
            "duration_s": None if start is None or end is None else end - start,
            "train_time_s": sum(e["epoch_time_s"] for e in epochs),
            "worker": ";".join(workers),  # on cuda each names the GPU its task held
            # where it trained, as its chunks reported it (the plan's device for a trial with none)
            "device": ";".join(sorted({e.get("device", "cpu") for e in epochs})) or plan.get("device", "cpu"),
            "fail_reason": t.user_attrs.get("fail_reason", ""),
            "interrupted": bool(t.user_attrs.get("interrupted", False)),
            "replaces": t.user_attrs.get("replaces"), "driver_pid": t.user_attrs.get("session_pid"),
        })
    return rows


def intermediate_rows(study: optuna.Study) -> list[dict]:
    origin = study_origin(study) or 0.0
    rows = []
    for t in study.get_trials(deepcopy=False):
        for e in t.user_attrs.get("epochs", []):
            rows.append({"study": study.study_name, "trial": t.number, "epoch": e["epoch"],
                         "val_acc": e["val_acc"], "train_loss": e["train_loss"],
                         "epoch_time_s": e["epoch_time_s"], "chunk_end_s": e["chunk_end"] - origin,
                         "worker": e["worker"]})
    return rows


def other_load(sessions: list[dict]) -> float | None:
    """Cores other processes took while the study's driver sessions ran (driver.run_study's HostLoad),
    over all of them; None where a session did not record it (under COMPSs, or an older journal)."""
    loads = [s.get("host_load") for s in sessions]
    if not loads or any(not load for load in loads):
        return None
    wall = sum(load["wall_s"] for load in loads)
    other = sum(max(0.0, load["machine_busy_s"] + load["steal_s"] - load["run_cpu_s"]) for load in loads)
    return other / wall if wall > 0 else None


def study_row(study: optuna.Study) -> dict:
    plan = study.user_attrs.get("plan", {})
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if counted(t)]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    starts = [t.datetime_start.timestamp() for t in done if t.datetime_start]
    ends = [t.datetime_complete.timestamp() for t in done if t.datetime_complete]
    best = max(complete, key=lambda t: t.value) if complete else None
    test = study.user_attrs.get("test", {})
    return {
        "study": study.study_name, "kind": plan.get("kind"), "sampler": plan.get("sampler"),
        "pruner": plan.get("pruner"), "workers": plan.get("workers"),
        # repeat r > 0: a timing repeat of the grid (sweep.plan_studies), its best trial never tested
        "repeat": plan.get("repeat", 0),
        # a worker is a GPU on cuda (one per trial task), a set of cores on the CPU
        "device": plan.get("device", "cpu"), "cores_per_worker": plan.get("units"),
        "n_trials_planned": plan.get("n_trials"),
        "n_finished": len(done), "n_complete": len(complete),
        "n_pruned": sum(t.state == TrialState.PRUNED for t in trials),
        "n_fail": sum(t.state == TrialState.FAIL and counted(t) for t in trials),
        "n_interrupted": sum(bool(t.user_attrs.get("interrupted")) for t in trials),
        "sessions": len(study.user_attrs.get("sessions", [])),
        "other_load_cores": other_load(study.user_attrs.get("sessions", [])),
        "elapsed_s": (max(ends) - min(starts)) if starts and ends else None,
        "trial_epochs": sum(len(t.user_attrs.get("epochs", [])) for t in done),
        "best_trial": best.number if best else None, "best_val_acc": best.value if best else None,
        "best_test_acc": test.get("acc") if best and test.get("trial") == best.number else None,
        # the test images the accuracy was measured on: its interval's n (hpcdl.studies.hpo.claims)
        "best_test_n": test.get("n") if best and test.get("trial") == best.number else None,
        **{f"best_{k}": (_params(best).get(k) if best else None) for k in PARAM_COLUMNS},
    }


def run_counts(studies: list[optuna.Study], since: float) -> dict:
    """Trials as points of this run (raw/run_summary.json): those started at or after `since` ran
    now (ok: complete or pruned; failed), earlier ones were reused from the journal (skipped).
    Trials interrupted by a driver's death are not counted: a replacement stands for each."""
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    for study in studies:
        for t in study.get_trials(deepcopy=False):
            if not counted(t):
                continue
            if t.datetime_start is not None and t.datetime_start.timestamp() < since:
                counts["skipped"] += 1
            else:
                counts["failed" if t.state == TrialState.FAIL else "ok"] += 1
    return {**counts, "total": sum(counts.values())}
