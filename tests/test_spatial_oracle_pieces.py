"""The spatial oracle's calibration in resumable pieces (#57), on HAND-MADE tables (nothing here is measured
on a GPU): the order that completes the papers' settings one at a time, a table from before #57 resumed,
the time left at a table's own pace, the per-layer fixed cost as its own item and how the oracle prices
it, the component breakdown and what one term would have to take to meet a published speedup, and the
one-GPU rule (a claim that needs several GPUs is not measured on one)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from test_claims import BUILDERS, _write
from test_spatial_calibration_gpu import TOY

from hpcdl.platform.kit.config import validate_config
from hpcdl.studies.spatial import claims as spatial_claims
from hpcdl.studies.spatial.calibration import gpu_ops, gpu_plan
from hpcdl.studies.spatial.claim_families.gpu_compute import claim_compute_term
from hpcdl.studies.spatial.paper_scale import breakdown, compute_check, predictions
from hpcdl.studies.spatial.perfmodel import gpu_table, layouts, slabs

REPO = Path(__file__).resolve().parents[1]


def _toy(test_config) -> dict:
    cfg = dict(test_config)
    cfg["spatial"] = {**cfg["spatial"], **TOY}
    return cfg


def _paper_block() -> dict:
    return validate_config(yaml.safe_load((REPO / "configs" / "paper.yaml").read_text()))["spatial"]


def _stand_in(items, median=1e-3, **by_id) -> pd.DataFrame:
    """HAND-MADE rows of these items, every one `median` seconds unless by_id says otherwise."""
    return pd.DataFrame([{"id": it["id"], "kind": it["kind"], "key": it["key"],
                          "network": it.get("network", ""),
                          "axis": it.get("axis", ""), "d": it.get("d", it.get("depth", 0)),
                          "h": it.get("h", it.get("height", 0)), "batch": it["batch"],
                          "units": it.get("units", 0), "median_s": by_id.get(it["id"], median),
                          "p25_s": by_id.get(it["id"], median), "p75_s": by_id.get(it["id"], median),
                          "search_s": 0.0, "session": 0} for it in items])


def _cal(block, rows, partial=True, gpu="NVIDIA H100 80GB HBM3"):
    meta = {"gpu_model": gpu, "partial": partial, "items": len(layouts.calibration_items(block)),
            "block": {k: block[k] for k in ("papers", "extrapolate", "machine", "gpu_calibration")}}
    return gpu_table.GpuCalibration(rows, meta)


# -- the order: each paper setting's own layouts complete one at a time ------------------------------------


def test_each_setting_is_complete_before_the_next_and_its_row_then_reads_nothing_interpolated():
    """configs/paper.yaml: a table cut where the first setting's items end (as a budget would leave it)
    predicts that setting on measured items only; the next setting still interpolates; every row counts its
    own."""
    block = _paper_block()
    order = gpu_plan.ordered(layouts.calibration_items(block))
    labels = [gpu_plan.label(t, it) for t, it in order]
    first = f"{layouts.SETTING_PREFIX}cosmoflow 512"
    assert labels.index(first) > max(i for i, t in enumerate(labels) if t in ("predictions", "compute_term"))
    assert [x for x in dict.fromkeys(labels) if x.startswith(layouts.SETTING_PREFIX)] == [
        f"{layouts.SETTING_PREFIX}{n} {g}" for n, g in layouts.setting_order(block)]
    cut = max(i for i, x in enumerate(labels) if x == first) + 1
    cal = _cal(block, _stand_in([it for _, it in order[:cut]]))
    rows = pd.DataFrame(predictions.paper_predictions(block, cal, every_basis=True))
    mapped = rows[rows["compute_basis"] == "mapped"].set_index(["network", "gpus"])
    assert mapped.loc[("cosmoflow", 512), "interpolated_items_all_splits"] == 0
    assert mapped.loc[("cosmoflow", 512), "interpolated_items"] == 0
    assert mapped.loc[("cosmoflow", 512), "measured_items"] > 0
    assert mapped.loc[("cosmoflow", 2048), "interpolated_items_all_splits"] > 0
    assert "partial calibration" in mapped.loc[("cosmoflow", 2048), "basis"]


def test_settings_follow_the_published_speedups_ends_first():
    block = _paper_block()
    assert layouts.setting_order(block) == [("cosmoflow", 512), ("cosmoflow", 2048), ("unet3d", 256),
                                          ("unet3d", 512), ("cosmoflow", 1024)]


# -- resume: a table from before #57, and the time left at its own pace -------------------------------------


def _calibrate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcdl", "spatial", "calibrate", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def test_a_table_from_before_the_new_items_resumes_keeping_its_rows(tmp_path, test_config):
    """HAND-MADE: a finished TOY table turned into one from before #57 (a step under its old id, no fixed-cost
    or face rows, marked partial): the rerun keeps its rows, drops the old step id, measures only the rest."""
    cfg = _toy(test_config)
    cfg["data"] = {**cfg.get("data", {}), "resources_dir": str(tmp_path / "res")}
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(cfg))
    args = ("--config", str(config), "--device", "cpu", "--out", str(tmp_path / "cal"))
    got = _calibrate(*args)
    assert got.returncode == 0, got.stderr
    csv = Path(got.stdout.strip().splitlines()[-1])
    table = pd.read_csv(csv)
    old = table[~table["kind"].isin(["fixed", "face"])].copy()
    old.loc[old["id"] == slabs.step_id("cosmoflow", 4, 2, 1), "id"] = "step|cosmoflow|2x1|b1"
    old.to_csv(csv, index=False)
    meta = json.loads(gpu_table.sidecar(csv).read_text())
    gpu_table.sidecar(csv).write_text(json.dumps({**meta, "partial": True}))
    again = _calibrate(*args)
    assert again.returncode == 0, again.stderr
    after = pd.read_csv(csv).set_index("id")
    block = validate_config(cfg)["spatial"]
    assert set(after.index) == {it["id"] for it in layouts.calibration_items(block)}
    assert "step|cosmoflow|2x1|b1" not in after.index
    kept = old[old["id"] != "step|cosmoflow|2x1|b1"].set_index("id")
    assert (after.loc[kept.index, "session"] == 0).all()
    assert (after.loc[kept.index, "median_s"].to_numpy() == kept["median_s"].to_numpy()).all()
    new = after.drop(kept.index)
    assert (new["session"] == 1).all() and {"fixed", "face", "step"} <= set(new["kind"])


def test_time_left_at_a_tables_own_pace():
    """HAND-MADE rows: search took 2x and the timed calls 0.5x the estimate, 10 ms per item besides; what is
    left is the estimate at those ratios, packed into calls whose search cache starts cold."""
    block = validate_config({"spatial": TOY})["spatial"]
    items = layouts.calibration_items(block)
    order = gpu_plan.ordered(items)
    est = gpu_plan.Estimator(2)
    done = order[: len(order) // 2]
    rows, spent = [], 0.0
    for _, it in done:
        timed, search = est(it)
        rows.append({"id": it["id"], "median_s": 0.5 * (timed - gpu_plan.ITEM_OVERHEAD_S) / 2,
                     "search_s": 2 * search, "session": 0})
        spent += 2 * search + 0.5 * (timed - gpu_plan.ITEM_OVERHEAD_S) + 0.01
    sessions = [{"measured": len(rows), "wall_s": spent}]
    p = gpu_plan.pace(items, rows, 2, sessions)
    assert p["timed_ratio"] == pytest.approx(0.5) and p["per_item_s"] == pytest.approx(0.01)
    assert p["search_ratio"] == pytest.approx(2.0)
    left = gpu_plan.remaining(items, rows, 2, sessions, call_budget_s=1e6, start_s=0)
    again = gpu_plan.Estimator(2)
    want = 0.0
    for _, it in order[len(done):]:
        timed, search = again(it)
        want += 0.5 * (timed - gpu_plan.ITEM_OVERHEAD_S) + p["search_ratio"] * search + 0.01
    assert left["items_left"] == len(order) - len(done)
    assert left["estimated_s"] == pytest.approx(want, abs=0.05)
    assert left["calls"] == 1
    # a budget that fits about a third of it: more calls
    assert gpu_plan.remaining(items, rows, 2, sessions, call_budget_s=want / 3, start_s=0)["calls"] >= 3


def test_the_committed_h200_table_leaves_a_few_calls():
    """The committed calibration (resources/calibration/nvidia-h200.csv) against configs/paper.yaml's items:
    what is left, at its own pace, in calls of make gpu's 135 s."""
    csv = REPO / "resources" / "calibration" / "nvidia-h200.csv"
    meta = json.loads(gpu_table.sidecar(csv).read_text())
    items = layouts.calibration_items(_paper_block())
    rows = gpu_table.read_rows(csv).to_dict("records")
    left = gpu_plan.remaining(items, rows, 5, meta["sessions"], 135.0)
    assert 0 < left["items_measured"] < len(items)
    assert left["items_left"] == len(items) - left["items_measured"]
    assert left["pace"]["search_ratio"] > 1 and 2 <= left["calls"] <= 8


