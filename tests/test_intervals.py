"""The one interval method (hpcdl.platform.kit.intervals) against known cases."""

from __future__ import annotations

import math

import pytest

from hpcdl.platform.kit import intervals


def test_t_interval_matches_the_textbook_case():
    # mean 2, sd 1 (values 1, 2, 3), n = 3: half-width t(0.975, 2) * 1 / sqrt(3) = 4.3027 / 1.7321
    iv = intervals.mean_interval([1.0, 2.0, 3.0])
    assert iv.mean == pytest.approx(2.0)
    assert iv.high - iv.mean == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert iv.low == pytest.approx(2.0 - 2.484138, rel=1e-6)
    # more pairs, a narrower interval: n = 10, sd 1 -> t(0.975, 9) = 2.262157
    ten = intervals.mean_interval([0, 2] * 5)
    assert ten.high - ten.mean == pytest.approx(2.262157 * math.sqrt(10 / 9) / math.sqrt(10), rel=1e-6)
    assert intervals.mean_interval([1, 2, 3], confidence=0.9).high < iv.high


def test_pairs_are_differences_of_the_same_key():
    keys, diffs = intervals.paired({"s0": 5.0, "s1": 7.0, "s2": 1.0}, {"s1": 6.0, "s0": 4.5})
    assert keys == ["s0", "s1"] and diffs == [0.5, 1.0]


def test_verdicts_against_a_line():
    iv = intervals.mean_interval([1.0, 2.0, 3.0])      # about [-0.48, 4.48]
    assert intervals.above(iv, -1.0) == intervals.HOLDS
    assert intervals.above(iv, 0.0) == intervals.STRADDLES
    assert intervals.above(iv, 5.0) == intervals.FAILS
    assert intervals.below(iv, 5.0) == intervals.HOLDS
    assert intervals.below(iv, 0.0) == intervals.STRADDLES
    assert intervals.below(iv, -1.0) == intervals.FAILS
    assert intervals.all_of([intervals.HOLDS, intervals.STRADDLES]) == intervals.STRADDLES
    assert intervals.all_of([intervals.STRADDLES, intervals.FAILS]) == intervals.FAILS
    assert intervals.all_of([intervals.HOLDS, intervals.HOLDS]) == intervals.HOLDS


def test_any_of_holds_where_one_part_holds_and_straddles_only_where_none_does():
    h, s, f = intervals.HOLDS, intervals.STRADDLES, intervals.FAILS
    assert intervals.any_of([f, s, h]) == h
    assert intervals.any_of([f, s, f]) == s
    assert intervals.any_of([f, f]) == f
    assert intervals.any_of([]) == f  # nothing shown
    assert intervals.any_of([False, True]) == h and intervals.any_of([False, s]) == s  # bools: no interval


def test_evidence_shows_each_pair_the_mean_and_the_interval():
    ev = intervals.mean_interval([1.0, 2.0, 3.0]).evidence(2, keys=["seed 0", "seed 1", "seed 2"])
    assert ev == {"per_pair": {"seed 0": 1.0, "seed 1": 2.0, "seed 2": 3.0}, "mean": 2.0,
                  "ci95": [-0.48, 4.48], "n": 3}


def test_trimmed_interval_is_yuens_and_one_stall_among_five_does_not_move_it():
    values = [0.053, 0.062, 0.26, 0.062, 0.056]  # one timing stalled by the host
    iv = intervals.trimmed_interval(values)
    # by hand: g = floor(0.2 x 5) = 1 left out at each end; trimmed mean of 0.056, 0.062, 0.062;
    # winsorized sample 0.056, 0.056, 0.062, 0.062, 0.062; SE = s_w / ((1 - 2g/n) sqrt(n)); df = n - 2g - 1
    mean = (0.056 + 0.062 + 0.062) / 3
    w = [0.056, 0.056, 0.062, 0.062, 0.062]
    wm = sum(w) / 5
    s_w = math.sqrt(sum((x - wm) ** 2 for x in w) / 4)
    half = 4.302653 * s_w / (0.6 * math.sqrt(5))
    assert iv.trimmed == 1 and iv.n == 5 and iv.mean == pytest.approx(mean, rel=1e-9)
    assert (iv.low, iv.high) == pytest.approx((mean - half, mean + half), rel=1e-6)
    assert intervals.below(iv, 0.10) == intervals.HOLDS
    assert intervals.below(intervals.mean_interval(values), 0.10) == intervals.STRADDLES  # the mean's
    assert intervals.below(intervals.trimmed_interval([0.053, 0.26, 0.062, 0.24, 0.056]), 0.10) == \
        intervals.STRADDLES  # two stalls of five
    assert iv.evidence()["method"] == "20 % trimmed mean (1 left out at each end) and Yuen's interval"
    # ten values: two left out at each end
    assert intervals.trimmed_interval(range(10)).trimmed == 2
    # below five values nothing is left out: the mean's interval, with its evidence
    few = intervals.trimmed_interval([1.0, 2.0, 3.0, 10.0])
    assert few == intervals.mean_interval([1.0, 2.0, 3.0, 10.0]) and "method" not in few.evidence()
    with pytest.raises(ValueError, match="NaN"):
        intervals.trimmed_interval([1.0, 2.0, float("nan"), 3.0, 4.0])


@pytest.mark.parametrize("values, message", [([1.0], "at least 2"), ([1.0, float("nan")], "NaN")])
def test_too_few_or_missing_values_are_refused(values, message):
    with pytest.raises(ValueError, match=message):
        intervals.mean_interval(values)


def test_interval_for_maps_a_configs_statistic_to_its_interval_and_names_an_unknown_one():
    values = [0.053, 0.062, 0.26, 0.062, 0.056]
    assert intervals.interval_for("mean")(values) == intervals.mean_interval(values)
    assert intervals.interval_for("trimmed_mean")(values) == intervals.trimmed_interval(values)
    with pytest.raises(ValueError, match="unknown interval statistic 'median': mean or trimmed_mean"):
        intervals.interval_for("median")
