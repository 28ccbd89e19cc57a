"""Semantic checks of the `hpo:` block that JSON schema cannot express (called by load_config).

Kept free of torch/optuna imports: it runs whenever any config is loaded.
"""

from __future__ import annotations

from hpcdl.platform import ConfigError

_CNN_MAX_DEPTH = 4  # 28x28 input halves per conv block


def _range(cfg: dict, key: str, *, positive: bool = False, upper: float | None = None) -> None:
    block = cfg
    for part in key.split("."):
        block = block[part]
    low, high = block["low"], block["high"]
    if low > high:
        raise ConfigError(f"{key}.low", low, f"a value <= {key}.high ({high}); the range is inverted")
    if positive and low <= 0:
        raise ConfigError(f"{key}.low", low, "a value > 0 (sampled on a log scale)")
    if upper is not None and high >= upper:
        raise ConfigError(f"{key}.high", high, f"a value < {upper}")


def check(cfg: dict) -> None:
    hpo = cfg.get("hpo")
    if hpo is None:
        return
    space = hpo["space"]
    _range(cfg, "hpo.space.lr", positive=True)
    _range(cfg, "hpo.space.width", positive=True)
    _range(cfg, "hpo.space.depth", positive=True)
    _range(cfg, "hpo.space.dropout", upper=1.0)
    if space["dropout"]["low"] < 0:
        raise ConfigError("hpo.space.dropout.low", space["dropout"]["low"], "a value >= 0")
    _range(cfg, "hpo.space.epochs", positive=True)
    if "cnn" in space["model"] and space["depth"]["high"] > _CNN_MAX_DEPTH:
        raise ConfigError("hpo.space.depth.high", space["depth"]["high"],
                          f"a value <= {_CNN_MAX_DEPTH} when hpo.space.model includes cnn")
    fixed = hpo["grid"]["fixed"]
    if fixed["model"] == "cnn" and fixed["depth"] > _CNN_MAX_DEPTH:
        raise ConfigError("hpo.grid.fixed.depth", fixed["depth"], f"a value <= {_CNN_MAX_DEPTH} for the cnn")
    for opt in hpo["grid"]["optimizer"]:
        if opt not in hpo["grid"]["lr"]:
            raise ConfigError("hpo.grid.lr", hpo["grid"]["lr"],
                              f"a learning rate for every grid optimizer ({opt})")
    pruned_search = hpo["pruner"] != "none" and hpo["sampler"] != "grid"
    if pruned_search and hpo["chunk_epochs"] >= space["epochs"]["high"]:
        raise ConfigError("hpo.chunk_epochs", hpo["chunk_epochs"],
                          f"a value < hpo.space.epochs.high ({space['epochs']['high']}) so the pruner "
                          "sees a trial before it ends")
    if hpo["sampler"] == "grid" and hpo["pruner"] != "none" and not hpo["grid"]["workers"]:
        raise ConfigError("hpo.grid.workers", [], "at least one worker count: the pruned grid study is "
                          "compared with the unpruned grid")
