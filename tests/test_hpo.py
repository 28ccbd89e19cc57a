"""Unit tests of hpcdl.studies.hpo: chunked training, search space, driver loop, resume, config checks."""

from __future__ import annotations

import copy
import math

import optuna
import pandas as pd
import pytest
import torch
import yaml
from optuna.trial import TrialState

from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.studies.hpo import compute, driver, space, storage, sweep
from hpcdl.studies.hpo.compute import DataSpec

FMNIST = "/usr/share/datasets/fashion-mnist"
TINY = DataSpec(FMNIST, val_fraction=0.25, seed=0, train_limit=400, test_limit=200)
PARAMS = {
    "model": "mlp",
    "width": 16,
    "depth": 1,
    "dropout": 0.2,
    "optimizer": "adam",
    "lr": 1e-3,
    "batch_size": 64,
    "epochs": 2,
}


@pytest.fixture
def cfg(study_config):
    return study_config("hpo")


# ------------------------------------------------------------------------------------ training
def test_two_chunks_equal_one_chunk():
    whole = compute.train_chunk(PARAMS, None, TINY, 2, seed=3)
    first = compute.train_chunk(PARAMS, None, TINY, 1, seed=3)
    second = compute.train_chunk(PARAMS, first["state"], TINY, 1, seed=3)
    assert second["epochs_done"] == whole["epochs_done"] == 2
    for k, v in whole["state"]["model"].items():
        torch.testing.assert_close(second["state"]["model"][k], v)
    assert second["records"][0]["val_acc"] == pytest.approx(whole["records"][1]["val_acc"])
    assert 0.0 <= whole["records"][-1]["val_acc"] <= 1.0


def test_training_learns_and_test_accuracy():
    res = compute.train_chunk({**PARAMS, "width": 64}, None, TINY, 3)
    assert res["records"][-1]["val_acc"] > 0.5  # chance is 0.1
    assert compute.evaluate_test({**PARAMS, "width": 64}, res["state"], TINY) > 0.5


def test_diverging_trial_reports_reason():
    res = compute.run_chunk({**PARAMS, "optimizer": "sgd", "lr": 1e6}, None, TINY, 1)
    assert "TrialDiverged" in res["error"]
    injected = compute.run_chunk(PARAMS, None, TINY, 1, fail=True)
    assert "injected failure" in injected["error"]


# ------------------------------------------------------------------------ space and factories
def test_grid_is_27_points_and_asks_them_all():
    grid = validate_config({"studies": ["hpo"], "hpo": {}})["hpo"]["grid"]
    assert sweep.grid_size(grid) == 27
    study = optuna.create_study(sampler=space.make_sampler("grid", 0, grid=grid), direction="maximize")
    trials = [study.ask(space.grid_distributions(grid)) for _ in range(27)]
    points = {tuple(sorted(t.params.items())) for t in trials}
    assert len(points) == 27
    for t in trials:  # the plain GridSampler would raise here (study.stop outside optimize)
        study.tell(t, 0.5)
    p = space.grid_params(grid, {"optimizer": "sgd", "batch_size": 32, "epochs": 3})
    assert p["lr"] == 0.01 and p["model"] == "mlp" and p["epochs"] == 3


def test_factories_and_unknown_names():
    assert isinstance(space.make_sampler("tpe", 0), optuna.samplers.TPESampler)
    opts = {"n_startup_trials": 1, "n_warmup_steps": 0, "min_resource": 1, "reduction_factor": 3}
    assert isinstance(space.make_pruner("hyperband", opts, 5), optuna.pruners.HyperbandPruner)
    assert isinstance(
        space.make_pruner("successive_halving", opts, 5), optuna.pruners.SuccessiveHalvingPruner
    )
    with pytest.raises(ValueError, match="sampler must be one of grid, random, tpe"):
        space.make_sampler("cmaes", 0)
    with pytest.raises(ValueError, match="pruner must be one of"):
        space.make_pruner("patient", opts, 5)


