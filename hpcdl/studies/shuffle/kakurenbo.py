"""KAKURENBO (NeurIPS 2023): hide the easiest samples from an epoch's backward passes.

Each epoch up to a fraction F of the samples with the lowest last-seen loss become hiding
candidates; a candidate the model mispredicted, or predicted with confidence below the
threshold (0.7), is moved back into training. Hidden samples still get a forward pass so
their loss stays fresh, and the learning rate is scaled by 1/(1 - hidden fraction) so an
epoch's total step size stays that of a full epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONFIDENCE_THRESHOLD = 0.7


def check_fraction(f: float) -> None:
    if not (0.0 <= float(f) < 1.0):
        raise ValueError(f"KAKURENBO hiding fraction F must be in [0, 1), got {f}")


@dataclass(frozen=True)
class Hiding:
    hidden: np.ndarray       # bool (N,): no backward pass this epoch
    candidates: int          # lowest-loss samples considered (floor(F*N))
    moved_back: int          # candidates returned to training (wrong or unsure)

    @property
    def fraction(self) -> float:
        return float(self.hidden.mean()) if self.hidden.size else 0.0


def select_hidden(loss: np.ndarray, correct: np.ndarray, confidence: np.ndarray, fraction: float,
                  threshold: float = CONFIDENCE_THRESHOLD) -> Hiding:
    """Samples never seen yet carry loss = +inf and so are never candidates."""
    check_fraction(fraction)
    loss = np.asarray(loss, dtype=np.float64)
    n = len(loss)
    n_cand = min(int(np.floor(fraction * n)), int(np.isfinite(loss).sum()))
    hidden = np.zeros(n, dtype=bool)
    if n_cand == 0:
        return Hiding(hidden, 0, 0)
    cand = np.argsort(loss, kind="stable")[:n_cand]
    keep_hidden = np.asarray(correct, dtype=bool)[cand] & (np.asarray(confidence)[cand] >= threshold)
    hidden[cand[keep_hidden]] = True
    return Hiding(hidden, n_cand, int((~keep_hidden).sum()))


def lr_scale(hidden_fraction: float) -> float:
    return 1.0 / (1.0 - hidden_fraction)
