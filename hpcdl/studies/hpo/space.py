"""Search spaces and the Optuna sampler/pruner factories, built from the `hpo:` config block."""

from __future__ import annotations

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

SAMPLERS = ("grid", "random", "tpe")
PRUNERS = ("none", "median", "successive_halving", "hyperband")
PARAMS = ("model", "lr", "batch_size", "optimizer", "width", "depth", "dropout", "epochs")
GRID_AXES = ("optimizer", "batch_size", "epochs")


def search_distributions(space: dict) -> dict[str, BaseDistribution]:
    """Optuna distributions for the model-based search (lr log-uniform; width log-int)."""
    return {
        "model": CategoricalDistribution(list(space["model"])),
        "optimizer": CategoricalDistribution(list(space["optimizer"])),
        "batch_size": CategoricalDistribution([int(b) for b in space["batch_size"]]),
        "lr": FloatDistribution(float(space["lr"]["low"]), float(space["lr"]["high"]), log=True),
        "width": IntDistribution(int(space["width"]["low"]), int(space["width"]["high"]), log=True),
        "depth": IntDistribution(int(space["depth"]["low"]), int(space["depth"]["high"])),
        "dropout": FloatDistribution(float(space["dropout"]["low"]), float(space["dropout"]["high"])),
        "epochs": IntDistribution(int(space["epochs"]["low"]), int(space["epochs"]["high"])),
    }


def grid_points(grid: dict) -> dict[str, list]:
    """The PDML'19 grid: optimizer x batch size x epochs (27 points with 3 values each)."""
    return {"optimizer": list(grid["optimizer"]), "batch_size": [int(b) for b in grid["batch_size"]],
            "epochs": [int(e) for e in grid["epochs"]]}


def grid_distributions(grid: dict) -> dict[str, BaseDistribution]:
    return {k: CategoricalDistribution(v) for k, v in grid_points(grid).items()}


def grid_params(grid: dict, sampled: dict) -> dict:
    """Complete training params for one grid point: the fixed model, and the optimizer's own learning rate."""
    fixed = grid["fixed"]
    return {"model": fixed["model"], "width": int(fixed["width"]), "depth": int(fixed["depth"]),
            "dropout": float(fixed["dropout"]), "lr": float(grid["lr"][sampled["optimizer"]]),
            "optimizer": sampled["optimizer"], "batch_size": int(sampled["batch_size"]),
            "epochs": int(sampled["epochs"])}


class AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler whose after_trial does not call study.stop(): outside optimize() that raises,
    and the driver stops by counting trials anyway."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def make_sampler(name: str, seed: int, *, grid: dict | None = None,
                 tpe_startup_trials: int = 5) -> optuna.samplers.BaseSampler:
    if name == "grid":
        if grid is None:
            raise ValueError("the grid sampler needs the grid points")
        return AskTellGridSampler(grid_points(grid), seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=tpe_startup_trials)
    raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {name!r}")


def make_pruner(name: str, options: dict, max_epochs: int) -> optuna.pruners.BasePruner:
    """Pruners act on steps = epochs; the resource for the halving pruners is one epoch."""
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=int(options["n_startup_trials"]),
                                           n_warmup_steps=int(options["n_warmup_steps"]))
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=int(options["min_resource"]),
                                                      reduction_factor=int(options["reduction_factor"]))
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=int(options["min_resource"]),
                                              max_resource=max(int(max_epochs), int(options["min_resource"])),
                                              reduction_factor=int(options["reduction_factor"]))
    raise ValueError(f"pruner must be one of {', '.join(PRUNERS)}, got {name!r}")
