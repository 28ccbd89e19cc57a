"""Semantic checks of the `shuffle:` block that the JSON schema cannot express (no heavy imports)."""

from __future__ import annotations

from hpcdl.platform import ConfigError

FASHION_MNIST_TRAIN = 60000


def check(cfg: dict) -> None:
    block = cfg["shuffle"]
    n = block["n_train"]
    if n + block["n_val"] > FASHION_MNIST_TRAIN:
        raise ConfigError("shuffle.n_val", block["n_val"],
                          f"n_train + n_val <= {FASHION_MNIST_TRAIN} (the Fashion-MNIST training file)")
    for i, grid in enumerate(block["grids"]):
        for m in grid["world_sizes"]:
            if m > n:
                raise ConfigError(f"shuffle.grids[{i}].world_sizes", m,
                                  f"world sizes M <= n_train = {n} (every rank needs a sample)")
        for q in grid["qs"]:
            if not 0 <= q <= 1:
                raise ConfigError(f"shuffle.grids[{i}].qs", q, "fractions Q in [0, 1]")
    kk = block["kakurenbo"]
    if kk["world_size"] > n:
        raise ConfigError("shuffle.kakurenbo.world_size", kk["world_size"], f"M <= n_train = {n}")
    for f in kk["fractions"]:
        if not 0 <= f < 1:
            raise ConfigError("shuffle.kakurenbo.fractions", f, "hiding fractions F in [0, 1)")