# -- the per-layer fixed cost: its own item, and how the oracle prices it --------------------------------


@pytest.mark.parametrize("kind", ["conv", "pool", "deconv", "dense", "optimizer:cosmoflow"])
def test_fixed_cost_items_run_the_same_item_code_on_the_cpu(kind, test_config):
    """The fixed-cost items at their minimal shapes through gpu_ops, as on a GPU: alone one layer, chained
    CHAIN of them in one call (their forwards, one backward over all), times per layer."""
    block = validate_config(_toy(test_config))["spatial"]
    items = {it["id"]: it for it in layouts.calibration_items(block) if it["kind"] == "fixed"}
    dev = torch.device("cpu")
    clock = gpu_ops.Clock(dev)
    alone, chained = items[slabs.fixed_id(kind, "alone")], items[slabs.fixed_id(kind, "chained")]
    one, many = gpu_ops.build(alone, dev), gpu_ops.build(chained, dev)
    assert one.per == 1 and many.per == slabs.CHAIN
    if kind != "optimizer:cosmoflow":
        assert len(many.leaves) == slabs.CHAIN * len(one.leaves) > 0
    for it in (alone, chained):
        search, times = gpu_ops.time_item(it, dev, clock, 2)
        assert search >= 0 and len(times) == 2 and all(f > 0 and b >= 0 for f, b in times)


