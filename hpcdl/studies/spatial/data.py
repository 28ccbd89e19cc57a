"""Gaussian random fields with a power-law spectrum P(k) = A * k**ns, cached as .npy files.

Each sample's (A, ns) is drawn uniformly from the configured ranges and is the regression
target (stored normalised to [-1, 1]). The fields live in one (N, D, H, W) float32 .npy so
every rank can memory-map it and read only its own slab of each sample.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np


def grf(shape: tuple[int, int, int], amplitude: float, ns: float, rng: np.random.Generator) -> np.ndarray:
    """One field on a periodic grid of unit spacing: white noise filtered by sqrt(P(k))."""
    noise = rng.standard_normal(shape)
    ks = np.meshgrid(*(2 * np.pi * np.fft.fftfreq(n) for n in shape[:-1]),
                     2 * np.pi * np.fft.rfftfreq(shape[-1]), indexing="ij")
    k = np.sqrt(sum(c ** 2 for c in ks))
    k[0, 0, 0] = np.inf  # no power in the mean
    spectrum = np.fft.rfftn(noise) * np.sqrt(amplitude * k ** ns)
    return np.fft.irfftn(spectrum, s=shape, axes=(0, 1, 2)).astype(np.float32)


def dataset_key(shape, n_samples: int, seed: int, amplitude: tuple, ns: tuple) -> str:
    blob = json.dumps({"shape": list(shape), "n": n_samples, "seed": seed, "A": list(amplitude),
                       "ns": list(ns), "v": 1}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def ensure_dataset(resources_dir: str | Path, shape: tuple[int, int, int], n_samples: int, seed: int,
                   amplitude: tuple[float, float], ns: tuple[float, float]) -> Path:
    """Generate once (atomic directory rename) and return the cache directory."""
    shape = tuple(int(v) for v in shape)
    if n_samples < 1 or min(shape) < 2:
        raise ValueError(f"spatial data: need n_samples >= 1 and every grid size >= 2, "
                         f"got {n_samples}, {shape}")
    for name, (lo, hi) in (("amplitude", amplitude), ("ns", ns)):
        if not lo < hi:
            raise ValueError(f"spatial data: range {name} must have min < max, got [{lo}, {hi}]")
    root = Path(resources_dir) / "spatial"
    out = root / f"grf-{'x'.join(map(str, shape))}-{dataset_key(shape, n_samples, seed, amplitude, ns)}"
    if (out / "meta.json").exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-grf-", dir=root))
    try:
        rng = np.random.default_rng(seed)
        params = np.stack([rng.uniform(*amplitude, n_samples), rng.uniform(*ns, n_samples)], axis=1)
        fields = np.lib.format.open_memmap(tmp / "fields.npy", mode="w+", dtype=np.float32,
                                           shape=(n_samples, *shape))
        for i, (a, n) in enumerate(params):
            fields[i] = grf(shape, float(a), float(n), rng)
        fields.flush()
        del fields
        lo = np.array([amplitude[0], ns[0]])
        hi = np.array([amplitude[1], ns[1]])
        np.save(tmp / "targets.npy", (2 * (params - lo) / (hi - lo) - 1).astype(np.float32))
        np.save(tmp / "params.npy", params)
        (tmp / "meta.json").write_text(json.dumps({"shape": shape, "n_samples": n_samples, "seed": seed,
                                                   "amplitude": list(amplitude), "ns": list(ns)}))
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / "meta.json").exists():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


class SlabReader:
    """Reads this rank's (depth, height) block of chosen samples from the memory-mapped cache."""

    def __init__(self, data_dir: str | Path):
        data_dir = Path(data_dir)
        if not (data_dir / "meta.json").exists():
            raise FileNotFoundError(f"spatial data: no GRF cache at {data_dir} (run ensure_dataset first)")
        self.fields = np.load(data_dir / "fields.npy", mmap_mode="r")
        self.targets = np.load(data_dir / "targets.npy")

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.fields.shape[1:])

    def __len__(self) -> int:
        return self.fields.shape[0]

    def read(self, idx: np.ndarray, depth: slice, height: slice) -> tuple[np.ndarray, np.ndarray]:
        """(len(idx), 1, d, h, W) block and the (len(idx), 2) targets; only the slab's pages are touched."""
        block = np.stack([np.asarray(self.fields[i, depth, height]) for i in idx])[:, None]
        return block, self.targets[idx]
