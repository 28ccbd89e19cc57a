"""Offload study: the slow-tier gate (hpcdl/studies/offload/verdicts/gate.py, #59 item 4). It covers the
memory, capacity and hidden-fraction claims alike and not the weights; it makes "not measured" only a
claim that would otherwise pass or straddle; a strategy holding more fast memory than 'none', or
fitting fewer parameters, fails whatever the tier; the configs say why the threshold is 1.5.

Every table here is HAND-MADE (test_offload_zero's, written to real files under tmp_path): nothing is
measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_offload_zero import _judge, _set, _tables

from hpcdl.studies.offload.verdicts.gate import GATED

REPO = Path(__file__).resolve().parent.parent
GATE = "slow_tier_min_slowdown 1.5x"
PAGE_CACHE, DEVICE = 9.5e9, 3e9  # the slow tier's read: 1.05x and 3.3x slower than the fast tier's 10 GB/s


def _slow_read(t, bw: float) -> None:
    """The slow tier reads at `bw` bytes/s (writing stays 5x slower than the fast tier)."""
    d = t["tiers"]
    sel = (d["tier"] == "slow") & (d["direction"] == "read")
    d.loc[sel, ["bandwidth_bytes_per_s", "bandwidth_min_bytes_per_s", "bandwidth_max_bytes_per_s"]] = bw
    d.loc[sel, "slowdown"] = 10e9 / bw


def test_the_gate_covers_memory_capacity_and_hidden_alike_and_not_the_weights(tmp_path):
    cfg, t = _tables()
    opened = _judge(tmp_path / "device", cfg, t)
    assert {cid for cid, c in opened.items() if c["status"] == "passed"} == set(opened)
    _slow_read(t, PAGE_CACHE)
    closed = _judge(tmp_path / "page_cache", cfg, t)
    gated = {cid for cid, c in closed.items() if c["status"] == "not_measured"}
    assert gated == set(GATED) == set(opened) - {"weights_equal"}
    for cid in GATED:
        assert GATE in closed[cid]["reason"] and "read 9.5 GB/s" in closed[cid]["reason"], cid
        assert closed[cid]["statement"].endswith(
            "onto a slow tier measured >= 1.5x slower than the fast tier in this run"), cid
        assert closed[cid]["measured"]["slow_tier_slowdown"]["read"] == pytest.approx(1.053), cid
    assert closed["weights_equal"]["status"] == "passed" and "slow_tier_slowdown" not in closed[
        "weights_equal"]["measured"]


def test_a_hidden_fraction_that_straddles_is_not_measured_where_the_gate_is_closed(tmp_path):
    cfg, t = _tables()
    _set(t, "both", "hidden_frac", 0.7007)
    _set(t, "both", "hidden_frac_steps", "0.66 0.74 0.70 0.7028")
    assert _judge(tmp_path / "device", cfg, t)["hidden_fraction"]["status"] == "straddles"
    _slow_read(t, PAGE_CACHE)
    c = _judge(tmp_path / "page_cache", cfg, t)["hidden_fraction"]
    assert c["status"] == "not_measured" and GATE in c["reason"]


def _more_memory(cfg, t):
    _set(t, "both", "peak_fast_bytes", [130 * 4, 130 * 8])  # 1.3x none's at each depth


def _fewer_layers(cfg, t):
    _set(t, "both", "max_depth", 2, table="capacity")  # 2 layers against none's 4
    _set(t, "both", "max_params", 2, table="capacity")
    cfg["offload"]["claims"]["capacity_min_ratio"] = 0.4  # a line below 1 does not make fewer a gain


# claim: (what makes 'both' worse than 'none', its measured ratio, how its reason starts)
WORSE_THAN_NONE = {
    "memory_ratio": (_more_memory, 1.3, "failed whatever the tier: 'both' holds 1.3 of the measured peak "
                     "fast-tier memory of 'none' at 8 layers (1040 against 800 bytes; the claim: <= 0.3); "
                     "more than 'none' holds"),
    "capacity_ratio": (_fewer_layers, 0.5, "failed whatever the tier: 'both' trains 2 layers under the "
                       "budget against 'none''s 4, 0.5x its parameters (the claim: >= 0.4x); fewer than "
                       "'none' fits"),
}


@pytest.mark.parametrize("slow_read", [DEVICE, PAGE_CACHE])
@pytest.mark.parametrize("cid", list(WORSE_THAN_NONE))
def test_a_strategy_holding_more_than_none_or_fitting_fewer_fails_whatever_the_tier(tmp_path, cid, slow_read):
    worse, ratio, reason = WORSE_THAN_NONE[cid]
    cfg, t = _tables()
    worse(cfg, t)
    _slow_read(t, slow_read)
    c = _judge(tmp_path, cfg, t)[cid]
    assert c["status"] == "failed" and c["measured"][cid] == ratio
    assert c["reason"].startswith(reason), c["reason"]
    assert (GATE in c["reason"]) == (slow_read == PAGE_CACHE)


def test_a_claim_that_would_fail_keeps_its_verdict_where_the_gate_is_closed(tmp_path):
    """The gate says what it gates: a ratio above the line (but below none's), a fraction below it,
    fail on a slow tier as fast as RAM too, with the numbers and the gate in the reason."""
    cfg, t = _tables()
    _set(t, "both", "peak_fast_bytes", [50 * 4, 50 * 8])  # 0.5 of none's against <= 0.3
    _set(t, "both", "hidden_frac", 0.4)
    _set(t, "both", "hidden_frac_steps", "0.38 0.40 0.42 0.40")
    _slow_read(t, PAGE_CACHE)
    c = _judge(tmp_path, cfg, t)
    mem, hidden = c["memory_ratio"], c["hidden_fraction"]
    assert mem["status"] == hidden["status"] == "failed"
    assert "'both' holds 0.5 of the measured peak fast-tier memory" in mem["reason"]
    assert "more than 'none'" not in mem["reason"]
    assert "'both' hides 0.4 of its transfer time (the claim: >= 0.7" in hidden["reason"]
    for found in (mem, hidden):
        assert GATE in found["reason"]
        assert "only a claim that would otherwise pass or straddle" in found["reason"]


@pytest.mark.parametrize("config", ["default.yaml", "paper.yaml", "gpu.yaml"])
def test_the_configs_say_why_the_gate_is_at_1_5_and_what_it_gates(config):
    text = (REPO / "configs" / config).read_text()
    block = text[text.index("\noffload:"):]
    lines = block[:block.index("slow_tier_min_slowdown:")].splitlines()
    note = []
    for line in reversed(lines[:-1] if not lines[-1].strip() else lines):
        if not line.strip().startswith("#"):
            break
        note.insert(0, line.strip().lstrip("# "))
    note = " ".join(note)
    assert "ASSUMPTION" in note and "1.5x" in note and "~1.1x" in note, note
    assert set(re.findall(r"\b(?:zero_)?(?:memory|capacity)_ratio\b|\bhidden_fraction\b", note)) == set(GATED)
    assert "not weights_equal" in note
