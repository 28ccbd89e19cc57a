"""Hyperparameter optimisation study: Optuna ask-and-tell driving trial tasks trained in epoch chunks."""


def task_units(cfg: dict) -> int | str:
    """Cores each trial task reserves (@constraint computing_units): the configured setting."""
    value = cfg["hpo"]["computing_units"]
    return int(value) if str(value).isdigit() else value
