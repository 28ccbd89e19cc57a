"""The HPO task app end to end on the local backend: tables, figures, claims, a failing trial,
SIGKILL of the driver mid-study and resume, and bad input rejected before anything is written."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pandas as pd
import pytest
import yaml
from optuna.trial import TrialState

from hpcdl.platform.kit.config import load_config
from hpcdl.studies.hpo.storage import INTERRUPTED, journal_path, open_storage


def _env():
    return {**os.environ, "HPCDL_PROGRESS": "0", "MPLBACKEND": "Agg"}


def _app_argv(config):
    return [sys.executable, "-m", "tasks.hpo", "--config", str(config)]


def _app(repo, config, timeout=240):
    return subprocess.run(_app_argv(config), cwd=repo, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _hpo(test_config, **changes):
    hpo = copy.deepcopy(test_config["hpo"])
    for k, v in changes.items():
        hpo[k] = {**hpo[k], **v} if isinstance(v, dict) and isinstance(hpo.get(k), dict) else v
    return hpo


@pytest.mark.slow
def test_app_end_to_end_with_a_failing_trial(repo, tmp_path, write_config, test_config):
    # One worker count for the grid and the searches: one process pool for the whole run. On the CPU
    # also on a GPU machine: on cuda a 2-worker grid needs two GPUs (tests/test_hpo_device.py).
    # The grid trains on 400 of the searches' 600 images (hpo.grid.train_limit).
    hpo = _hpo(test_config, grid={"workers": [2], "train_limit": 400}, fail_trials=[1], device="cpu")
    config = write_config(studies=["hpo"], hpo=hpo)
    run = _app(repo, config)
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "results" / "hpo"
    trials = pd.read_csv(out / "raw" / "trials.csv")
    assert set(trials["study"]) == {"grid-2w", "random", "random-median"}
    assert (out / "raw" / "trials.provenance.json").exists()
    # fail_trials=[1]: trial 1 of every study is a FAIL row with its message; the others finished.
    failed = trials[trials["state"] == "FAIL"]
    assert sorted(failed["study"]) == ["grid-2w", "random", "random-median"]
    assert (failed["trial"] == 1).all() and failed["fail_reason"].str.contains("injected failure").all()
    ok = trials[trials["state"] != "FAIL"]
    assert ok["state"].isin(["COMPLETE", "PRUNED"]).all() and len(ok) == 4 - 1 + 2 * (3 - 1)
    assert (trials.loc[trials["state"] == "COMPLETE", "val_acc"].between(0.0, 1.0)).all()
    # the grid's trials trained on its own slice (train_limit less the validation quarter), the
    # searches' on theirs
    trained = ok.groupby("study")["train_samples"].unique().map(list).to_dict()
    assert trained == {"grid-2w": [300], "random": [450], "random-median": [450]}
    # every row says where it ran; no worker names a GPU
    assert (ok["device"] == "cpu").all() and not ok["worker"].str.contains("gpu").any()
    studies = pd.read_csv(out / "raw" / "studies.csv")
    assert (studies["device"] == "cpu").all() and (studies["cores_per_worker"] == 1).all()
    inter = pd.read_csv(out / "raw" / "intermediate.csv")
    assert len(inter) == ok["epochs_trained"].sum()
    # The journal opens with optuna.load_study (what optuna-dashboard does).
    cfg = load_config(config)
    study = optuna.load_study(study_name="random", storage=open_storage(journal_path(cfg)))
    assert len(study.trials) == 3

    for stage in ("tables", "figures", "claims"):
        r = subprocess.run(
            [sys.executable, "-m", "hpcdl", "hpo", stage, "--config", str(config)],
            cwd=repo,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, r.stderr[-3000:]
    for table in ("trials", "intermediate", "best_so_far", "grid_scaling", "best_config", "pruning"):
        assert (out / "tables" / f"{table}.csv").exists()
    scaling = pd.read_csv(out / "tables" / "grid_scaling.csv")
    assert list(scaling[["device", "workers", "cores_per_worker"]].itertuples(index=False, name=None)) == [
        ("cpu", 2, 1)]
    assert scaling["trials_per_min"].iloc[0] == pytest.approx(
        scaling["n_trials"].iloc[0] / scaling["elapsed_s"].iloc[0] * 60)
    assert scaling["train_samples"].tolist() == [300]
    best = pd.read_csv(out / "tables" / "best_config.csv")
    assert best["overall_best"].sum() == 1 and best["test_acc"].between(0.0, 1.0).all()
    # each study's best trial names the test images its accuracy counts: the interval's n
    assert (best.dropna(subset=["test_acc"])["test_n"] == hpo["data"]["test_limit"]).all()
    for fig in (
        "best_so_far",
        "grid_scaling",
        "optuna_param_importances",
        "optuna_parallel_coordinate",
        "optuna_intermediate_values",
    ):
        png = out / "figures" / f"{fig}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    claims = json.loads((out / "claims.json").read_text())
    assert [c["id"] for c in claims["claims"]] == ["hpo.grid_speedup", "hpo.best_test_acc", "hpo.pruning"]
    assert "grid (each trial on 300 training images) is timed" in claims["claims"][0]["statement"]
    acc = claims["claims"][1]
    interval = acc["measured"]["test_acc"]
    assert interval["n"] == hpo["data"]["test_limit"] and interval["ci95"][0] <= interval["mean"]
    assert acc["confirmation"]["seeds"] == [hpo["seed"]] and acc["confirmation"]["key"] == "seed"


def _poll(config, cfg, proc, n_complete, timeout=180):
    path = journal_path(cfg)
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "driver finished before it could be killed"
        if path.exists():
            try:
                study = optuna.load_study(study_name="random", storage=open_storage(path))
                if sum(t.state == TrialState.COMPLETE for t in study.trials) >= n_complete:
                    return
            except KeyError:  # the study is not created yet
                pass
        time.sleep(0.2)
    raise AssertionError("the study did not progress in time")


@pytest.mark.slow
def test_sigkill_driver_mid_study_then_resume(repo, tmp_path, write_config, test_config):
    hpo = _hpo(
        test_config,
        grid={"workers": []},
        compare_samplers=[],
        pruner="none",
        sampler="random",
        n_trials=8,
        max_in_flight=2,
        data={"train_limit": 3000},
        space={"epochs": {"low": 2, "high": 3}},
    )
    config = write_config(studies=["hpo"], hpo=hpo)
    cfg = load_config(config)
    log = open(tmp_path / "driver1.log", "w")
    proc = subprocess.Popen(_app_argv(config), cwd=repo, env=_env(), stdout=log, stderr=log,
                            start_new_session=True)
    try:
        _poll(config, cfg, proc, n_complete=2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its worker processes, nothing else
        proc.wait()
        log.close()
    study = optuna.load_study(study_name="random", storage=open_storage(journal_path(cfg)))
    before = {
        t.number: (t.value, len(t.user_attrs["epochs"]))
        for t in study.trials
        if t.state == TrialState.COMPLETE
    }
    in_flight = [t.number for t in study.trials if t.state == TrialState.RUNNING]
    assert 2 <= len(before) < 8

    run = _app(repo, config)
    assert run.returncode == 0, run.stderr[-3000:]
    study = optuna.load_study(study_name="random", storage=open_storage(journal_path(cfg)))
    trials = {t.number: t for t in study.trials}
    for number, (value, epochs) in before.items():  # kept as they were, not rerun
        t = trials[number]
        assert t.state == TrialState.COMPLETE and t.value == value and len(t.user_attrs["epochs"]) == epochs
        assert t.user_attrs["session_pid"] == proc.pid
    assert not any(t.user_attrs.get("replaces") in before for t in study.trials)
    for number in in_flight:  # marked failed and replaced by a trial with the same params
        assert (
            trials[number].state == TrialState.FAIL
            and trials[number].user_attrs["fail_reason"] == INTERRUPTED
        )
    counted = [t for t in study.trials if t.state != TrialState.FAIL or not t.user_attrs.get("interrupted")]
    assert len(counted) == 8 and all(t.state == TrialState.COMPLETE for t in counted)
    rows = pd.read_csv(tmp_path / "results" / "hpo" / "raw" / "studies.csv")
    assert rows.loc[0, "n_finished"] == 8 and rows.loc[0, "sessions"] == 2
    assert rows.loc[0, "n_interrupted"] == len(in_flight)
    summary = json.loads((tmp_path / "results" / "hpo" / "raw" / "run_summary.json").read_text())
    assert summary == {"ok": 8 - len(before), "failed": 0, "skipped": len(before), "total": 8}


@pytest.mark.parametrize(
    "change, key",
    [
        ({"sampler": "bayes"}, "hpo.sampler"),
        ({"pruner": "early"}, "hpo.pruner"),
        ({"n_trials": 0}, "hpo.n_trials"),
        ({"space": {"width": {"low": 64, "high": 8}}}, "hpo.space.width.low"),
    ],
)
def test_bad_input_rejected_before_anything_is_written(repo, tmp_path, test_config, change, key):
    cfg = copy.deepcopy(test_config)
    cfg["results_dir"] = str(tmp_path / "results")
    cfg["studies"] = ["hpo"]
    cfg["hpo"] = _hpo(test_config, **change)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(cfg))
    if key == "hpo.sampler":  # one real app run; the other cases go through load_config only (fast)
        run = _app(repo, config, timeout=120)
        assert run.returncode == 2 and f"config key '{key}'" in run.stderr
    else:
        with pytest.raises(Exception, match=f"config key '{key}'"):
            load_config(config)
    assert not (tmp_path / "results").exists()
