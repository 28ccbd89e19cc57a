"""The oracle at paper scale from measured layer times (#26): the slab shapes, the calibration table and its
interpolation, the V100 mapping, the pipeline bounds, the sensitivity sweep and the compute-term claim.
CPU tests at toy sizes; the calibration itself on CUDA is marked `cuda`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hpcdl.platform.config import ConfigError, validate_config
from hpcdl.studies.spatial import papers
from hpcdl.studies.spatial.claims import claim_compute_term
from hpcdl.studies.spatial.perfmodel import gpu_table, slabs

REPO = Path(__file__).resolve().parents[1]

TOY = {
    "extrapolate": {
        "grid": 8,
        "in_channels": 1,
        "channels": [2, 2],
        "dense": [4],
        "outputs": 2,
        "batch_size": 2,
        "gpus": [4],
    },
    "papers": {
        "cosmoflow": {"grid": 8, "batch_size": 2, "gpus": [4, 8]},
        "unet3d": {"grid": 8, "in_channels": 1, "levels": [2, 4], "outputs": 2, "batch_size": 2, "gpus": [4]},
    },
    "gpu_calibration": {"repeats": 2, "steps": [["cosmoflow", 4, 2, 1], ["unet3d", 4, 2, 1]]},
}


def _block(test_config, **over):
    cfg = dict(test_config)
    cfg["spatial"] = {**cfg["spatial"], **over}
    return validate_config(cfg)["spatial"]


def test_paper_slab_shapes_are_every_split_of_the_papers_gpu_counts():
    cfg = validate_config(yaml.safe_load((REPO / "configs" / "paper.yaml").read_text()))
    lays = slabs.paper_layouts(cfg["spatial"])
    got: dict = {}
    for x in lays:
        got.setdefault((x["network"], x["gpus"]), []).append((x["depth"], x["height"]))
    got = {k: sorted(v) for k, v in got.items()}
    assert got[("cosmoflow", 512)] == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert len(got[("cosmoflow", 2048)]) == 6 and len(got[("unet3d", 512)]) == 6
    items = slabs.calibration_items(cfg["spatial"])
    ids = [it["id"] for it in items]
    assert len(ids) == len(set(ids))
    # conv0 of CosmoFlow on a 2 x 4 split: 256 x 128 local output planes, batch 1 per GPU
    assert "conv|conv:4>16:k3s1:512x512|d256|h128|b1" in ids
    # a depth-only split of a 'same' conv has its edge correction; the optimizer per network
    assert any(it["kind"] == "correction" for it in items)
    assert sum(it["kind"] == "optimizer" for it in items) == 2
    assert sum(it["kind"] == "step" for it in items) == 3


def test_step_layouts_must_be_paper_layouts_one_pass_can_run():
    test_config = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())
    with pytest.raises(ValueError, match=r"steps\[0\].*not a layout"):
        slabs.step_layouts(_block(test_config, gpu_calibration={"steps": [["cosmoflow", 512, 3, 1]]}))
    # CosmoFlow on 8 depth ranks: conv6 has 1 local plane, its pool 0 (the oracle charges ceil: 1)
    with pytest.raises(ValueError, match="local shape"):
        slabs.step_layouts(_block(test_config, gpu_calibration={"steps": [["cosmoflow", 512, 8, 1]]}))


def _table(tmp_path, rows, gpu="NVIDIA H100 80GB HBM3"):
    path = tmp_path / f"{gpu_table.slug(gpu)}.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    gpu_table.sidecar(path).write_text(json.dumps({"gpu_model": gpu}))
    return gpu_table.GpuCalibration.read(path)


def test_lookup_interpolates_between_measured_neighbours_only(tmp_path):
    key = "conv:4>16:k3s1:512x512"
    rows = [
        {
            "id": slabs.layer_id("conv", key, d, 512, 1),
            "kind": "conv",
            "key": key,
            "axis": "",
            "d": d,
            "h": 512,
            "batch": 1,
            "units": 0,
            "median_s": t,
        }
        for d, t in ((64, 1.0), (256, 4.0))
    ]
    cal = _table(tmp_path, rows)
    item = {
        "id": slabs.layer_id("conv", key, 128, 512, 1),
        "kind": "conv",
        "key": key,
        "d": 128,
        "h": 512,
        "batch": 1,
    }
    assert cal.seconds({**item, "id": rows[0]["id"], "d": 64}) == (1.0, "measured")
    assert cal.seconds(item) == (pytest.approx(2.0), "interpolated")
    with pytest.raises(gpu_table.CalibrationGap, match="extrapolation refused"):
        cal.seconds({**item, "id": "x", "d": 512})
    with pytest.raises(FileNotFoundError, match="provenance"):
        gpu_table.GpuCalibration.read(tmp_path / "other.csv").rows  # noqa: B018


def test_mapping_rule_scales_by_peak_or_bandwidth():
    h100 = {"peak_tflops": 67, "memory_gbs": 3350}
    v100 = {"peak_tflops": 15.7, "memory_gbs": 900}
    dense_conv = {"flops": 1e12, "bytes": 1e9}  # 1000 FLOP/byte: above the ridge (20 FLOP/byte)
    copy = {"flops": 0.0, "bytes": 1e9}
    assert gpu_table.bound(dense_conv, h100) == "flops" and gpu_table.bound(copy, h100) == "memory"
    assert gpu_table.scale(dense_conv, h100, v100) == pytest.approx(67 / 15.7)
    assert gpu_table.scale(copy, h100, v100) == pytest.approx(3350 / 900)
    assert gpu_table.scale(dense_conv, h100, v100, "memory") == pytest.approx(3350 / 900)
    with pytest.raises(ValueError, match="mapping"):
        gpu_table.scale(copy, h100, v100, "guess")


def test_without_a_calibration_the_predictions_say_they_rest_on_the_assumed_efficiency(test_config):
    block = validate_config(test_config)["spatial"]
    rows = pd.DataFrame(papers.paper_predictions(block, None))
    assert (rows["compute_basis"] == "assumed").all() and (rows["interpolated_items"] == 0).all()
    # the input pipeline, both bounds: a rank reads 1 / depth ranks of a sample (LBANN's depth hyperslab)
    grid, ch = block["papers"]["cosmoflow"]["grid"], block["extrapolate"]["in_channels"]
    cf = rows[rows["network"] == "cosmoflow"]
    assert cf["io_read_mb"].to_numpy() == pytest.approx(ch * grid**3 * 4 / cf["depth"].to_numpy() / 1e6)
    assert (rows["io_file_s"] >= rows["io_s"]).all()
    assert (rows["time_per_iter_io_file_s"] >= rows["time_per_iter_s"]).all()


def test_sensitivity_covers_every_assumption_and_moves_with_it(test_config):
    block = validate_config(test_config)["spatial"]
    sens = pd.DataFrame(papers.sensitivity(block, None))
    assert set(sens["assumption"]) == set(block["assumptions"])
    eff = sens[(sens["assumption"] == "machine.efficiency") & (sens["network"] == "cosmoflow")]
    assert eff["speedup"].nunique() > 1  # with assumed compute, the efficiency decides
    assert sens.groupby(["assumption", "network"])["configured"].sum().le(1).all()


def test_paper_yaml_has_no_machine_constant_without_a_source_and_every_assumption_in_the_sweep():
    text = (REPO / "configs" / "paper.yaml").read_text()
    block = text[text.index("\nspatial:") :]
    block = block[: re.search(r"\n[a-z_]+:", block[1:]).start() + 1]
    machine = block[block.index("  machine:") : block.index("  papers:")]
    lines = [ln for ln in machine.splitlines()[1:] if re.match(r"\s+[a-z_]+:", ln)]
    assert lines and all("#" in ln for ln in lines), [ln for ln in lines if "#" not in ln]
    assumed = {"machine." + ln.split(":")[0].strip() for ln in lines if "ASSUMPTION" in ln}
    cfg = validate_config(yaml.safe_load(text))["spatial"]
    assert assumed and assumed <= set(cfg["assumptions"])


def test_assumptions_must_name_keys_the_predictions_read(test_config):
    with pytest.raises(ConfigError, match="spatial.assumptions.machine.nonsense"):
        _block(test_config, assumptions={"machine.nonsense": [1, 2]})
    with pytest.raises(ConfigError, match="spatial.assumptions.machine.overlap"):
        _block(test_config, assumptions={"machine.overlap": [0.5, 1.0]})


def _calibrate(*args: str) -> subprocess.CompletedProcess:
    """`python -m hpcdl spatial-calibrate ARGS` from the repository root."""
    return subprocess.run([sys.executable, "-m", "hpcdl", "spatial-calibrate", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def test_cpu_calibration_at_toy_size_feeds_the_oracle_and_the_compute_check(tmp_path, test_config):
    cfg = dict(test_config)
    cfg["spatial"] = {**cfg["spatial"], **TOY}
    cfg["data"] = {**cfg.get("data", {}), "resources_dir": str(tmp_path / "res")}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "cal"
    got = _calibrate("--config", str(path), "--device", "cpu", "--out", str(out))
    assert got.returncode == 0, got.stderr
    csv = Path(got.stdout.strip().splitlines()[-1])
    meta = json.loads(gpu_table.sidecar(csv).read_text())
    assert {"gpu_model", "driver", "cuda", "cudnn", "torch", "date", "command"} <= set(meta)
    assert "spatial-calibrate" in meta["command"] and meta["device"] == "cpu"
    block = validate_config(cfg)["spatial"]
    table = pd.read_csv(csv)
    assert set(table["id"]) == {it["id"] for it in slabs.calibration_items(block)}
    assert (table["median_s"] > 0).all() and (table["p25_s"] <= table["p75_s"]).all()
    assert (table["repeats"] == 2).all()
    cal = gpu_table.GpuCalibration.read(csv)
    block["gpu_calibration"]["datasheets"][gpu_table.slug(cal.gpu_model)] = {
        "peak_tflops": 1.0,
        "memory_gbs": 50.0,
        "memory_gb": 8.0,
        "source": "test: a stand-in CPU datasheet",
    }
    rows = pd.DataFrame(papers.paper_predictions(block, cal, every_basis=True))
    assert set(rows["compute_basis"]) == {"mapped", "calibrated", "assumed"}
    # every paper layout's shapes were measured: nothing interpolated
    assert (rows.loc[rows["compute_basis"] != "assumed", "interpolated_items"] == 0).all()
    mapped, itself = (rows[rows["compute_basis"] == b].reset_index() for b in ("mapped", "calibrated"))
    assert (mapped["compute_s"] != itself["compute_s"]).all()  # the mapping moves the compute term
    check = pd.DataFrame(papers.compute_check(cal))
    assert len(check) == 2 and (check["measured_step_s"] > 0).all() and (check["oracle_compute_s"] > 0).all()
    c = claim_compute_term(block, check)
    assert c["status"] in ("passed", "failed") and set(c["measured"]["error"]) == {
        "cosmoflow 2x1",
        "unet3d 2x1",
    }


def test_compute_term_claim_is_not_measured_without_a_gpu_calibration(test_config):
    c = claim_compute_term(validate_config(test_config)["spatial"], pd.DataFrame())
    assert c["status"] == "not_measured" and "spatial-calibrate" in c["reason"]


def test_plan_counts_items_and_a_budget(tmp_path):
    got = _calibrate("--config", str(REPO / "configs" / "paper.yaml"), "--plan")
    assert got.returncode == 0, got.stderr
    plan = json.loads(got.stdout)
    assert plan["items"] > 500 and plan["by_kind"]["step"] == 3


@pytest.mark.cuda
def test_gpu_calibration_of_the_papers_layouts_on_cuda(tmp_path, test_config):
    from hpcdl.studies.spatial import gpucal

    cfg = dict(test_config)
    cfg["spatial"] = {**cfg["spatial"], **TOY}
    block = validate_config(cfg)["spatial"]
    csv = gpucal.run(block, "cuda", tmp_path, "test")
    meta = json.loads(gpu_table.sidecar(csv).read_text())
    assert meta["cuda"] and meta["cudnn"] and meta["tf32"] is False
    assert (pd.read_csv(csv)["median_s"] > 0).all()
