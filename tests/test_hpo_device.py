"""The HPO study on its device (#25): hpo.device is resolved once in the task app and reaches every
trial's training through DataSpec.device; every task holds one GPU on cuda (the processors
constraint); a grid on w workers needs w GPUs in the local pool; rows, the grid's figure and its
claim say what a worker is. CPU tests cover everything that is not CUDA itself; tests marked `cuda`
train on a real GPU (a second one for the pool test)."""

from __future__ import annotations

import os
import socket

import pandas as pd
import pytest
import torch

from hpcdl.platform.kit.config import ConfigError
from hpcdl.platform.orchestration.task_runtime.gpus import (
    POOL_ENV,
    declared_gpus,
    gpu_pool,
    gpus_var,
    task_gpus,
)
from hpcdl.studies.hpo import claims, compute, driver, records, storage, sweep, tables
from hpcdl.studies.hpo.compute import DataSpec
from hpcdl.studies.hpo.figures import scaling_figure

FMNIST = "/usr/share/datasets/fashion-mnist"
PARAMS = {"model": "mlp", "width": 32, "depth": 1, "dropout": 0.1, "optimizer": "adam", "lr": 1e-3,
          "batch_size": 64, "epochs": 2}


def _tiny(device: str = "cpu") -> DataSpec:
    return DataSpec(FMNIST, val_fraction=0.25, seed=0, train_limit=800, test_limit=200, device=device)


@pytest.fixture
def cfg(study_config):
    return study_config("hpo")


class _Now:
    """The task runtime as plain calls: the real compute, run in this process."""

    @staticmethod
    def submit(params, state, data, epochs, seed, fail):
        return compute.run_chunk(params, state, data, epochs, seed, fail)

    @staticmethod
    def wait(result):
        return result

    @staticmethod
    def reason(result):
        return None


# ---- routing: the device from the config to the rows ----------------------------------------------

def test_hpo_declares_a_cuda_path_and_one_gpu_per_task(cfg):
    from hpcdl.platform.kit.study import spec

    assert spec("hpo").devices == ("cpu", "cuda")
    assert declared_gpus("hpo", cfg) == 1
    assert task_gpus("hpo", cfg, device="cuda") == 1 and task_gpus("hpo", cfg, device="cpu") == 0
    assert task_gpus("hpo", {**cfg, "hpo": {**cfg["hpo"], "device": "cpu"}}) == 0


def test_every_task_holds_its_cores_and_the_gpu_variable():
    from tasks import hpo as app

    for t in (app.train_chunk, app.test_accuracy, app.warm_up):
        assert t.cpu_units == ("$HPCDL_HPO_UNITS",), t.name
        assert t.gpu_units == (f"${gpus_var('hpo')}",), t.name


def test_plans_carry_the_device_and_cores(cfg):
    plans = sweep.plan_studies(cfg["hpo"], "local", "cuda", 3)
    assert plans and {(p.device, p.units) for p in plans} == {("cuda", 3)}
    assert {(p.device, p.units) for p in sweep.plan_studies(cfg["hpo"])} == {("cpu", 1)}
    # the grid's timing repeats run on the GPUs like repeat 0 (and check_gpu_workers reads the same counts)
    hpo = {**cfg["hpo"], "grid": {**cfg["hpo"]["grid"], "repeats": 2}}
    grids = [(p.name, p.repeat, p.device, p.units) for p in sweep.plan_studies(hpo, "local", "cuda", 3)
             if p.kind == "grid"]
    assert grids == [("grid-1w", 0, "cuda", 3), ("grid-1w-r1", 1, "cuda", 3)]


def test_a_cpu_study_records_its_device_in_every_row(cfg, tmp_path):
    plan = sweep.StudyPlan("random", "search", "random", "none", 2, 1, 2, 2, device="cpu", units=1)
    hpo = {**cfg["hpo"], "space": {**cfg["hpo"]["space"], "epochs": {"low": 1, "high": 2}}}
    store = storage.open_storage(tmp_path / "journal.log")
    study = driver.run_study(plan, hpo, store, _tiny(), _Now.submit, _Now.wait, _Now.reason, tmp_path)
    trials = pd.DataFrame(records.trial_rows(study))
    assert list(trials["device"]) == ["cpu", "cpu"] and not trials["worker"].str.contains("gpu").any()
    row = records.study_row(study)
    assert (row["device"], row["cores_per_worker"]) == ("cpu", 1)


def test_a_chunk_on_the_cpu_says_so_and_keeps_its_state_on_the_cpu():
    res = compute.train_chunk(PARAMS, None, _tiny(), 1)
    assert res["device"] == "cpu" and res["worker"] == f"{socket.gethostname()}:{os.getpid()}"
    assert all(v.device.type == "cpu" for v in res["state"]["model"].values())