def test_a_layer_in_a_step_is_its_item_less_the_alone_cost_and_at_least_the_chained_cost(test_config):
    """HAND-MADE table: a 10 ms conv with 1 ms alone and 0.3 ms chained fixed cost is 9 ms inside a step; a
    0.5 ms one is 0.3 ms (what issuing it costs); mapped, the item's work scales, the chained cost does not;
    fixed_cost none prices the items as timed; a table without the rows says so."""
    block = validate_config(_toy(test_config))["spatial"]
    conv = next(it for it in layouts.calibration_items(block) if it["kind"] == "conv")
    small = {**conv, "id": "conv|small"}
    rows = _stand_in([conv], median=10e-3)
    rows = pd.concat([rows, _stand_in([small], median=0.5e-3),
                      _stand_in([it for it in slabs.fixed_items(block) if it["key"] == "conv"],
                                **{slabs.fixed_id("conv", "alone"): 1e-3,
                                   slabs.fixed_id("conv", "chained"): 0.3e-3})])
    cal = _cal(block, rows, partial=False)
    m = gpu_table.Measured(cal, {}, None)
    assert m.in_step(conv) == pytest.approx(9e-3) and m.in_step(small) == pytest.approx(0.3e-3)
    src, dst = {"peak_tflops": 60.0, "memory_gbs": 3000.0}, {"peak_tflops": 15.0, "memory_gbs": 750.0}
    assert gpu_table.Measured(cal, src, dst).in_step(conv) == pytest.approx(9e-3 * 4)
    assert gpu_table.Measured(cal, {}, None, fixed="none").in_step(conv) == pytest.approx(10e-3)
    bare = _cal(block, _stand_in([conv], median=10e-3), partial=False)
    m = gpu_table.Measured(bare, {}, None)
    assert m.in_step(conv) == pytest.approx(10e-3) and m.fixed_missing == {"conv"}
    with pytest.raises(ValueError, match="fixed_cost"):
        gpu_table.Measured(cal, {}, None, fixed="fitted")


