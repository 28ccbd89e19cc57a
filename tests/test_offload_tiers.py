"""Offload study: the two tiers' bandwidths each sweep point measures (tiers.py), their table, and
the check that leaves the memory claims unmeasured where the slow tier is not slower (the page cache
is RAM). The end-to-end run's tiers.csv is checked in test_offload.py."""

from __future__ import annotations

import pandas as pd
import pytest

from hpcdl.studies.offload import tiers


@pytest.mark.parametrize("io_mode", ["page_cache", "dontneed"])
def test_tier_probe_measures_both_tiers_each_way_with_the_study_copies(tmp_path, io_mode):
    got = tiers.measure("cpu", str(tmp_path), io_mode, (1 << 20) + 8, rounds=2)
    bws = {k: v for k, v in got.items() if k.endswith("_bw_bytes_per_s")}
    assert set(bws) == {f"{t}_{d}_bw_bytes_per_s" for t in ("fast", "slow") for d in ("write", "read")}
    assert all(0 < v < float("inf") for v in bws.values()) and got["tier_probe_bytes"] == (1 << 20) + 8
    assert not list(tmp_path.iterdir())  # the probe's FileTier run directory is gone
    with pytest.raises(ValueError, match="bytes >= 1 and rounds >= 1"):
        tiers.measure("cpu", str(tmp_path), io_mode, 0, 2)


@pytest.mark.cuda
def test_on_cuda_the_tier_probe_measures_gpu_memory_and_pinned_host_memory(tmp_path):
    got = tiers.measure("cuda", str(tmp_path), "page_cache", 64 << 20, rounds=2)
    assert all(0 < v < float("inf") for k, v in got.items() if k.endswith("_bw_bytes_per_s"))
    assert not list(tmp_path.iterdir())  # the pinned tier writes no file


def _tier_points(slow_read_gbs):
    """Three points' records: fast tier 10 GB/s each way, slow tier writing at 2 GB/s."""
    return pd.DataFrame([{"device": "cpu", "tier": "ram>file", "io_mode": "page_cache",
                          "tier_probe_bytes": 64, "fast_write_bw_bytes_per_s": 10e9 * k,
                          "fast_read_bw_bytes_per_s": 10e9 * k, "slow_write_bw_bytes_per_s": 2e9 * k,
                          "slow_read_bw_bytes_per_s": slow_read_gbs * 1e9 * k} for k in (0.9, 1.0, 1.2)])


def test_tiers_table_is_the_median_per_tier_and_direction_and_the_slow_tiers_slowdown():
    t = tiers.table(_tier_points(8.0)).set_index(["tier", "direction"])
    assert t.loc[("fast", "write"), "bandwidth_bytes_per_s"] == 10e9 and t["points"].eq(3).all()
    assert t.loc[("slow", "write"), "slowdown"] == pytest.approx(5.0)
    assert t.loc[("slow", "read"), "slowdown"] == pytest.approx(1.25)
    assert t.loc[("slow", "read"), "bandwidth_min_bytes_per_s"] == pytest.approx(7.2e9)
    assert t.loc[("slow", "read"), "medium"] == "files through the page cache (RAM)"
    assert list(tiers.table(pd.DataFrame()).columns) == tiers.COLUMNS


def test_a_slow_tier_as_fast_as_ram_leaves_the_memory_claims_unmeasured_on_this_host():
    why, ev = tiers.too_fast(tiers.table(_tier_points(8.0)), 1.5)
    assert why.startswith("on this host the slow tier (files through the page cache (RAM)) is not slower")
    assert "read 8 GB/s vs the fast tier's 10 GB/s (1.25x slower)" in why and "write" not in why
    assert ev["slow_tier_slowdown"] == {"write": 5.0, "read": 1.25}
    assert ev["tier_bandwidths"]["fast_read_gb_per_s"] == 10
    why, ev = tiers.too_fast(tiers.table(_tier_points(3.0)), 1.5)  # a device: 3.3x slower to read
    assert why is None and ev["slow_tier_min_slowdown"] == 1.5
    assert "not measured in this run" in tiers.too_fast(pd.DataFrame(), 1.5)[0]
