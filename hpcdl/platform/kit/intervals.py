"""One interval method for every "A differs from B by more than noise" claim (docs/architecture.md,
"Results"): paired differences, their mean and a Student-t confidence interval, and a three-way
verdict against a line (holds, fails, straddles).

Pairing: A and B are measured under the same conditions (the same seed and data split, or the same
round of an interleaved timing) and only their difference is averaged, so what A and B share cancels.
The t interval is the textbook one for a mean of a few paired differences; with n pairs it has n-1
degrees of freedom, so three seeds give a wide interval (t = 4.30): a claim that needs more than
noise to hold says so by straddling, not by passing or failing on one lucky draw.

Where single short timings are heavy-tailed (a host stall makes one of them several times its
neighbours), `trimmed_interval` gives the interval of the 20 % trimmed mean instead (Yuen's:
the trimmed mean, the winsorized standard error of Tukey and McLaughlin, n - 2g - 1 degrees of
freedom; scipy.stats.mstats.trimmed_mean_ci): one stall among five repeats no longer decides it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scipy import stats
from scipy.stats import mstats

CONFIDENCE = 0.95
HOLDS, FAILS, STRADDLES = "holds", "fails", "straddles"


@dataclass(frozen=True)
class Interval:
    """Mean of `values` with its two-sided `confidence` interval [low, high] (n >= 2)."""

    values: tuple[float, ...]
    mean: float
    low: float
    high: float
    confidence: float
    trimmed: int = 0  # values left out at each end (trimmed_interval): `mean` is then the trimmed mean

    @property
    def n(self) -> int:
        return len(self.values)

    def evidence(self, digits: int = 4, keys: Iterable | None = None) -> dict:
        """What a claim shows: each pair's value (by key where given), the mean and the interval."""
        values = [round(v, digits) for v in self.values]
        per = dict(zip((str(k) for k in keys), values, strict=True)) if keys is not None else values
        pct = round(100 * self.confidence)
        out = {"per_pair": per, "mean": round(self.mean, digits),
               f"ci{pct}": [round(self.low, digits), round(self.high, digits)], "n": self.n}
        if self.trimmed:
            out["method"] = (f"{round(100 * TRIM)} % trimmed mean ({self.trimmed} left out at each end) "
                             "and Yuen's interval")
        return out


def mean_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    vals = tuple(float(v) for v in values)
    if len(vals) < 2:
        raise ValueError(f"an interval needs at least 2 paired values, got {len(vals)}")
    if any(math.isnan(v) for v in vals):
        raise ValueError(f"paired values contain NaN: {vals}")
    n = len(vals)
    mean = sum(vals) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return Interval(vals, mean, mean - half, mean + half, confidence)


TRIM = 0.2  # the trimming of trimmed_interval: the customary 20 % (Wilcox, robust estimation)


def trimmed_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """The 20 % trimmed mean of `values` and its Yuen interval, g = floor(0.2 n) left out at each end;
    below 5 values nothing is left out and this is mean_interval."""
    vals = tuple(float(v) for v in values)
    g = int(TRIM * len(vals))
    if g == 0:
        return mean_interval(vals, confidence)
    if any(math.isnan(v) for v in vals):
        raise ValueError(f"paired values contain NaN: {vals}")
    n = len(vals)
    # limits g/n (not 0.2): scipy's standard error divides by 1 - 2 x limit, which must be the share kept
    limits = (g / n, g / n)
    low, high = mstats.trimmed_mean_ci(vals, limits=limits, alpha=1 - confidence)
    mean = float(mstats.trimmed_mean(vals, limits=limits))
    return Interval(vals, mean, float(low), float(high), confidence, trimmed=g)


def interval_for(statistic: str):
    """The interval function a config's statistic names: "mean" (mean_interval) or "trimmed_mean"
    (trimmed_interval); offload.claims.hidden_statistic and microbatch.round_statistic use the names."""
    try:
        return {"mean": mean_interval, "trimmed_mean": trimmed_interval}[statistic]
    except KeyError:
        raise ValueError(f"unknown interval statistic {statistic!r}: mean or trimmed_mean") from None


@dataclass(frozen=True)
class Proportion:
    """A proportion measured on `trials` independent items (e.g. a model's accuracy on n test images)
    with its two-sided Wilson score interval [low, high]: the sampling error of one measurement, where
    there is no second run to pair it with. `above` / `below` judge it as they judge an Interval."""

    successes: int
    trials: int
    low: float
    high: float
    confidence: float

    @property
    def mean(self) -> float:
        return self.successes / self.trials

    @property
    def n(self) -> int:
        return self.trials

    def evidence(self, digits: int = 4) -> dict:
        pct = round(100 * self.confidence)
        return {"mean": round(self.mean, digits),
                f"ci{pct}": [round(self.low, digits), round(self.high, digits)],
                "n": self.trials, "successes": self.successes, "method": "Wilson score interval"}


def proportion_interval(fraction: float, trials: int, confidence: float = CONFIDENCE) -> Proportion:
    """The Wilson score interval of a proportion `fraction` of `trials` items (the count is rounded from
    fraction x trials). Wilson rather than mean +- z SE: it stays inside [0, 1] and keeps its coverage
    for a small test set or a proportion near 0 or 1."""
    if not isinstance(trials, int | float) or trials < 1 or int(trials) != trials:
        raise ValueError(f"a proportion needs a whole number of trials >= 1, got {trials!r}")
    if not 0.0 <= fraction <= 1.0 or math.isnan(fraction):
        raise ValueError(f"a proportion must be in [0, 1], got {fraction!r}")
    n = int(trials)
    k = round(fraction * n)
    p = k / n
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return Proportion(k, n, max(0.0, centre - half), min(1.0, centre + half), confidence)


def paired(a: Mapping, b: Mapping) -> tuple[list, list[float]]:
    """Keys measured in both, in a's order, and the differences a[k] - b[k]."""
    keys = [k for k in a if k in b]
    return keys, [float(a[k]) - float(b[k]) for k in keys]


def above(iv: Interval | Proportion, line: float) -> str:
    """Is the mean above `line`? holds when the whole interval is, fails when the whole interval is
    at or below it, straddles otherwise."""
    return HOLDS if iv.low > line else FAILS if iv.high <= line else STRADDLES


def below(iv: Interval | Proportion, line: float) -> str:
    """Is the mean below `line`? The mirror of `above`."""
    return HOLDS if iv.high < line else FAILS if iv.low >= line else STRADDLES


def all_of(verdicts: Iterable[str]) -> str:
    """A conjunction: fails if any part fails, straddles if any part straddles, else holds."""
    verdicts = list(verdicts)
    return FAILS if FAILS in verdicts else STRADDLES if STRADDLES in verdicts else HOLDS


def at_best_straddles(verdict: str) -> str:
    """A verdict the measurement cannot resolve: a hold becomes straddles, a fail stays a fail (an
    interval wholly on the wrong side of the line is a finding whatever the resolution)."""
    return STRADDLES if verdict == HOLDS else verdict


def any_of(verdicts: Iterable[str | bool]) -> str:
    """A disjunction: holds if any part holds, straddles if none holds and one straddles, else fails
    (an empty one fails: nothing was shown). A bool part is a verdict without an interval."""
    verdicts = [{True: HOLDS, False: FAILS}.get(v, v) if isinstance(v, bool) else v for v in verdicts]
    return HOLDS if HOLDS in verdicts else STRADDLES if STRADDLES in verdicts else FAILS