def test_plan_of_default_config(repo):
    cfg = validate_config(yaml.safe_load((repo / "configs" / "default.yaml").read_text()))
    plans = sweep.plan_studies(cfg["hpo"])
    names = [p.name for p in plans]
    # hpo.grid.repeats 5, round-robin: every worker count of a repeat before the next repeat starts
    assert names[:6] == ["grid-1w", "grid-2w", "grid-1w-r1", "grid-2w-r1", "grid-1w-r2", "grid-2w-r2"]
    assert names[8:10] == ["grid-1w-r4", "grid-2w-r4"]
    assert [p.repeat for p in plans[:10]] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert {p.repeat for p in plans[10:]} == {0}
    assert [p.kind for p in plans[10:]] == ["search"] * len(plans[10:]) and len(set(names)) == len(names)
    base, pruned = sweep.pruning_baseline(cfg["hpo"])
    assert base in names and pruned in names and pruned.endswith("-" + cfg["hpo"]["pruner"])


def test_the_grid_pool_may_shrink_the_searches_pool_but_never_grow_it(test_config):
    hpo = copy.deepcopy(test_config["hpo"])  # the searches' pool: 600 images
    for fine in (None, 400, 600):
        hpo["grid"]["train_limit"] = fine
        sweep.check_grid_pool(hpo)
    hpo["grid"]["train_limit"] = 12000  # the laptop's, as Snakemake's merge would hand it down
    with pytest.raises(ConfigError, match=r"config key 'hpo.grid.train_limit': 12000 .*at most "
                                          r"hpo.data.train_limit \(600\)"):
        sweep.check_grid_pool(hpo)
    hpo["data"]["train_limit"] = None  # the whole set: any pool is a slice of it
    sweep.check_grid_pool(hpo)


# --------------------------------------------------------------------------- driver (fake runtime)
class FakeRuntime:
    """Synchronous stand-in for the task runtime: val acc is a fixed function of the params."""

    def __init__(self, fail_numbers=(), none_numbers=()):
        self.calls = []
        self.fail_numbers, self.none_numbers = set(fail_numbers), set(none_numbers)

    def submit(self, params, state, data, epochs, seed, fail):
        done = 0 if state is None else state["epochs_done"]
        key = len(self.calls)
        self.calls.append((dict(params), done, epochs))
        if fail:
            return {"error": "RuntimeError: injected failure"}
        if params["batch_size"] in self.none_numbers and state is None:
            return None
        quality = 1.0 - abs(math.log10(params["lr"]) + 2.5) / 3  # best near lr = 3e-3
        records = [
            {
                "epoch": e + 1,
                "val_acc": quality * (1 - 0.5 ** (e + 1)),
                "train_loss": 1.0,
                "epoch_time_s": 0.01,
            }
            for e in range(done, done + epochs)
        ]
        return {
            "state": {"epochs_done": done + epochs},
            "epochs_done": done + epochs,
            "records": records,
            "start_time": float(key),
            "end_time": float(key) + 0.5,
            "worker": "fake:1",
        }

    @staticmethod
    def wait(fut):
        return fut

    @staticmethod
    def reason(fut):
        return "task crashed (fake)"


def _run(cfg, p, rt, study_dir):
    store = storage.open_storage(storage.journal_path(cfg))
    return driver.run_study(p, cfg["hpo"], store, TINY, rt.submit, rt.wait, rt.reason, study_dir)


def _search_plan(name, sampler, pruner, n, chunk=1, in_flight=3):
    return sweep.StudyPlan(name, "search", sampler, pruner, n, 2, in_flight, chunk)


