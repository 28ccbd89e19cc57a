"""Hyperparameter optimisation study: Optuna ask-and-tell driving trial tasks trained in epoch chunks."""