def test_an_unresolved_device_is_refused():
    with pytest.raises(ValueError, match=r"DataSpec.device must be a resolved device \(cpu or cuda\), "
                                         r"got 'auto'"):
        compute.load_data(_tiny("auto"))


def test_a_journal_from_another_device_is_refused_naming_the_key(cfg, tmp_path):
    store = storage.open_storage(tmp_path / "journal.log")
    on_cpu = sweep.plan_studies(cfg["hpo"], "local", "cpu", 1)
    driver.create_study(on_cpu[0], cfg["hpo"], store)
    storage.check_device(store, on_cpu)  # the same device: continues
    with pytest.raises(storage.DeviceMismatch, match=rf"hpo.device resolves to cuda here, but study "
                                                     rf"'{on_cpu[0].name}' in the journal ran on cpu"):
        storage.check_device(store, sweep.plan_studies(cfg["hpo"], "local", "cuda", 1))


# ---- a grid on w workers needs w GPUs ---------------------------------------------------------------

def test_grid_workers_beyond_the_gpu_pool_are_refused_naming_the_key(cfg):
    hpo = {**cfg["hpo"], "grid": {**cfg["hpo"]["grid"], "workers": [1, 2]}}
    one = gpu_pool({"HPCDL_GPU_POOL": "3"})
    with pytest.raises(ConfigError, match=r"config key 'hpo.grid.workers': \[1, 2\] is not allowed; allowed: "
                                          r"worker counts <= 1: on cuda each concurrent trial holds a GPU of "
                                          r"its own and the local GPU pool has 1 \(3; HPCDL_GPU_POOL"):
        sweep.check_gpu_workers(hpo, "cuda", one, POOL_ENV)
    sweep.check_gpu_workers(hpo, "cuda", gpu_pool({"HPCDL_GPU_POOL": "0,1"}), POOL_ENV)  # two GPUs: fine
    sweep.check_gpu_workers(hpo, "cpu", one, POOL_ENV)  # the CPU has no such rule
    with pytest.raises(ConfigError, match=r"the local GPU pool has 0 \(none;"):
        sweep.check_gpu_workers({**hpo, "grid": {**hpo["grid"], "workers": [1]}}, "cuda",
                                gpu_pool({"HPCDL_GPU_POOL": ""}), POOL_ENV)


# ---- what a worker is, in the table, the figure and the claim ----------------------------------------

def _studies(device: str, units: int = 2) -> pd.DataFrame:
    return pd.DataFrame({"study": ["grid-1w", "grid-2w"], "kind": ["grid", "grid"], "pruner": ["none"] * 2,
                         "workers": [1, 2], "n_finished": [4, 4], "elapsed_s": [12.0, 6.5],
                         "sessions": [1, 1],
                         "device": [device] * 2, "cores_per_worker": [units] * 2})


def _trials() -> pd.DataFrame:
    return pd.DataFrame({"study": ["grid-1w"] * 4 + ["grid-2w"] * 4, "train_time_s": [2.9] * 8})


HPO = {"grid": {"workers": [1, 2], "optimizer": ["adam", "sgd"], "batch_size": [32, 64], "epochs": [1]},
       "pruner": "none", "sampler": "random",
       "claims": {"min_speedup_efficiency": 0.8, "min_best_test_acc": 0.85, "min_pruning_saving": 0.3,
                  "max_pruning_loss_pts": 1.0}}


def test_on_cuda_the_grid_counts_gpus():
    scaling = tables.grid_scaling(_studies("cuda"), _trials())
    assert list(scaling["device"]) == ["cuda", "cuda"]
    assert list(scaling["trials_per_min"]) == pytest.approx([4 / 12.0 * 60, 4 / 6.5 * 60])
    fig = scaling_figure(scaling)
    assert [a.get_xlabel() for a in fig.axes] == ["GPUs (one trial each)"] * 2
    assert fig.axes[1].get_ylabel() == "ratio over 1 GPU(s) (x)"
    assert fig.axes[0].get_title() == "4-point grid on GPUs"
    assert "20.0 trials/min" in [t.get_text() for t in fig.axes[0].texts]
    c = claims._claim_speedup(HPO, scaling)
    assert c["statement"] == ("2 GPUs (one trial each) finish the 4-point grid >= 1.60x faster than 1 "
                              "(one repeat: a point comparison, no interval)")
    assert c["status"] == "passed" and c["measured"]["device"] == "cuda"