def test_pruning_saves_epochs_and_failures_are_rows(cfg, tmp_path, monkeypatch):
    hpo = cfg["hpo"]
    hpo["space"]["epochs"] = {"low": 4, "high": 4}
    hpo["space"]["lr"] = {"low": 1e-5, "high": 1e-1}
    hpo["pruner_options"] = {**hpo["pruner_options"], "n_startup_trials": 2, "n_warmup_steps": 0}
    hpo["fail_trials"] = [5]
    base = _run(cfg, _search_plan("random", "random", "none", 12, chunk=4), FakeRuntime(), tmp_path)
    pruned = _run(cfg, _search_plan("random-median", "random", "median", 12), FakeRuntime(), tmp_path)
    for study in (base, pruned):
        assert sum(storage.counted(t) for t in study.trials) == 12
        failed = [t for t in study.trials if t.state == TrialState.FAIL]
        assert [t.number for t in failed] == [5]
        assert "injected failure" in failed[0].user_attrs["fail_reason"]
    epochs = {
        s.study_name: sum(len(t.user_attrs.get("epochs", [])) for t in s.trials) for s in (base, pruned)
    }
    assert sum(t.state == TrialState.PRUNED for t in pruned.trials) >= 3
    assert epochs["random-median"] <= 0.75 * epochs["random"]
    assert pruned.best_value == pytest.approx(base.best_value)  # same random configs; the best survives
    assert storage.load_best(storage.best_state_path(tmp_path, "random"))["trial"] == base.best_trial.number


def test_task_returning_none_is_fail_with_runtime_reason(cfg, tmp_path):
    rt = FakeRuntime(none_numbers={128})
    cfg["hpo"]["space"]["batch_size"] = [64, 128]
    study = _run(cfg, _search_plan("random", "random", "none", 6, chunk=2), rt, tmp_path)
    fails = [t for t in study.trials if t.state == TrialState.FAIL]
    assert fails and all(t.user_attrs["fail_reason"] == "task crashed (fake)" for t in fails)
    assert all(t.params["batch_size"] == 128 for t in fails)
    assert sum(storage.counted(t) for t in study.trials) == 6


def test_interrupted_trials_are_failed_and_replaced(cfg, tmp_path):
    p = _search_plan("tpe", "tpe", "none", 5, chunk=2)
    store = storage.open_storage(storage.journal_path(cfg))
    # A "dead driver": two finished trials and two left RUNNING.
    study = driver.create_study(p, cfg["hpo"], store)
    dists = space.search_distributions(cfg["hpo"]["space"])
    for _ in range(2):
        t = study.ask(dists)
        study.tell(t, 0.5)
    stale = []
    for _ in range(2):
        t = study.ask(dists)
        t.set_user_attr("n_params", len(t.params))
        stale.append((t.number, dict(t.params)))
    rt = FakeRuntime()
    study = _run(cfg, p, rt, tmp_path)
    trials = study.trials
    for number, params in stale:
        t = trials[number]
        assert t.state == TrialState.FAIL and t.user_attrs["interrupted"]
        assert t.user_attrs["fail_reason"] == storage.INTERRUPTED
        replacement = [r for r in trials if r.user_attrs.get("replaces") == number]
        assert len(replacement) == 1 and replacement[0].params == params
        assert replacement[0].state == TrialState.COMPLETE
    assert [t.value for t in trials[:2]] == [0.5, 0.5]  # kept, not rerun
    assert len(rt.calls) == 3  # the 2 replacements + 1 new trial
    assert sum(storage.counted(t) for t in trials) == 5
    # A second rerun finds the study finished and submits nothing.
    rt2 = FakeRuntime()
    _run(cfg, p, rt2, tmp_path)
    assert rt2.calls == []


def test_journal_opens_with_load_study(cfg, tmp_path):
    _run(cfg, _search_plan("random", "random", "none", 3, chunk=2), FakeRuntime(), tmp_path)
    path = storage.journal_path(cfg)
    assert path.exists() and path.parent == tmp_path / "results" / "hpo" / "journal"
    study = optuna.load_study(
        study_name="random",
        storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path))),
    )
    assert len(study.trials) == 3 and study.best_value > 0