def test_compute_check_adds_the_fixed_cost_per_layer_and_labels_held_out_steps(test_config):
    """HAND-MADE table of every TOY item at 1 ms, each kind's fixed cost 0.4 ms alone and 0.2 ms chained:
    each layer of a step is 0.6 ms inside it, the plain sum of items 1 ms a layer; the held-out step is
    labelled and its layers the calibration lacks are interpolated."""
    block = validate_config(_toy(test_config))["spatial"]
    items = layouts.calibration_items(block)
    fixed = {it["id"]: (0.4e-3 if it["axis"] == "alone" else 0.2e-3) for it in items if it["kind"] == "fixed"}
    steps = {it["id"]: 5e-3 for it in items if it["kind"] in ("step", "heldout_step")}
    cal = _cal(block, _stand_in(items, **fixed, **steps), partial=False)
    check = pd.DataFrame(compute_check.compute_check(cal)).set_index(["network", "depth", "height"])
    assert list(check["sample"]) == ["in_sample", "in_sample", "held_out"]
    for (net, pd_, ph), r in check.iterrows():
        spec = slabs.network_spec(net, block["papers"][net], block["extrapolate"])
        n = len(slabs.step_layer_items(spec, pd_, ph))
        assert r["layers"] == n
        assert r["oracle_compute_s"] == pytest.approx((n + 1) * 0.6e-3)
        assert r["oracle_items_s"] == pytest.approx((n + 1) * 1e-3)
        assert r["error"] == pytest.approx(((n + 1) * 0.6e-3 - 5e-3) / 5e-3)
    assert check.loc[("cosmoflow", 3, 1), "interpolated_items"] > 0
    assert (check.loc[[("cosmoflow", 2, 1), ("unet3d", 2, 1)], "interpolated_items"] == 0).all()
    c = claim_compute_term(block, check.reset_index())
    assert set(c["measured"]["error"]) == {"cosmoflow 2x1", "unet3d 2x1", "held out cosmoflow 3x1"}
    assert c["measured"]["held_out_bound"] == block["claims"]["max_oracle_error"]


# -- the breakdown, and what one term would have to take to meet a published speedup ----------------------


def _rows(t_from: dict, t_to: dict) -> dict:
    def row(terms):
        r = {c: terms.get(t, 0.0) for t, c in breakdown.TERMS}
        r["time_per_iter_s"] = sum(r.values())
        return r
    return {512: row(t_from), 2048: row(t_to)}


PUB = {"id": "cosmoflow_strong_512_to_2048", "value": 2.0, "gpus_from": 512, "gpus_to": 2048,
       "mini_batch": 64}


def test_which_term_would_have_to_take_how_many_ms():
    """HAND-MADE: 100 ms at 512 GPUs (80 compute, 10 halo, 10 all-reduce), 40 ms at 2048 (30, 5, 5): 2.5x
    predicted against 2.0x published, +25 %. At 2048 GPUs the time would have to be 50 ms: compute 30 -> 40,
    halo 5 -> 15, ...; at 512 GPUs 80 ms: compute 80 -> 60, halo and all-reduce 10 -> -10 (impossible)."""
    rows = _rows({"compute": 0.080, "halo": 0.010, "allreduce": 0.010}, {"compute": 0.030, "halo": 0.005,
                                                                           "allreduce": 0.005})
    got = breakdown._meet(rows, PUB, 0.10)
    hi, lo = got[2048], got[512]
    assert hi["predicted_speedup"] == pytest.approx(2.5) and hi["speedup_off"] == pytest.approx(0.25)
    assert hi["beyond_tolerance"] and hi["paper_gpus"] == "512->2048"
    assert hi["meet_compute_ms"] == pytest.approx(40.0) and hi["meet_halo_ms"] == pytest.approx(15.0)
    assert hi["meet_allreduce_ms"] == pytest.approx(15.0) and hi["meet_input_ms"] == pytest.approx(10.0)
    assert lo["meet_compute_ms"] == pytest.approx(60.0)
    assert math.isnan(lo["meet_halo_ms"]) and math.isnan(lo["meet_allreduce_ms"])
    assert "compute 30.0 -> 40.0 ms" in hi["to_meet"] and "at 2048 GPUs" in hi["to_meet"]
    assert "halo" not in lo["to_meet"] and "compute 80.0 -> 60.0 ms" in lo["to_meet"]
    # moving any one term to its value meets the paper's speedup exactly
    for t, c in breakdown.TERMS:
        if not math.isnan(hi[f"meet_{t}_ms"]):
            moved = rows[2048]["time_per_iter_s"] - rows[2048][c] + hi[f"meet_{t}_ms"] / 1e3
            assert rows[512]["time_per_iter_s"] / moved == pytest.approx(2.0)


