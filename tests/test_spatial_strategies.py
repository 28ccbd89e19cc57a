"""Spatial study: the oracle's strategy families at every scale, why each one that cannot run cannot,
and its pick (hpcdl.studies.spatial.perfmodel.strategies, tables.extrapolation)."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hpcdl.common.layers import build_spec, cosmoflow_spec
from hpcdl.platform.kit.config import validate_config
from hpcdl.studies.spatial.perfmodel.gpu_table import GpuCalibration, Measured
from hpcdl.studies.spatial.perfmodel.machine import Machine
from hpcdl.studies.spatial.perfmodel.oracle import Strategy
from hpcdl.studies.spatial.perfmodel.strategies import FAMILIES, extrapolate, family, strategies, why_not
from hpcdl.studies.spatial.tables import extrapolation

REPO = Path(__file__).resolve().parents[1]
V100ISH = {"peak_tflops": 7.8, "efficiency": 0.5, "memory_gb": 16, "memory_gbs": 900, "intra_gbs": 50,
           "inter_gbs": 12.5, "alpha_intra_s": 5e-6, "alpha_inter_s": 1e-5, "gpus_per_node": 4, "io_gbs": 2.0}
REASON = re.compile(r"^(memory|divisibility|mini-batch|channels|not modelled|no split): ")


def _cosmoflow(grid: int = 512) -> list[dict]:
    return cosmoflow_spec((4, grid, grid, grid), [16, 32, 64, 128, 256, 256, 256], dense=[2048, 256],
                          outputs=4)


def _default_block(**extrapolate) -> dict:
    raw = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    raw["spatial"]["extrapolate"].update(extrapolate)
    return validate_config(raw)["spatial"]


def test_extrapolation_picks_spatial_for_cosmoflow():
    rows = extrapolate(_cosmoflow(), 16, Machine.from_description(V100ISH), [4, 64, 2048])
    data = [r for r in rows if r["family"] == "data"]
    assert data and not any(r["feasible"] for r in data)  # one 512^3 sample does not fit a 16 GB GPU
    picks = {r["gpus"]: r for r in rows if r["chosen"]}
    assert 4 not in picks  # 16 samples of 512^3 need more than 4 GPUs' memory
    assert "spatial" in picks[2048]["strategy"] and "spatial" in picks[64]["strategy"]
    assert picks[2048]["total_s"] < picks[64]["total_s"] / 5
    priced = [r for r in rows if r["strategy"] != "none"]
    assert all(math.isfinite(r["total_s"]) for r in priced)
    assert all(math.isnan(r["total_s"]) for r in rows if r["strategy"] == "none")


def test_every_family_at_every_scale_is_priced_or_ruled_out_with_its_reason():
    """default.yaml's extrapolation table: five families per GPU count, each feasible one priced, each other
    one with why (memory against spatial.machine.memory_gb, divisibility, mini-batch, channels)."""
    block = _default_block()
    ext = extrapolation(block)
    for gpus, g in ext.groupby("gpus"):
        assert tuple(g["family"]) == FAMILIES, gpus
        ok, bad = g[g["feasible"]], g[~g["feasible"]]
        assert (ok["infeasible_reason"] == "").all() and ok["total_s"].notna().all()
        assert all(REASON.match(r) for r in bad["infeasible_reason"]), list(bad["infeasible_reason"])
        assert g["chosen"].sum() == (1 if len(ok) else 0)
        if len(ok):
            assert g.loc[g["chosen"], "total_s"].iloc[0] == ok["total_s"].min()
    at = {(int(r.gpus), r.family): r for r in ext.itertuples()}
    # 4 GPUs: every family priced, every one over the V100's 16 GB, the reason giving the shown split's need
    for fam in FAMILIES:
        r = at[4, fam]
        if fam in ("data", "spatial", "data x spatial"):
            assert r.infeasible_reason.startswith(f"memory: {r.memory_bytes / 1e9:.3g} GB per GPU"), fam
        assert "> 16 GB" in r.infeasible_reason, fam
    data = at[2048, "data"]
    assert data.strategy == "none" and math.isnan(data.total_s) and data.candidates == 1
    assert data.infeasible_reason == (
        "mini-batch: 16 samples < 2048 GPUs (pure data parallelism needs a sample per GPU)")
    assert "channels: conv0 has 16 output channels" in at[2048, "filter"].infeasible_reason
    assert "channels: conv0 has 4 input channels" in at[2048, "channel"].infeasible_reason
    best = at[2048, "data x spatial"]
    assert best.chosen and best.candidates_feasible > 0 and best.data * best.depth * best.height == 2048


def test_a_config_with_a_small_grid_and_a_large_batch_makes_another_family_win():
    """The pick is the model's, not the enumeration's: at 32^3 and mini-batch 256 data x filter beats every
    spatial split at 2048 GPUs, and 4 GPUs go to pure data parallelism."""
    ext = extrapolation(_default_block(grid=32, batch_size=256))
    picks = ext[ext["chosen"]].set_index("gpus")
    assert picks.loc[2048, "family"] == "filter" and picks.loc[2048, "strategy"] == "data x filter"
    assert picks.loc[4, "family"] == "data"
    top = ext[ext["gpus"] == 2048].set_index("family")
    assert top.loc["data x spatial", "feasible"]
    assert top.loc["filter", "total_s"] < top.loc["data x spatial", "total_s"] / 2


def test_why_not_names_mini_batch_divisibility_and_channels():
    spec = _cosmoflow()
    cases = {
        Strategy(32): "mini-batch: 16 samples < 32 GPUs (pure data parallelism needs a sample per GPU)",
        Strategy(64, 2): "mini-batch: 16 samples < 64 data groups",
        Strategy(1, 3, 2): "divisibility: the sample's 512 depth planes not divisible by 3 depth ranks",
        Strategy(1, 1, 1024): "divisibility: the sample's 512 height planes fewer than 1024 height ranks",
        Strategy(2, filter=32): "channels: conv0 has 16 output channels < filter split 32",
        Strategy(2, channel=8): "channels: conv0 has 4 input channels < channel split 8",
        Strategy(4, channel=4): "",
        Strategy(2, 8, 4): "",
    }
    for st, why in cases.items():
        assert why_not(st, 16, spec) == why, st
    assert why_not(Strategy(6), 50, spec) == "divisibility: mini-batch 50 not divisible by 6 data groups"


def test_families_enumerate_every_factorisation_of_the_gpus():
    spec = _cosmoflow()
    rows = {r["family"]: r for r in extrapolate(spec, 16, Machine.from_description(V100ISH), [12])}
    # 12 = d x pd x ph with d > 1 and pd x ph > 1: (2,6) (3,4) (4,3) (6,2) x the divisor splits of the rest
    assert rows["data x spatial"]["candidates"] == 4 + 3 + 2 + 2
    assert rows["spatial"]["candidates"] == 6 and rows["data"]["candidates"] == 1
    assert rows["filter"]["candidates"] == rows["channel"]["candidates"] == 5
    # 12 does not divide 512 planes nor 16 samples, except where a split of 1, 2 or 4 does
    got = strategies(12, 16, spec)
    assert Strategy(4, 1, 3) not in got and Strategy(1, 4, 3) not in got
    assert {family(s) for s in got} == {"filter", "channel"}
    assert all(not why_not(s, 16, spec) for s in got)


def test_a_strategy_the_model_cannot_price_says_not_modelled():
    """With a GPU calibration (Machine.measured) the oracle times only what it measured: filter and channel
    splits are not in it, and a shape it did not measure is refused, never extrapolated."""
    empty = pd.DataFrame(columns=["id", "kind", "key", "median_s", "d", "h", "batch", "axis", "units"])
    cal = GpuCalibration(empty, {"gpu_model": "test GPU"})
    machine = replace(Machine.from_description(V100ISH),
                      measured=Measured(cal, {"peak_tflops": 1.0, "memory_gbs": 1.0}))
    spec = build_spec((8, 8, 8), {"channels": [4, 8], "dense": [16]}, in_channels=4, outputs=2)
    rows = {r["family"]: r for r in extrapolate(spec, 4, machine, [4])}
    assert not any(r["chosen"] or r["feasible"] for r in rows.values())
    for fam in ("filter", "channel"):
        assert rows[fam]["infeasible_reason"].startswith(
            "not modelled: the GPU calibration times whole-channel slabs only"), fam
    for fam in ("data", "spatial", "data x spatial"):
        assert rows[fam]["infeasible_reason"].startswith("not modelled: "), fam
        assert "extrapolation refused" in rows[fam]["infeasible_reason"], fam


@pytest.mark.parametrize("gpus", [[1], [3]])
def test_a_scale_with_no_split_of_a_family_says_so(gpus):
    rows = extrapolate(_cosmoflow(64), 16, Machine.from_description(V100ISH), gpus)
    hybrid = next(r for r in rows if r["family"] == "data x spatial")
    assert hybrid["candidates"] == 0
    assert hybrid["infeasible_reason"] == f"no split: {gpus[0]} GPUs leave no data x spatial factorisation"
