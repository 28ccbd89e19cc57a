"""Differential tracing (after Denoyelle, Gerofi et al., ISC 2022): estimate the runtime of any data
placement from two runs only, one with all data in the slow tier and one with all in the fast tier.

Inputs, and nothing else:
  * the PEBS-like sampled traces of the two runs: 1 in N last-level-cache-miss events, each with
    its instruction window and page (`sample_misses`: periodic sampling with a random phase per
    run, like a PEBS counter with period N);
  * the per-window times of the two runs (windows aligned by instruction count).

Per window w, with c_w(p) the sampled events on page p (both runs' samples pooled), a placement F
(the set of fast pages) puts the share s_w = sum_{p in F} c_w(p) / sum_p c_w(p) of the window's
misses in fast memory, and the estimate is  T(F) = sum_w  s_w * Tfast_w + (1 - s_w) * Tslow_w.
A window without any sample takes the whole run's share. Estimating runs nothing: it is one
sparse-ish matrix-vector product, so any placement (per object or per page range) is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def sample_misses(
    miss_window: np.ndarray,
    miss_page: np.ndarray,
    n_windows: int,
    n_pages: int,
    every: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Sampled event counts (W, P) of one run: every `every`-th miss, from a random phase."""
    phase = int(rng.integers(every))
    take = np.arange(phase, len(miss_window), every)
    flat = miss_window[take] * n_pages + miss_page[take]
    return np.bincount(flat, minlength=n_windows * n_pages).reshape(n_windows, n_pages).astype(np.float64)


@dataclass
class DifferentialEstimator:
    counts: np.ndarray  # (W, P) sampled events of the all-fast and all-slow runs, pooled
    t_fast: np.ndarray  # (W,) window times of the all-fast run
    t_slow: np.ndarray  # (W,) window times of the all-slow run

    def __post_init__(self):
        if self.counts.shape[0] != len(self.t_fast) or len(self.t_fast) != len(self.t_slow):
            raise ValueError(
                f"windows do not align: counts {self.counts.shape}, "
                f"{len(self.t_fast)} fast and {len(self.t_slow)} slow window times"
            )
        self._per_window = self.counts.sum(axis=1)
        total = self.counts.sum(axis=0)
        self._overall = total / total.sum() if total.sum() > 0 else np.full(len(total), 1.0 / len(total))

    @classmethod
    def from_runs(cls, fast_counts, slow_counts, t_fast, t_slow) -> DifferentialEstimator:
        return cls(np.asarray(fast_counts) + np.asarray(slow_counts), np.asarray(t_fast), np.asarray(t_slow))

    def shares(self, masks: np.ndarray) -> np.ndarray:
        """(K, W): each placement's share of each window's sampled events in fast memory."""
        masks = np.atleast_2d(masks).astype(np.float64)
        if masks.shape[1] != self.counts.shape[1]:
            raise ValueError(
                f"a placement covers {masks.shape[1]} pages; the traces have {self.counts.shape[1]}"
            )
        fast = (self.counts @ masks.T).T
        overall = masks @ self._overall
        with np.errstate(invalid="ignore", divide="ignore"):
            share = fast / self._per_window
        return np.where(self._per_window > 0, share, overall[:, None])

    def estimate(self, masks: np.ndarray) -> np.ndarray:
        """Estimated total runtime (s) of each placement: masks (K, P) -> (K,)."""
        s = self.shares(masks)
        return (s * self.t_fast + (1.0 - s) * self.t_slow).sum(axis=1)

    def estimate_one(self, mask: np.ndarray) -> float:
        return float(self.estimate(mask[None, :])[0])
