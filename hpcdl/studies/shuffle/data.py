"""The study's slice of Fashion-MNIST, cached once as .npy files that every rank memory-maps.

The cache stands in for the paper's shared file system: global shuffling reads each
epoch's samples from it, local and partial shuffling read their partition once.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from hpcdl.common import fashion_mnist
from hpcdl.platform import atomic_write_bytes, atomic_write_json, config_hash

NAMES = ("x_train", "y_train", "x_val", "y_val")


def _save(path: Path, arr: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, arr)
    atomic_write_bytes(path, buf.getvalue())


def prepare(data_dir: str | Path, cache_dir: str | Path, n_train: int, n_val: int,
            seed: int) -> dict[str, str]:
    """Write (or reuse) the cached arrays; returns {name: path}. Keyed by what determines them."""
    key = config_hash({"dir": str(data_dir), "n_train": n_train, "n_val": n_val, "seed": seed})[:12]
    out = Path(cache_dir) / f"fmnist-{key}"
    paths = {name: str(out / f"{name}.npy") for name in NAMES}
    if (out / "done.json").exists():
        return paths
    train, val, _ = fashion_mnist.train_val_test(
        data_dir, val_fraction=n_val / (n_train + n_val), seed=seed, train_limit=n_train + n_val,
        test_limit=1)
    if len(train.y) != n_train or len(val.y) != n_val:
        raise ValueError(f"Fashion-MNIST has too few samples for n_train={n_train}, n_val={n_val} "
                         f"(got {len(train.y)} + {len(val.y)}; the training file holds 60000)")
    for name, arr in zip(NAMES, (train.x, train.y, val.x, val.y), strict=True):
        _save(out / f"{name}.npy", np.ascontiguousarray(arr))
    atomic_write_json(out / "done.json", {"n_train": n_train, "n_val": n_val, "seed": seed,
                                          "data_dir": str(data_dir)})
    return paths
