"""Split N training samples over M data-parallel ranks: random, or label-skewed by a Dirichlet knob.

Every rank gets floor(N/M) or ceil(N/M) samples: synchronous data parallelism needs the
same number of steps on every rank, so skew is expressed in the class mix, not in sizes.
"""

from __future__ import annotations

import numpy as np


def check_world(n: int, m: int) -> None:
    if m < 1:
        raise ValueError(f"world size M must be >= 1, got {m}")
    if m > n:
        raise ValueError(f"world size M={m} is larger than the number of training samples N={n}: "
                         "some rank would hold no data")


def partition_sizes(n: int, m: int) -> np.ndarray:
    check_world(n, m)
    return np.array([len(a) for a in np.array_split(np.arange(n), m)], dtype=np.int64)


def random_partition(n: int, m: int, seed: int) -> list[np.ndarray]:
    """The paper's setting: a seeded random permutation cut into M near-equal pieces."""
    check_world(n, m)
    order = np.random.default_rng([seed, 11]).permutation(n)
    return [np.sort(p) for p in np.array_split(order, m)]


def dirichlet_partition(labels: np.ndarray, m: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Label skew: each class is spread over ranks with proportions ~ Dirichlet(alpha).

    Small alpha concentrates a class on few ranks (alpha -> inf approaches random).
    Ranks above their size are trimmed by random surplus samples, which go to the ranks
    below theirs, so sizes match `partition_sizes` exactly.
    """
    labels = np.asarray(labels)
    n = len(labels)
    check_world(n, m)
    if not alpha > 0:
        raise ValueError(f"Dirichlet concentration alpha must be > 0, got {alpha}")
    rng = np.random.default_rng([seed, 13])
    owner = np.empty(n, dtype=np.int64)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        props = rng.dirichlet(np.full(m, alpha))
        cuts = np.floor(np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
        for r, piece in enumerate(np.split(idx, cuts)):
            owner[piece] = r
    target = partition_sizes(n, m)
    parts = [rng.permutation(np.flatnonzero(owner == r)) for r in range(m)]
    surplus = np.concatenate([p[target[r]:] for r, p in enumerate(parts)] + [np.empty(0, np.int64)])
    surplus = rng.permutation(surplus)
    parts = [p[:target[r]] for r, p in enumerate(parts)]
    start = 0
    for r in range(m):
        need = target[r] - len(parts[r])
        if need > 0:
            parts[r] = np.concatenate([parts[r], surplus[start:start + need]])
            start += need
    return [np.sort(p) for p in parts]


def make_partition(kind: str, labels: np.ndarray, m: int, seed: int, alpha: float = 0.1) -> list[np.ndarray]:
    if kind == "random":
        return random_partition(len(labels), m, seed)
    if kind == "skewed":
        return dirichlet_partition(labels, m, alpha, seed)
    raise ValueError(f"partitioning must be 'random' or 'skewed', got {kind!r}")


def label_skew(labels: np.ndarray, parts: list[np.ndarray], n_classes: int = 10) -> float:
    """Mean total-variation distance between each rank's class mix and the global mix (0 = iid)."""
    glob = np.bincount(labels, minlength=n_classes) / len(labels)
    tvs = [0.5 * np.abs(np.bincount(labels[p], minlength=n_classes) / max(1, len(p)) - glob).sum()
           for p in parts]
    return float(np.mean(tvs))
