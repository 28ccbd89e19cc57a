"""HPO study as a PyCOMPSs application: Optuna ask-and-tell here, each trial's epoch chunk a task.

    python -m tasks.hpo --config configs/default.yaml     # local backend
    python -m hpcdl compss command hpo --config FILE    # prints the runcompss command line

Re-running continues the studies in the journal (results/hpo/journal/): finished trials are kept,
trials in flight when a previous driver died are marked FAIL and replaced.

Device: hpo.device is resolved once, here; on cuda every task holds one GPU ($HPCDL_HPO_GPUS, the
GPU processor of its constraint), trains on it with the data loaded to it once per task, and every
trial row names its device and GPU. A grid on w workers then needs w GPUs: on the local backend a
worker count above the GPU pool is refused before anything runs (sweep.check_gpu_workers).
"""

from __future__ import annotations

import os
import sys

import pandas as pd

from hpcdl.common.fashion_mnist import load_split
from hpcdl.platform.task_app import (
    BACKEND,
    POOL_ENV,
    ConfigError,
    compss_wait_on,
    failure_reason,
    gpu_pool,
    set_local_cores,
    start_app,
    study_task,
    units_var,
    write_table,
)
from hpcdl.studies.hpo import compute, driver, records, storage
from hpcdl.studies.hpo.sweep import check_gpu_workers, check_grid_pool, grid_data, plan_studies


@study_task("hpo")
def train_chunk(params, state, data, epochs, seed, fail):
    return compute.run_chunk(params, state, data, epochs, seed, fail)


@study_task("hpo")
def test_accuracy(params, state, data):
    return compute.evaluate_test(params, state, data)


@study_task("hpo", on_failure="FAIL")
def warm_up(data):
    return compute.warm_up(data)


def _test_best(study, best_path, data, n_test: int) -> None:
    """Test accuracy of the study's best trial on its `n_test` images, once (kept in the study so a rerun
    does not redo it; a kept one from before the count was recorded gets it, for its interval)."""
    best = storage.load_best(best_path)
    kept = study.user_attrs.get("test", {})
    if best is not None and kept.get("trial") == best["trial"]:
        if "n" not in kept:
            study.set_user_attr("test", {**kept, "n": n_test})
        return
    if best is None:
        return
    acc = compss_wait_on(test_accuracy(best["params"], best["state"], data))
    if acc is not None:
        study.set_user_attr("test", {"trial": best["trial"], "acc": acc, "n": n_test})


def _run_studies(plans, hpo: dict, store, data, units: int, out, n_test: int) -> list:
    studies = []
    cores = warmed = None
    grid_pool = grid_data(data, hpo["grid"])
    for plan in plans:
        plan_data = grid_pool if plan.kind == "grid" else data
        if plan.workers * units != cores or plan_data != warmed:
            cores, warmed = plan.workers * units, plan_data
            set_local_cores(cores)  # no-op under COMPSs
            # Start the workers (torch import, data read) before the clock of the next study starts.
            compss_wait_on([warm_up(plan_data) for _ in range(plan.workers)])
        study = driver.run_study(plan, hpo, store, plan_data, submit=train_chunk, wait=compss_wait_on,
                                 reason=failure_reason, study_dir=out,
                                 host_load=BACKEND != "compss")
        if plan.repeat == 0:  # a grid's later repeats only time it again: their best trial is not tested
            _test_best(study, storage.best_state_path(out, plan.name), plan_data, n_test)
        studies.append(study)
    return studies


def _refuse(exc: Exception) -> None:
    print(f"error: {exc}", file=sys.stderr)
    raise SystemExit(2) from None


def main(argv=None) -> None:
    run = start_app("hpo", argv, __doc__.splitlines()[0])
    cfg = run.cfg
    hpo = cfg["hpo"]
    units = int(os.environ[units_var("hpo")])  # start_app resolved it (a "$VAR" setting included)
    device = run.device  # resolved once and recorded (start_app has refused cuda without a GPU)
    plans = plan_studies(hpo, BACKEND, device, units)
    try:
        check_grid_pool(hpo)
        if BACKEND == "local" and device == "cuda":  # under COMPSs its own GPU resources bound the workers
            check_gpu_workers(hpo, device, gpu_pool(), POOL_ENV)
    except ConfigError as exc:
        _refuse(exc)
    out, started = run.dir, run.started
    # fail early, with how-to-get, if data is missing; the count is the test accuracy's n (its interval)
    n_test = len(load_split(cfg["data"]["fashion_mnist_dir"], "test")[1])
    n_test = min(n_test, hpo["data"]["test_limit"] or n_test)
    data = compute.DataSpec(cfg["data"]["fashion_mnist_dir"], hpo["data"]["val_fraction"], hpo["seed"],
                            hpo["data"]["train_limit"], hpo["data"]["test_limit"], device)
    store = storage.study_storage(cfg)
    try:
        storage.check_device(store, plans)
    except storage.DeviceMismatch as exc:
        _refuse(exc)
    print(f"[hpo] storage {storage.describe_storage(cfg)}; device {device}", file=sys.stderr, flush=True)
    studies = _run_studies(plans, hpo, store, data, units, out, n_test)
    set_local_cores(None)  # back to every core for whoever runs tasks after us in this process
    raw = out / "raw"
    write_table(pd.DataFrame([r for s in studies for r in records.trial_rows(s)]),
                raw / "trials.csv", cfg, started)
    write_table(pd.DataFrame([r for s in studies for r in records.intermediate_rows(s)]),
                raw / "intermediate.csv", cfg, started)
    write_table(pd.DataFrame([records.study_row(s) for s in studies]), raw / "studies.csv", cfg, started)
    run.write_summary(records.run_counts(studies, since=started))


if __name__ == "__main__":
    main()