def test_within_the_tolerance_nothing_is_asked_and_a_gap_no_term_closes_says_so():
    near = breakdown._meet(_rows({"compute": 0.1}, {"compute": 0.048}), PUB, 0.10)
    assert not near[2048]["beyond_tolerance"] and near[2048]["to_meet"].startswith("within 10% of 2x")
    assert all(math.isnan(near[2048][f"meet_{t}_ms"]) for t, _ in breakdown.TERMS)
    # 1.0x predicted against 2.0x: 2048 GPUs would need 50 ms, more than any one of its terms (40, 30, 30)
    # can give up; at 512 GPUs one term growing by 100 ms meets it
    flat = breakdown._meet(_rows({"compute": 0.05, "halo": 0.05},
                              {"compute": 0.04, "halo": 0.03, "allreduce": 0.03}), PUB, 0.10)
    assert "no single term can" in flat[2048]["to_meet"]
    assert all(math.isnan(flat[2048][f"meet_{t}_ms"]) for t, _ in breakdown.TERMS)
    assert flat[512]["meet_compute_ms"] == pytest.approx(150.0)


def test_breakdown_sets_each_published_speedup_beside_its_settings(test_config):
    """test.yaml's papers on the assumed basis (no calibration), the published speedups of papers.yaml: a row
    per setting with its terms, the endpoints compared, every moved term meeting the paper's speedup."""
    block = validate_config(test_config)["spatial"]
    pub = breakdown.published_speedups(REPO / "resources" / "papers.yaml")
    assert {n: (p["gpus_from"], p["gpus_to"], p["value"]) for n, p in pub.items()} == {
        "cosmoflow": (512, 2048, 1.77), "unet3d": (256, 512, 1.42)}
    bd = pd.DataFrame(breakdown.breakdown(block, None, pub), columns=breakdown.BREAKDOWN_COLUMNS)
    assert set(bd["compute_basis"]) == {"assumed"} and len(bd) == 5
    assert bd["terms_sum_ms"].to_numpy() == pytest.approx(bd["time_per_iter_ms"].to_numpy())
    ends = bd[bd["paper_id"].notna()]
    assert sorted(zip(ends["network"], ends["gpus"], strict=True)) == [
        ("cosmoflow", 512), ("cosmoflow", 2048), ("unet3d", 256), ("unet3d", 512)]
    assert bd.loc[bd["gpus"] == 1024, "paper_id"].isna().all()
    assert breakdown.published_speedups(REPO / "no-such-papers.yaml") == {}


# -- one GPU judges what one GPU can --------------------------------------------------------------------


def _judge_on(tmp_path, device: dict | None, held_out=None, error=None):
    cfg, tables = BUILDERS["spatial"]()
    if held_out is not None:
        cfg["spatial"]["held_out"] = held_out
    if error is not None:
        tables["tables/runs.csv"]["oracle_error"] = error
    study = _write(tmp_path / "spatial", tables)
    if device is not None:
        (study / "raw" / "device.json").write_text(json.dumps(device))
    return {c["id"]: c for c in spatial_claims.judge(cfg, study)}


H200 = {"device": "cuda", "gpu_count": 1, "gpu_model": "NVIDIA H200"}


def test_on_one_gpu_the_claims_that_need_two_are_not_measured(tmp_path):
    """HAND-MADE tables judged as a run on one GPU (raw/device.json): the 2-rank efficiency and a 2-rank
    held-out run need 2 GPUs; the 1-rank held-out run and the compute term are still judged."""
    c = _judge_on(tmp_path, H200, held_out=["train-d1x1x1", "strong-d1x2x1"])
    eff, oracle = c["strong_efficiency_2"], c["oracle_error"]
    assert eff["status"] == "not_measured"
    assert "strong-d1x2x1: needs 2 GPUs: this run had 1 (NVIDIA H200)" in eff["reason"]
    assert oracle["status"] == "not_measured"
    assert oracle["measured"]["missing"]["strong-d1x2x1"].startswith("needs 2 GPUs")
    assert oracle["measured"]["holds"] == {"train-d1x1x1": True}
    assert c["compute_term"]["status"] == "passed" and c["partitioned_exact"]["status"] == "passed"


def test_on_one_gpu_a_one_rank_held_out_run_that_misses_still_fails(tmp_path):
    c = _judge_on(tmp_path, H200, held_out=["train-d1x1x1", "strong-d1x2x1"], error=0.4)
    assert c["oracle_error"]["status"] == "failed"


def test_with_a_gpu_per_rank_or_on_cpu_cores_the_rule_does_not_apply(tmp_path):
    for i, dev in enumerate((None, {"device": "cpu"}, {**H200, "gpu_count": 2})):
        c = _judge_on(tmp_path / str(i), dev)
        assert c["strong_efficiency_2"]["status"] == "passed", dev
        assert c["oracle_error"]["status"] == "passed", dev
