"""Shuffle study, pure parts: partitioning, exchange planning (multiset invariant), KAKURENBO,
sweep expansion and bad input. Real-rank tests are in test_shuffle_ranks.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from references import apply_exchange

from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.studies.shuffle import exchange_plan, kakurenbo, partition, sweep


def _labels(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 10, n)


@settings(max_examples=150, deadline=None)
@given(m=st.integers(1, 9), extra=st.integers(0, 200), q=st.floats(0.0, 1.0), seed=st.integers(0, 2**31),
       skewed=st.booleans(), epochs=st.integers(1, 3))
def test_exchange_keeps_the_multiset_of_samples(m, extra, q, seed, skewed, epochs):
    n = m + extra                                   # any N >= M, uneven splits included
    y = _labels(n, seed % 1000)
    ids = partition.make_partition("skewed" if skewed else "random", y, m, seed, alpha=0.3)
    sizes = [len(p) for p in ids]
    k = exchange_plan.exchange_count(n, m, q)
    assert k <= q * n / m + 1e-9
    for epoch in range(epochs):
        new = apply_exchange(ids, q, seed, epoch)
        # nothing lost, nothing duplicated, sizes unchanged
        assert np.array_equal(np.sort(np.concatenate(new)), np.arange(n))
        assert [len(p) for p in new] == sizes
        for r in range(m):
            # exactly k samples left rank r, and k foreign ones arrived in their place
            assert len(np.setdiff1d(ids[r], new[r])) == (k if m > 1 else 0)
            # a rank holds its partition plus the k received: at most (1+Q) N/M up to uneven rounding
            assert sizes[r] + k <= np.ceil(n / m) + q * n / m + 1e-9
        ids = new


@settings(max_examples=60, deadline=None)
@given(m=st.integers(2, 12), k=st.integers(0, 50), seed=st.integers(0, 10**6), epoch=st.integers(0, 50))
def test_destinations_are_derangements_with_balanced_counts(m, k, seed, epoch):
    dest = exchange_plan.destinations(m, k, seed, epoch)
    assert dest.shape == (m, k)
    for j in range(k):
        assert sorted(dest[:, j]) == list(range(m))     # every rank receives one sample of slot j
        assert np.all(dest[:, j] != np.arange(m))       # nobody sends to itself
    # same seed and epoch -> same plan on every rank; next epoch differs
    assert np.array_equal(dest, exchange_plan.destinations(m, k, seed, epoch))


def test_partial_q0_is_local_and_q1_moves_every_sample():
    y = _labels(4800)
    ids = partition.random_partition(4800, 4, 0)
    assert all(np.array_equal(a, b) for a, b in zip(ids, apply_exchange(ids, 0.0, 0, 0), strict=True))
    moved = apply_exchange(ids, 1.0, 0, 0)
    assert all(len(np.intersect1d(a, b)) == 0 for a, b in zip(ids, moved, strict=True))
    assert exchange_plan.exchange_count(4800, 8, 0.01) == 6          # Q*N/M whole -> exact
    assert partition.label_skew(y, moved) < 0.1


def test_global_indices_follow_distributed_sampler():
    n, m = 103, 4
    parts = [exchange_plan.global_indices(n, m, seed=3, epoch=1, rank=r) for r in range(m)]
    assert all(len(p) == 26 for p in parts)                 # ceil(103/4), padded by wrapping
    allidx = np.concatenate(parts)
    assert set(allidx.tolist()) == set(range(n)) and len(allidx) == 104
    assert not np.array_equal(parts[0], exchange_plan.global_indices(n, m, seed=3, epoch=2, rank=0))


def test_dirichlet_partition_is_skewed_and_exactly_sized():
    y = _labels(4801)
    skew = partition.dirichlet_partition(y, 4, alpha=0.1, seed=0)
    rand = partition.random_partition(4801, 4, 0)
    assert [len(p) for p in skew] == [1201, 1200, 1200, 1200]
    assert np.array_equal(np.sort(np.concatenate(skew)), np.arange(4801))
    assert partition.label_skew(y, skew) > 0.3 > 0.1 > partition.label_skew(y, rand)
    assert partition.label_skew(y, partition.dirichlet_partition(y, 4, alpha=1000, seed=0)) < 0.1


def test_partial_exchange_dilutes_skew_over_epochs():
    y = _labels(4800)
    ids = partition.dirichlet_partition(y, 4, alpha=0.1, seed=0)
    before = partition.label_skew(y, ids)
    for e in range(5):
        ids = apply_exchange(ids, 0.1, 0, e)
    assert partition.label_skew(y, ids) < 0.6 * before


def test_kakurenbo_hides_easy_confident_samples_only():
    loss = np.array([0.01, 0.02, 0.03, 0.04, 5.0, 6.0, 7.0, 8.0, np.inf, np.inf])
    correct = np.array([1, 0, 1, 1, 1, 1, 0, 0, 0, 0], bool)
    conf = np.array([0.9, 0.9, 0.5, 0.95, 0.9, 0.9, 0.9, 0.9, 0, 0])
    h = kakurenbo.select_hidden(loss, correct, conf, 0.4)
    assert h.candidates == 4
    assert h.moved_back == 2                               # sample 1 mispredicted, sample 2 unsure
    assert np.flatnonzero(h.hidden).tolist() == [0, 3]
    assert h.fraction == pytest.approx(0.2)
    assert kakurenbo.lr_scale(h.fraction) == pytest.approx(1.25)
    # never-seen samples (loss inf) are never hidden
    assert not kakurenbo.select_hidden(np.full(5, np.inf), np.ones(5), np.ones(5), 0.9).hidden.any()
    assert not kakurenbo.select_hidden(loss, correct, conf, 0.0).hidden.any()


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_q_outside_0_1_is_rejected(bad, write_config):
    with pytest.raises(ValueError, match="Q must be in"):
        exchange_plan.exchange_count(100, 4, bad)
    cfg = {"results_dir": "r", "studies": ["shuffle"],
           "shuffle": {"grids": [{"world_sizes": [4], "qs": [0, bad]}]}}
    with pytest.raises(ConfigError, match=r"shuffle\.grids\[0\]\.qs\[1\]"):
        validate_config(cfg)


def test_world_larger_than_n_is_rejected():
    with pytest.raises(ValueError, match="larger than the number of training samples"):
        partition.random_partition(3, 4, 0)
    with pytest.raises(ValueError, match="larger than"):
        exchange_plan.exchange_count(3, 4, 0.5)
    cfg = {"results_dir": "r", "studies": ["shuffle"],
           "shuffle": {"n_train": 6, "grids": [{"world_sizes": [4, 8], "qs": [0.1]}]}}
    with pytest.raises(ConfigError, match=r"config key 'shuffle\.grids\[0\]\.world_sizes': 8 .*n_train = 6"):
        validate_config(cfg)


@pytest.mark.parametrize("bad", [-0.2, 1.0, 1.3])
def test_kakurenbo_fraction_outside_0_1_is_rejected(bad):
    with pytest.raises(ValueError, match=r"F must be in \[0, 1\)"):
        kakurenbo.select_hidden(np.zeros(4), np.ones(4), np.ones(4), bad)
    cfg = {"results_dir": "r", "studies": ["shuffle"], "shuffle": {"kakurenbo": {"fractions": [0, bad]}}}
    with pytest.raises(ConfigError, match=r"shuffle\.kakurenbo\.fractions\[1\]"):
        validate_config(cfg)


def test_repo_configs_expand_to_the_documented_sweeps(repo):
    from hpcdl.platform.kit.config import load_config

    default = sweep.expand(load_config(repo / "configs" / "default.yaml")["shuffle"])
    by_id = {p["point"]: p for p in default}
    assert len(default) == len(by_id) == 15
    seeds = lambda pid: [r["seed"] for r in by_id[pid]["runs"]]  # noqa: E731
    # confirmation seeds (#40): none of those earlier runs tuned on
    assert seeds("global-q1-shared-M4") == [7, 8, 9]                # once, serves both partitionings
    assert seeds("partial-q0.1-skewed-M8") == seeds("local-q0-random-M8") == [7, 8, 9]   # the claims' Q
    assert seeds("partial-q0.5-skewed-M4") == [7]                   # the rest of the Q sweep
    kk = by_id["kakurenbo-M1"]["runs"]
    assert {r["kakurenbo_fraction"] for r in kk} == {0, 0.1, 0.2, 0.3}
    assert len(kk) == 1 + 5 * 5                                     # warm-up + 5 rounds x (F=0, 3 F, F=0)
    paper = load_config(repo / "configs" / "paper.yaml")["shuffle"]
    for m in (4, 8, 16, 32):                       # exact Q*N exchange volume at every paper point
        for q in (0.01, 0.1, 0.5):
            k = exchange_plan.exchange_count(paper["n_train"], m, q)
            assert k * m == pytest.approx(q * paper["n_train"])


def test_kakurenbo_rounds_bracket_every_fraction_with_two_baselines():
    runs = sweep.kakurenbo_runs([0.2, 0, 0.1], [7, 8, 9])
    assert runs[0] == {"seed": 7, "kakurenbo_fraction": 0.0, "round": sweep.WARMUP_ROUND, "slot": 0}
    order = [(r["round"], r["slot"], r["kakurenbo_fraction"], r["seed"]) for r in runs[1:]]
    assert order == [(0, 0, 0.0, 7), (0, 1, 0.1, 7), (0, 2, 0.2, 7), (0, 3, 0.0, 7),   # F=0 on both sides
                     (1, 0, 0.0, 8), (1, 1, 0.2, 8), (1, 2, 0.1, 8), (1, 3, 0.0, 8),   # reversed inside
                     (2, 0, 0.0, 9), (2, 1, 0.1, 9), (2, 2, 0.2, 9), (2, 3, 0.0, 9)]


def test_tables_without_rows_keep_their_columns(tmp_path):
    """A config with no KAKURENBO fraction F > 0 and no global point: the tables are header-only CSVs
    that the figures and claims stages can read back."""
    import pandas as pd

    from hpcdl.studies.shuffle import tables

    final = pd.DataFrame([{"point": "partial-q0.5-random-M4", "partitioning": "random", "strategy": "partial",
                           "label": "partial-0.5", "q": 0.5, "world_size": 4, "seed": 0,
                           "kakurenbo_fraction": 0.0, "round": 0, "slot": 0, "final_val_acc": 0.8}])
    rounds = tables.kakurenbo_rounds(final)
    built = {"kakurenbo_rounds": rounds, "kakurenbo": tables.kakurenbo_table(rounds, 0.05),
             "recovery": tables.recovery_table(tables.gap_table(final.iloc[0:0]), 1.0)}
    for name, df in built.items():
        assert df.empty and len(df.columns) > 3, name
        df.to_csv(tmp_path / f"{name}.csv", index=False)
        assert list(pd.read_csv(tmp_path / f"{name}.csv").columns) == list(df.columns)
