"""An Optuna study rebuilt in memory from the run's raw tables (raw/trials.csv, raw/intermediate.csv),
for Optuna's own plots in the figures stage.

The figures stage reads only its rule's declared inputs (hpcdl.platform.kit.study_dir.StudyDir); the
journal the search resumes from is no declared output (Snakemake would delete it before a rerun), so
the plots are drawn from the tables the run wrote from it instead: same trials, parameters, values and
per-epoch reports.
"""

from __future__ import annotations

import optuna
import pandas as pd
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from hpcdl.studies.hpo.space import grid_distributions, search_distributions

PLOTTED = (TrialState.COMPLETE, TrialState.PRUNED)  # what Optuna's plots draw


def _value(raw, dist: BaseDistribution):
    """A parameter as the CSV gave it, as its distribution's own type (a choice, an int, a float)."""
    if isinstance(dist, CategoricalDistribution):
        for choice in dist.choices:
            if str(choice) == str(raw):
                return choice
        raise ValueError(f"value {raw!r} is none of the choices {dist.choices}")
    return int(raw) if isinstance(dist, IntDistribution) else float(raw)


def rebuilt_study(hpo: dict, trials: pd.DataFrame, intermediate: pd.DataFrame, name: str) -> optuna.Study:
    """The study `name` with its complete and pruned trials, each with the parameters it was asked for
    (the grid's axes for a grid search, the whole space otherwise) and its per-epoch reports. A study
    the tables do not hold is a KeyError naming it."""
    own = trials[trials["study"] == name].sort_values("trial")
    if own.empty:
        raise KeyError(f"study {name!r} has no trials in raw/trials.csv")
    sampler = str(own["sampler"].iloc[0])
    dists = grid_distributions(hpo["grid"]) if sampler == "grid" else search_distributions(hpo["space"])
    reports = intermediate[intermediate["study"] == name]
    study = optuna.create_study(study_name=name, direction="maximize")  # as the driver's (in memory)
    for row in own.itertuples(index=False):
        state = TrialState[row.state]
        if state not in PLOTTED:
            continue
        steps = reports[reports["trial"] == row.trial]
        study.add_trial(optuna.trial.create_trial(
            params={k: _value(getattr(row, f"param_{k}"), d) for k, d in dists.items()},
            distributions=dists,
            # a pruned trial's value is its last report, as Optuna's tell gives it
            value=float(row.val_acc if state == TrialState.COMPLETE else row.last_val_acc),
            intermediate_values={int(s.epoch): float(s.val_acc) for s in steps.itertuples(index=False)},
            state=state))
    return study
