"""The figures stage's Optuna study, rebuilt from the raw tables (hpcdl.studies.hpo.replay), holds the
same trials as the study the tables were written from (hpcdl.studies.hpo.records)."""

from __future__ import annotations

import io

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from hpcdl.studies.hpo.records import intermediate_rows, trial_rows
from hpcdl.studies.hpo.replay import rebuilt_study
from hpcdl.studies.hpo.space import search_distributions

SPACE = {"model": ["mlp"], "optimizer": ["adam", "sgd"], "batch_size": [64, 128],
         "lr": {"low": 0.001, "high": 0.01}, "width": {"low": 16, "high": 32}, "depth": {"low": 1, "high": 2},
         "dropout": {"low": 0.0, "high": 0.2}, "epochs": {"low": 1, "high": 3}}


def _searched_study() -> optuna.Study:
    """A real search: trials asked from the space, reported per epoch (as the driver's chunks record
    them in `epochs`), some pruned, one failed."""
    study = optuna.create_study(study_name="random", direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=3))
    study.set_user_attr("plan", {"sampler": "random", "pruner": "median", "workers": 1})
    fail, pruned, complete = TrialState.FAIL, TrialState.PRUNED, TrialState.COMPLETE
    states = (fail, pruned, complete, pruned, complete, complete, complete)
    for n, state in enumerate(states):
        trial = study.ask(search_distributions(SPACE))
        epochs = []
        for e in range(trial.params["epochs"]):
            acc = 0.5 + 0.05 * e + 0.01 * n
            trial.report(acc, e)
            epochs.append({"epoch": e, "val_acc": acc, "train_loss": 1.0 - acc, "epoch_time_s": 0.1,
                           "chunk_end": 1.0 + n + e, "worker": "w0"})
        trial.set_user_attr("epochs", epochs)
        study.tell(trial, epochs[-1]["val_acc"] if state == TrialState.COMPLETE else None, state=state)
    return study


def test_rebuilt_study_has_the_plotted_trials_with_their_params_values_and_reports():
    study = _searched_study()
    # through CSV, as the figures stage reads them
    trials, inter = (pd.read_csv(io.StringIO(pd.DataFrame(rows).to_csv(index=False)))
                     for rows in (trial_rows(study), intermediate_rows(study)))
    rebuilt = rebuilt_study({"space": SPACE}, trials, inter, "random")
    plotted = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(rebuilt.trials) == len(plotted) >= 4 and len(study.trials) == 7
    for old, new in zip(plotted, rebuilt.trials, strict=True):
        assert new.state == old.state and new.params == old.params, (old.number, new.params, old.params)
        assert new.value == pytest.approx(old.value)  # a pruned trial's: its last report
        assert new.intermediate_values == pytest.approx(old.intermediate_values)
    assert rebuilt.best_value == pytest.approx(study.best_value)
    with pytest.raises(KeyError, match="study 'tpe' has no trials"):
        rebuilt_study({"space": SPACE}, trials, inter, "tpe")