def test_on_the_cpu_the_grid_counts_workers_and_their_cores():
    scaling = tables.grid_scaling(_studies("cpu", units=2), _trials())
    fig = scaling_figure(scaling)
    assert [a.get_xlabel() for a in fig.axes] == ["concurrent workers (2 cores each)"] * 2
    assert fig.axes[1].get_ylabel() == "ratio over 1 worker(s) (x)"
    c = claims._claim_speedup(HPO, scaling)
    # as before #25, and one repeat (#40) says it has no interval
    assert c["statement"] == ("2 workers finish the 4-point grid >= 1.60x faster than 1 (one repeat: a point "
                              "comparison, no interval)")
    assert "device" not in c["measured"]
    # one worker count on one GPU: not measured, saying that the speedup needs two GPU counts
    one = claims._claim_speedup({**HPO, "grid": {**HPO["grid"], "workers": [1]}},
                                tables.grid_scaling(_studies("cuda").iloc[:1], _trials()))
    assert one["status"] == "not_measured"
    assert "hpo.grid.workers is [1]: the speedup needs two GPU counts" in str(one)


def test_a_grid_table_from_before_the_device_column_reads_as_the_cpu():
    old = _studies("cpu").drop(columns=["device", "cores_per_worker"])
    scaling = tables.grid_scaling(old, _trials())
    assert list(scaling["device"]) == ["cpu", "cpu"] and scaling["cores_per_worker"].isna().all()
    assert tables.worker_label(scaling) == "concurrent workers"


# ---- CUDA --------------------------------------------------------------------------------------------

@pytest.fixture
def torch_globals(monkeypatch):
    """compute sets torch's deterministic switches for its process (a task's worker); give them back
    to the other studies' cuda tests in this session."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what compute sets; unset again after
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]


@pytest.mark.cuda
def test_a_trial_trains_on_the_gpu_with_its_data_held_there(torch_globals):
    data = _tiny("cuda")
    held = compute.load_data(data)
    assert {t.device.type for pair in held.values() for t in pair} == {"cuda"}
    res = compute.train_chunk({**PARAMS, "width": 64}, None, data, 3, seed=1)
    assert res["device"] == "cuda"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") or "all"
    assert res["worker"] == f"{socket.gethostname()}:{os.getpid()} gpu {visible}"
    assert res["records"][-1]["val_acc"] > 0.5  # chance is 0.1
    # the state travels to the main program: on the CPU, and it resumes on the GPU
    assert all(v.device.type == "cpu" for v in res["state"]["model"].values())
    again = compute.train_chunk({**PARAMS, "width": 64}, None, data, 3, seed=1)
    for k, v in res["state"]["model"].items():  # deterministic settings: the same weights twice
        assert torch.equal(again["state"]["model"][k], v), k
    first = compute.train_chunk({**PARAMS, "width": 64}, None, data, 2, seed=1)
    second = compute.train_chunk({**PARAMS, "width": 64}, first["state"], data, 1, seed=1)
    for k, v in res["state"]["model"].items():  # chunking changes nothing on the GPU either
        torch.testing.assert_close(second["state"]["model"][k], v)
    assert compute.evaluate_test({**PARAMS, "width": 64}, res["state"], data) > 0.5
    cnn = compute.train_chunk({**PARAMS, "model": "cnn", "width": 8, "depth": 2}, None, data, 1)
    assert cnn["device"] == "cuda" and 0.0 <= cnn["records"][0]["val_acc"] <= 1.0


@pytest.mark.cuda
def test_two_trials_in_the_pool_run_at_once_on_distinct_gpus(monkeypatch):
    if len(gpu_pool()) < 2:
        pytest.skip("needs two GPUs in the local pool (one is visible)")
    from hpcdl.platform.orchestration.task_runtime import compss_wait_on, set_local_cores
    from tasks import hpo as app

    monkeypatch.setenv("HPCDL_HPO_UNITS", "1")
    monkeypatch.setenv(gpus_var("hpo"), "1")
    set_local_cores(2)
    try:
        # 48k images in batches of 32: a few seconds a trial, so the two overlap past their start-up
        data = DataSpec(FMNIST, val_fraction=0.2, seed=0, train_limit=None, test_limit=200, device="cuda")
        runs = compss_wait_on([app.train_chunk({**PARAMS, "batch_size": 32}, None, data, 2, 0, False)
                               for _ in range(2)])
    finally:
        set_local_cores(None)
    assert all(r is not None and "error" not in r for r in runs), runs
    assert [r["device"] for r in runs] == ["cuda", "cuda"]
    assert min(r["end_time"] for r in runs) > max(r["start_time"] for r in runs), "the trials did not overlap"
    held = [r["worker"].split(" gpu ")[1] for r in runs]  # the CUDA_VISIBLE_DEVICES each task was given
    assert held[0] != held[1] and set(held) <= set(gpu_pool()), runs
    # the same trial on two GPUs of one model learns the same
    assert runs[0]["records"][-1]["val_acc"] == pytest.approx(runs[1]["records"][-1]["val_acc"], abs=0.02)

