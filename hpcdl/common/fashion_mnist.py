"""Fashion-MNIST from IDX files (Debian's dataset-fashion-mnist), read without torchvision."""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
HOW_TO_GET = ("install Debian's package with `apt-get install dataset-fashion-mnist` "
              "(files land in /usr/share/datasets/fashion-mnist), or download the four "
              "IDX files from the Fashion-MNIST project and set config key "
              "data.fashion_mnist_dir to their directory")
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DatasetMissingError(FileNotFoundError):
    pass


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into a numpy array of its declared shape."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file (bad magic {raw[:4]!r})")
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX element type 0x{type_code:02x}")
    shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[type_code])
    data = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape} but holds {data.size} elements")
    return data.reshape(shape).astype(dtype.newbyteorder("="), copy=False)


def _find(directory: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem):
        if (directory / name).exists():
            return directory / name
    raise DatasetMissingError(f"Fashion-MNIST file {stem}[.gz] not found in {directory}: {HOW_TO_GET}")


def load_split(directory: str | Path = DEFAULT_DIR, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) uint8 and labels (N,) int64 of the 'train' (60k) or 'test' (10k) split."""
    if split not in FILES:
        raise ValueError(f"split must be one of {sorted(FILES)}, got {split!r}")
    directory = Path(directory)
    if not directory.is_dir():
        raise DatasetMissingError(f"Fashion-MNIST directory {directory} does not exist: {HOW_TO_GET}")
    img_stem, lbl_stem = FILES[split]
    images = read_idx(_find(directory, img_stem))
    labels = read_idx(_find(directory, lbl_stem)).astype(np.int64)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{directory}: {images.shape[0]} images but {labels.shape[0]} labels")
    return images, labels


@dataclass(frozen=True)
class Split:
    """Normalised float32 tensors-to-be: x (N, 1, 28, 28), y (N,)."""
    x: np.ndarray
    y: np.ndarray


def normalise(images: np.ndarray) -> np.ndarray:
    # Fashion-MNIST training-set mean/std, so every study feeds the same inputs.
    return ((images.astype(np.float32) / 255.0 - 0.2860) / 0.3530)[:, None, :, :]


def train_val_test(directory: str | Path = DEFAULT_DIR, *, val_fraction: float = 1 / 6,
                   seed: int = 0, train_limit: int | None = None,
                   test_limit: int | None = None) -> tuple[Split, Split, Split]:
    """Seeded train/validation split of the 60k training set, plus the 10k test set.

    `train_limit` shrinks the training+validation pool (laptop scale) after the
    seeded shuffle, so the class mix stays representative.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    images, labels = load_split(directory, "train")
    order = np.random.default_rng(seed).permutation(len(labels))
    if train_limit is not None:
        order = order[:train_limit]
    n_val = max(1, int(round(len(order) * val_fraction)))
    val_idx, train_idx = order[:n_val], order[n_val:]
    test_images, test_labels = load_split(directory, "test")
    if test_limit is not None:
        test_images, test_labels = test_images[:test_limit], test_labels[:test_limit]
    return (Split(normalise(images[train_idx]), labels[train_idx]),
            Split(normalise(images[val_idx]), labels[val_idx]),
            Split(normalise(test_images), test_labels))