# ------------------------------------------------------------------------------ config checks
@pytest.mark.parametrize(
    "change, key, allowed",
    [
        ({"sampler": "cmaes"}, "hpo.sampler", "grid, random, tpe"),
        ({"pruner": "patient"}, "hpo.pruner", "none, median, successive_halving, hyperband"),
        ({"compare_samplers": ["grid"]}, "hpo.compare_samplers[0]", "random, tpe"),
        ({"n_trials": 0}, "hpo.n_trials", ">= 1"),
        ({"space": {"lr": {"low": 0.1, "high": 0.001}}}, "hpo.space.lr.low", "inverted"),
        ({"space": {"epochs": {"low": 5, "high": 2}}}, "hpo.space.epochs.low", "inverted"),
        ({"space": {"lr": {"low": 0.0, "high": 0.1}}}, "hpo.space.lr.low", "log scale"),
        ({"space": {"batch_size": []}}, "hpo.space.batch_size", "at least 1"),
        ({"grid": {"optimizer": []}}, "hpo.grid.optimizer", "at least 1"),
        ({"space": {"dropout": {"low": 0.0, "high": 1.0}}}, "hpo.space.dropout.high", "< 1.0"),
    ],
)
def test_bad_config_names_the_key(test_config, change, key, allowed):
    c = copy.deepcopy(test_config)
    for k, v in change.items():
        c["hpo"][k] = {**c["hpo"][k], **v} if isinstance(v, dict) else v
    with pytest.raises(ConfigError) as err:
        validate_config(c)
    assert err.value.key == key
    assert allowed in str(err.value)


def test_rdb_storage_url_is_used_instead_of_the_journal(cfg, tmp_path):
    cfg["hpo"]["storage_url"] = f"sqlite:///{tmp_path / 'optuna.db'}"
    store = storage.study_storage(cfg)
    rt = FakeRuntime()
    driver.run_study(_search_plan("random", "random", "none", 2, chunk=2), cfg["hpo"], store, TINY, rt.submit,
                     rt.wait, rt.reason, tmp_path)
    assert not storage.journal_path(cfg).exists()
    study = optuna.load_study(study_name="random", storage=cfg["hpo"]["storage_url"])
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 2


def test_grid_scaling_splits_speedup_into_busy_workers_and_trial_speed():
    from hpcdl.studies.hpo.tables import grid_scaling

    studies = pd.DataFrame({"study": ["grid-2w", "grid-1w", "random"], "kind": ["grid", "grid", "search"],
                            "pruner": ["none"] * 3, "workers": [2, 1, 2], "n_finished": [4, 4, 4],
                            "elapsed_s": [5.0, 12.0, 3.0], "sessions": [1, 1, 1]})
    trials = pd.DataFrame({"study": ["grid-1w"] * 4 + ["grid-2w"] * 4 + ["random"] * 4,
                           "train_time_s": [3.0] * 4 + [2.25] * 4 + [1.0] * 4})
    t = grid_scaling(studies, trials).set_index("workers")
    assert list(t["study"]) == ["grid-1w", "grid-2w"]
    assert t.loc[2, "speedup"] == pytest.approx(2.4)
    assert t.loc[1, "busy_workers"] == pytest.approx(1.0) and t.loc[2, "busy_workers"] == pytest.approx(1.8)
    assert t.loc[1, "mean_trial_train_s"] == pytest.approx(3.0) and t.loc[2, "mean_trial_train_s"] == 2.25
    # super-linear 2.4x = 1.8x more busy workers x trials training 3.0/2.25 = 1.33x faster
    busy_ratio = t.loc[2, "busy_workers"] / t.loc[1, "busy_workers"]
    assert t.loc[2, "speedup"] == pytest.approx(busy_ratio * 3.0 / 2.25)


