"""Exchange planning from the shared seed and epoch: every rank computes the same plan alone.

Partial-Q: each rank sends k = floor(Q*N/M) of its samples (a random subset, drawn from its
own local shuffle) and receives exactly k. Destinations come from one random derangement of
the ranks per send slot j (a shared permutation p and a shift s in 1..M-1: slot j of rank r
goes to p[(p^-1[r] + s) mod M]), so no sample is "sent" to its own rank, every rank receives
one sample per slot, and exactly Q*N samples cross the network when Q*N/M is an integer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcdl.studies.shuffle.partition import check_world


def check_q(q: float) -> None:
    if not (0.0 <= float(q) <= 1.0):
        raise ValueError(f"shuffle fraction Q must be in [0, 1], got {q}")


def exchange_count(n: int, m: int, q: float) -> int:
    """Samples each rank sends (and receives) per epoch: floor(Q*N/M), never more than any rank holds."""
    check_q(q)
    check_world(n, m)
    if m == 1:
        return 0
    # small epsilon: Q*N/M = 6.0 must not become 5 through 0.01*4800/8 rounding
    return min(int(np.floor(q * n / m + 1e-9)), n // m)


def local_order(size: int, seed: int, epoch: int, rank: int) -> np.ndarray:
    """The rank's own shuffle of its partition positions for this epoch."""
    return np.random.default_rng([seed, epoch, rank, 17]).permutation(size)


def destinations(m: int, k: int, seed: int, epoch: int) -> np.ndarray:
    """dest[r, j]: rank receiving slot j of rank r; each column is a derangement of 0..M-1."""
    if k == 0 or m == 1:
        return np.empty((m, 0), dtype=np.int64)
    rng = np.random.default_rng([seed, epoch, 7919])
    perms = rng.permuted(np.tile(np.arange(m), (k, 1)), axis=1)      # (k, m)
    shifts = rng.integers(1, m, size=k)
    inv = np.argsort(perms, axis=1)
    dest = perms[np.arange(k)[:, None], (inv + shifts[:, None]) % m]  # (k, m): slot j of rank r
    return dest.T.copy()


@dataclass(frozen=True)
class RankPlan:
    """What one rank does in one exchange (positions index its current partition)."""
    order: np.ndarray          # local shuffle of the epoch (positions)
    send_pos: np.ndarray       # positions sent, grouped by destination rank (ascending)
    send_counts: np.ndarray    # (M,) samples to each rank
    recv_counts: np.ndarray    # (M,) samples from each rank


def rank_plan(sizes: np.ndarray, q: float, seed: int, epoch: int, rank: int) -> RankPlan:
    sizes = np.asarray(sizes)
    m, n = len(sizes), int(sizes.sum())
    k = exchange_count(n, m, q)
    order = local_order(int(sizes[rank]), seed, epoch, rank)
    dest = destinations(m, k, seed, epoch)
    # the last k of the epoch's shuffled order leave: a random subset, cheap to pick
    chosen = order[len(order) - k:]
    by_dest = np.argsort(dest[rank], kind="stable")
    send_counts = np.bincount(dest[rank], minlength=m)
    recv_counts = (dest == rank).sum(axis=1)
    return RankPlan(order=order, send_pos=chosen[by_dest], send_counts=send_counts, recv_counts=recv_counts)


def global_indices(n: int, m: int, seed: int, epoch: int, rank: int) -> np.ndarray:
    """DistributedSampler semantics: one shared permutation of all N, padded by wrapping, strided."""
    check_world(n, m)
    perm = np.random.default_rng([seed, epoch, 23]).permutation(n)
    total = -(-n // m) * m
    perm = np.concatenate([perm, perm[:total - n]])
    return perm[rank::m]