def _repeated_grid():
    """Raw studies/trials of a grid timed twice on 1 and 2 workers (repeat 1's 1-worker run lost), a
    search, and a pruned study."""
    studies = pd.DataFrame({
        "study": ["grid-1w", "grid-2w", "grid-2w-r1", "random", "random-median"],
        "kind": ["grid", "grid", "grid", "search", "search"], "pruner": ["none"] * 4 + ["median"],
        "workers": [1, 2, 2, 2, 2], "repeat": [0, 0, 1, 0, 0], "n_finished": [4] * 5,
        "elapsed_s": [12.0, 6.0, 6.5, 3.0, 2.0], "sessions": [1] * 5,
        "best_trial": [0, 0, 1, 2, 1], "best_val_acc": [0.80, 0.80, 0.95, 0.85, 0.84],
        "best_test_acc": [0.79, None, None, 0.84, 0.83], "best_test_n": [200, None, None, 200, 200],
        "best_optimizer": ["adam", "adam", "sgd", "sgd", "adam"]})
    trials = pd.DataFrame({
        "study": [s for s in studies["study"] for _ in range(2)],
        "repeat": [r for r in studies["repeat"] for _ in range(2)],
        "sampler": "random", "pruner": "none", "trial": [0, 1] * 5, "state": "COMPLETE", "counted": True,
        "val_acc": [0.7, 0.8] * 5, "end_s": [1.0, 2.0] * 5, "train_time_s": [3.0] * 10})
    return studies, trials


def test_grid_repeats_pair_by_repeat_and_stay_out_of_the_best_tables():
    from hpcdl.studies.hpo.tables import best_config, best_so_far, grid_scaling

    studies, trials = _repeated_grid()
    t = grid_scaling(studies, trials)
    assert list(zip(t["study"], t["workers"], t["repeat"], strict=True)) == [
        ("grid-1w", 1, 0), ("grid-2w", 2, 0), ("grid-2w-r1", 2, 1)]
    assert t.loc[1, "speedup"] == pytest.approx(2.0) and t.loc[1, "efficiency"] == pytest.approx(1.0)
    assert math.isnan(t.loc[2, "speedup"])  # its repeat has no 1-worker run to pair with
    # a later repeat is a timing only: not a best-so-far curve, not a candidate for the overall best
    assert "grid-2w-r1" not in set(best_so_far(trials)["study"])
    best = best_config(studies)
    assert "grid-2w-r1" not in set(best["study"])
    assert best.loc[best["overall_best"], "study"].tolist() == ["random"]


def test_the_grid_figure_shows_the_mean_over_repeats_and_each_repeat():
    from hpcdl.platform import pyplot
    from hpcdl.studies.hpo.figures import scaling_figure
    from hpcdl.studies.hpo.tables import grid_scaling

    studies = pd.DataFrame({"study": ["grid-1w", "grid-2w", "grid-1w-r1", "grid-2w-r1"], "kind": ["grid"] * 4,
                            "pruner": ["none"] * 4, "workers": [1, 2, 1, 2], "repeat": [0, 0, 1, 1],
                            "n_finished": [4] * 4, "elapsed_s": [12.0, 6.0, 10.0, 6.25], "sessions": [1] * 4,
                            "device": ["cpu"] * 4, "cores_per_worker": [1] * 4})
    trials = pd.DataFrame({"study": studies["study"].repeat(4), "train_time_s": [3.0] * 16})
    fig = scaling_figure(grid_scaling(studies, trials))
    a1, a2 = fig.axes
    assert a1.get_title() == "4-point grid, 2 repeats"
    lines = {ln.get_label(): ln for ln in a2.get_lines()}
    mean = lines["measured speedup (mean over repeats)"]
    assert list(mean.get_xdata()) == [1, 2] and list(mean.get_ydata()) == pytest.approx([1.0, 1.8])
    each = lines["each repeat's speedup"]  # 12/6 and 10/6.25
    assert sorted(each.get_ydata()[2:]) == pytest.approx([1.6, 2.0])
    assert [ln.get_label() for ln in a1.get_lines()] == ["mean of 2 repeats", "each repeat"]
    assert list(a1.get_lines()[0].get_ydata()) == pytest.approx([11.0, 6.125])
    pyplot().close(fig)
