"""The oracle at paper scale from measured layer times (#26): the slab shapes, the calibration table and its
interpolation, the V100 mapping, the pipeline bounds, the sensitivity sweep and the compute-term claim.
CPU tests at toy sizes; the calibration itself on CUDA is marked `cuda`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.studies.spatial.calibration import gpu_plan
from hpcdl.studies.spatial.claim_families.gpu_compute import claim_compute_term
from hpcdl.studies.spatial.paper_scale import compute_check, predictions
from hpcdl.studies.spatial.perfmodel import gpu_table, layouts, slabs

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
    # held out: 3 ranks per CosmoFlow sample, between the papers' 2 and 4 (the oracle interpolates it)
    "gpu_calibration": {"repeats": 2, "steps": [["cosmoflow", 4, 2, 1], ["unet3d", 4, 2, 1]],
                        "held_out_steps": [["cosmoflow", 3, 1]]},
}


def _n_toy(test_config) -> int:
    """Items of the TOY calibration."""
    cfg = dict(test_config)
    cfg["spatial"] = {**cfg["spatial"], **TOY}
    return len(layouts.calibration_items(validate_config(cfg)["spatial"]))


def _block(test_config, **over):
    cfg = dict(test_config)
    cfg["spatial"] = {**cfg["spatial"], **over}
    return validate_config(cfg)["spatial"]


def test_paper_slab_shapes_are_every_split_of_the_papers_gpu_counts():
    cfg = validate_config(yaml.safe_load((REPO / "configs" / "paper.yaml").read_text()))
    lays = layouts.paper_layouts(cfg["spatial"])
    got: dict = {}
    for x in lays:
        got.setdefault((x["network"], x["gpus"]), []).append((x["depth"], x["height"]))
    got = {k: sorted(v) for k, v in got.items()}
    assert got[("cosmoflow", 512)] == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert len(got[("cosmoflow", 2048)]) == 6 and len(got[("unet3d", 512)]) == 6
    items = layouts.calibration_items(cfg["spatial"])
    ids = [it["id"] for it in items]
    assert len(ids) == len(set(ids))
    # conv0 of CosmoFlow on a 2 x 4 split: 256 x 128 local output planes, batch 1 per GPU
    assert "conv|conv:4>16:k3s1:512x512|d256|h128|b1" in ids
    # a depth-only split of a 'same' conv has its edge correction; the optimizer per network
    assert any(it["kind"] == "correction" for it in items)
    assert sum(it["kind"] == "optimizer" for it in items) == 2
    # #57: whole steps of both networks, the 2048-GPU slabs among them, and two held out
    steps = [it for it in items if it["kind"] == "step"]
    assert len(steps) >= 6 and {it["network"] for it in steps} == {"cosmoflow", "unet3d"}
    assert 2048 in {it["gpus"] for it in steps}
    assert sum(it["kind"] == "heldout_step" for it in items) == 2
    # the fixed costs per layer kind and per network's optimizer, alone and chained
    assert {it["id"] for it in items if it["kind"] == "fixed"} == {
        f"fixed|{k}|{m}" for m in ("alone", "chained")
        for k in ("conv", "pool", "deconv", "dense", "optimizer:cosmoflow", "optimizer:unet3d")}
    # every halo pack/unpack has its copies to and from pinned host memory
    assert sum(it["kind"] == "face" for it in items) == sum(it["kind"] == "halo" for it in items) > 0


def test_step_layouts_must_be_paper_layouts_and_held_out_steps_must_not():
    test_config = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())
    with pytest.raises(ValueError, match=r"steps\[0\].*not a layout"):
        layouts.step_layouts(_block(test_config, gpu_calibration={"steps": [["cosmoflow", 512, 3, 1]]}))
    # CosmoFlow on 8 and 32 depth ranks: conv6 has 1 local plane, which a plain pass pools to 0; the step
    # runs every layer at the oracle's local shape (pools round up), so those slabs are checked too
    lays = layouts.step_layouts(_block(test_config, gpu_calibration={"steps": [["cosmoflow", 512, 8, 1],
                                                                             ["cosmoflow", 2048, 32, 1]]}))
    assert [(x["depth"], x["gpus"]) for x in lays] == [(8, 512), (32, 2048)]
    with pytest.raises(ValueError, match=r"held_out_steps\[0\].*a layout of spatial.papers"):
        layouts.calibration_items(_block(test_config,
                                       gpu_calibration={"held_out_steps": [["cosmoflow", 4, 2]]}))
    # 2 ranks per sample: conv0 has 256 x 512 planes, more than any paper layout's (<= 64 x 512): refused
    with pytest.raises(ValueError, match=r"held_out_steps\[0\].*outside the sizes.*would extrapolate"):
        layouts.calibration_items(_block(test_config,
                                       gpu_calibration={"held_out_steps": [["cosmoflow", 2, 1]]}))


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
    rows = pd.DataFrame(predictions.paper_predictions(block, None))
    assert (rows["compute_basis"] == "assumed").all() and (rows["interpolated_items"] == 0).all()
    # the input pipeline, both bounds: a rank reads 1 / depth ranks of a sample (LBANN's depth hyperslab)
    grid, ch = block["papers"]["cosmoflow"]["grid"], block["extrapolate"]["in_channels"]
    cf = rows[rows["network"] == "cosmoflow"]
    assert cf["io_read_mb"].to_numpy() == pytest.approx(ch * grid**3 * 4 / cf["depth"].to_numpy() / 1e6)
    assert (rows["io_file_s"] >= rows["io_s"]).all()
    assert (rows["time_per_iter_io_file_s"] >= rows["time_per_iter_s"]).all()


def test_sensitivity_covers_every_assumption_and_moves_with_it(test_config):
    block = validate_config(test_config)["spatial"]
    sens = pd.DataFrame(predictions.sensitivity(block, None))
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
    """`python -m hpcdl spatial calibrate ARGS` from the repository root."""
    return subprocess.run([sys.executable, "-m", "hpcdl", "spatial", "calibrate", *args], capture_output=True,
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
    assert "spatial calibrate" in meta["command"] and meta["device"] == "cpu"
    block = validate_config(cfg)["spatial"]
    table = pd.read_csv(csv)
    assert set(table["id"]) == {it["id"] for it in layouts.calibration_items(block)}
    assert (table["median_s"] > 0).all() and (table["p25_s"] <= table["p75_s"]).all()
    assert (table["repeats"] == 2).all()
    cal = gpu_table.GpuCalibration.read(csv)
    block["gpu_calibration"]["datasheets"][gpu_table.slug(cal.gpu_model)] = {
        "peak_tflops": 1.0,
        "memory_gbs": 50.0,
        "memory_gb": 8.0,
        "source": "test: a stand-in CPU datasheet",
    }
    rows = pd.DataFrame(predictions.paper_predictions(block, cal, every_basis=True))
    assert set(rows["compute_basis"]) == {"mapped", "calibrated", "assumed"}
    # every paper layout's shapes were measured: nothing interpolated
    assert (rows.loc[rows["compute_basis"] != "assumed", "interpolated_items"] == 0).all()
    priced = rows.loc[rows["compute_basis"] != "assumed", "fixed_cost"]
    assert (priced == "measured (alone out, chained in)").all()
    # the mapping moves the compute term: every item as timed (fixed_cost none; with the fixed costs, a toy
    # layer's work may be below its kind's chained cost, the host's, which is not mapped)
    plain = {**block, "gpu_calibration": {**block["gpu_calibration"], "fixed_cost": "none"}}
    rows = pd.DataFrame(predictions.paper_predictions(plain, cal, every_basis=True))
    mapped, itself = (rows[rows["compute_basis"] == b].reset_index() for b in ("mapped", "calibrated"))
    assert (mapped["compute_s"] != itself["compute_s"]).all()
    check = pd.DataFrame(compute_check.compute_check(cal))
    assert len(check) == 3 and (check["measured_step_s"] > 0).all() and (check["oracle_compute_s"] > 0).all()
    assert list(check["sample"]) == ["in_sample", "in_sample", "held_out"]
    # the held-out step's layers are not all timed: some are interpolated
    assert check.loc[check["sample"] == "held_out", "interpolated_items"].iloc[0] > 0
    # the fixed costs were measured on this device (the same item code as on a GPU) and priced per layer
    assert (check["fixed_cost"] == "measured (alone out, chained in)").all()
    c = claim_compute_term(block, check)
    assert c["status"] in ("passed", "failed") and set(c["measured"]["error"]) == {
        "cosmoflow 2x1",
        "unet3d 2x1",
        "held out cosmoflow 3x1",
    }


def test_compute_term_claim_is_not_measured_without_a_gpu_calibration(test_config):
    c = claim_compute_term(validate_config(test_config)["spatial"], pd.DataFrame())
    assert c["status"] == "not_measured" and "spatial calibrate" in c["reason"]


def test_plan_counts_items_and_a_budget_with_cudnn_search(tmp_path):
    got = _calibrate("--config", str(REPO / "configs" / "paper.yaml"), "--plan", "--budget-s", "140")
    assert got.returncode == 0, got.stderr
    plan = json.loads(got.stdout)
    assert plan["items"] > 500 and plan["by_kind"]["step"] == 7 and plan["by_kind"]["heldout_step"] == 2
    # cuDNN's benchmark-mode search per distinct conv shape (~350 at the papers' shapes), in the total
    assert 300 <= plan["conv_shapes_searched"] <= 400
    tiers = plan["tiers"]
    assert plan["order"] == list(gpu_plan.TIERS)
    assert [t for t in tiers if t in gpu_plan.TIERS] == plan["order"]
    assert sum(tiers[t]["items"] for t in plan["order"]) == plan["items"]
    # the settings tier, setting by setting: each network's first and last GPU counts, then the others
    assert plan["settings"] == ["setting cosmoflow 512", "setting cosmoflow 2048", "setting unet3d 256",
                                "setting unet3d 512", "setting cosmoflow 1024"]
    assert sum(tiers[t]["items"] for t in plan["settings"]) == tiers["settings"]["items"]
    searched = sum(tiers[t]["search_s"] for t in plan["order"])
    assert plan["estimated_search_s"] == pytest.approx(searched, abs=0.5)
    assert plan["estimated_total_s"] > plan["estimated_search_s"] > 0
    assert plan["estimated_total_s"] == tiers[plan["order"][-1]]["cumulative_s"]
    assert "estimate" in plan["estimate"] and 0 < plan["items_within_budget_estimate"] <= plan["items"]
    assert re.search(r"plan: \d+ items, about [\d.]+ s .* cuDNN's algorithm search over \d+ conv shapes \(an "
                     r"estimate", got.stderr), got.stderr


def test_a_missing_config_or_a_bad_budget_is_a_clear_error(tmp_path, capsys):
    from hpcdl.studies.spatial.calibration import gpu

    nope = ["--config", str(tmp_path / "nope.yaml"), "--device", "cpu", "--out", str(tmp_path)]
    assert gpu.main(nope) == 2
    assert f"config file {tmp_path / 'nope.yaml'} does not exist" in capsys.readouterr().err
    for bad in ("0", "-3", "soon", "nan"):
        with pytest.raises(SystemExit) as exc:
            gpu.main(["--config", str(REPO / "configs" / "paper.yaml"), "--plan", "--budget-s", bad])
        assert exc.value.code == 2, bad
        err = capsys.readouterr().err
        assert f"argument --budget-s: must be a positive number of seconds, got '{bad}'" in err
    assert not list(tmp_path.iterdir())


# -- the calibration as a journal (#42): rows as items finish, resume, budget, priority ------------------


def _toy(tmp_path, test_config, repeats=2) -> tuple[Path, dict]:
    """A toy config file (TOY, `repeats` timed calls per item) and its validated spatial block."""
    cfg = dict(test_config)
    cal = {**TOY["gpu_calibration"], "repeats": repeats}
    cfg["spatial"] = {**cfg["spatial"], **TOY, "gpu_calibration": cal}
    cfg["data"] = {**cfg.get("data", {}), "resources_dir": str(tmp_path / "res")}
    path = tmp_path / f"toy-{repeats}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, validate_config(cfg)["spatial"]


def _data_rows(csv: Path) -> int:
    """Complete data lines in a table being appended to."""
    return max(csv.read_text().count("\n") - 1, 0) if csv.exists() else 0


def _order(block) -> list[str]:
    return [it["id"] for _, it in gpu_plan.ordered(layouts.calibration_items(block))]


def test_rows_are_appended_as_items_finish_and_a_sigkilled_run_resumes_to_the_uninterrupted_table(
    tmp_path, test_config
):
    config, block = _toy(tmp_path, test_config, repeats=40)  # some 0.05 s per item on the CPU
    out = tmp_path / "cal"
    cmd = [sys.executable, "-m", "hpcdl", "spatial", "calibrate", "--config", str(config), "--device", "cpu",
           "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        csv = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(out.glob("*.csv"))
            if found and _data_rows(found[0]) >= 5:
                csv = found[0]
                break
            time.sleep(0.02)
        assert csv is not None, "no 5 rows while the calibration ran"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    before = gpu_table.read_rows(csv)
    total = len(_order(block))
    assert 5 <= len(before) < total  # killed mid-run, and the rows of finished items were on disk
    killed = gpu_table.GpuCalibration.read(csv)
    assert killed.partial and "partial calibration" in killed.status()

    got = _calibrate(*cmd[5:])
    assert got.returncode == 0, got.stderr
    assert f"resuming, {len(before)} of {total} items already measured" in got.stderr
    after = pd.read_csv(csv)
    assert after["id"].is_unique and list(after["id"]) == _order(block)
    # the rows measured before the kill were kept, not measured again
    kept = after.set_index("id").loc[before["id"]]
    assert (kept["median_s"].to_numpy() == before["median_s"].to_numpy()).all()
    assert (kept["session"] == 0).all()
    assert (after.set_index("id").drop(before["id"])["session"] == 1).all()
    meta = json.loads(gpu_table.sidecar(csv).read_text())
    assert meta["partial"] is False and meta["items_measured"] == total
    assert [x["stopped"] for x in meta["sessions"]] == ["interrupted", "complete"]

    whole = _calibrate("--config", str(config), "--device", "cpu", "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    assert list(pd.read_csv(whole.stdout.strip().splitlines()[-1])["id"]) == list(after["id"])


def test_a_half_written_last_line_is_dropped_and_its_item_measured_again(tmp_path, test_config):
    config, block = _toy(tmp_path, test_config)
    args = ("--config", str(config), "--device", "cpu", "--out", str(tmp_path / "cal"))
    got = _calibrate(*args)
    assert got.returncode == 0, got.stderr
    csv = Path(got.stdout.strip().splitlines()[-1])
    full = pd.read_csv(csv)
    text = csv.read_text()
    last = text.rstrip("\n").rfind("\n") + 1
    csv.write_text(text[: last + (len(text) - last) // 2])  # killed while writing the last row
    assert list(gpu_table.read_rows(csv)["id"]) == list(full["id"][:-1])
    again = _calibrate(*args)
    assert again.returncode == 0, again.stderr
    table = pd.read_csv(csv)
    assert list(table["id"]) == list(full["id"])
    assert (table["session"].to_numpy() == [0] * (len(full) - 1) + [1]).all()


def test_search_column_and_priority_order(tmp_path, test_config):
    config, block = _toy(tmp_path, test_config)
    env = {**os.environ, "HPCDL_PROGRESS": "1"}
    cmd = ["--config", str(config), "--device", "cpu", "--out", str(tmp_path / "cal")]
    got = subprocess.run([sys.executable, "-m", "hpcdl", "spatial", "calibrate", *cmd], capture_output=True,
                         text=True, cwd=REPO, timeout=300, env=env)
    assert got.returncode == 0, got.stderr
    # stderr is not a terminal here: progress as plain lines, no redrawn bar
    n = _n_toy(test_config)
    assert "\r" not in got.stderr and re.search(rf"\] \d+/{n} items \(tier predictions\)", got.stderr)
    table = pd.read_csv(got.stdout.strip().splitlines()[-1])
    assert {"search_s", "ref_s", "session"} <= set(table)
    assert (table["search_s"] >= 0).all() and table["search_s"].notna().all() and (table["ref_s"] > 0).all()
    order = gpu_plan.ordered(layouts.calibration_items(block))
    assert list(table["id"]) == [it["id"] for _, it in order]
    tiers = [t for t, _ in order]
    assert tiers == sorted(tiers, key=gpu_plan.TIERS.index) and tiers[0] == "predictions"
    # each whole step after every layer compute_check sums for it, the held-out ones after them all
    steps = [i for i, (_, it) in enumerate(order) if it["kind"] == "step"]
    held = [i for i, (_, it) in enumerate(order) if it["kind"] == "heldout_step"]
    where = {it["id"]: i for i, (_, it) in enumerate(order)}
    for i in steps:
        it = order[i][1]
        assert all(where[x["id"]] < i for x in slabs.step_layer_items(it["spec"], it["depth"], it["height"]))
    assert max(steps) < min(held) and all(order[i][0] == "compute_term" for i in steps + held)
    # then the settings one at a time, in setting order
    ranks = [it["setting_rank"] for t, it in order if t == "settings"]
    assert ranks == sorted(ranks)


def _stand_in_sheet(block, cal):
    block["gpu_calibration"]["datasheets"][gpu_table.slug(cal.gpu_model)] = {
        "peak_tflops": 1.0, "memory_gbs": 50.0, "memory_gb": 8.0, "source": "test: a stand-in CPU datasheet"}


def test_budget_stops_early_marked_partial_and_a_rerun_finishes_it(tmp_path, test_config):
    config, block = _toy(tmp_path, test_config, repeats=40)
    args = ("--config", str(config), "--device", "cpu", "--out", str(tmp_path / "cal"))
    got = _calibrate(*args, "--budget-s", "0.5")
    assert got.returncode == 0, got.stderr
    csv = Path(got.stdout.strip().splitlines()[-1])
    meta = json.loads(gpu_table.sidecar(csv).read_text())
    n = len(pd.read_csv(csv))
    total = _n_toy(test_config)
    assert meta["partial"] is True and meta["items_measured"] == n and 1 <= n < meta["items"] == total
    assert meta["sessions"][-1]["stopped"] == "budget"
    assert f"partial: {n} of {total} items measured" in got.stderr
    assert "rerun `python -m hpcdl spatial calibrate" in got.stderr
    # the readers: what a partial table cannot bracket is refused naming the partial table; the predictions
    # then rest on the assumed efficiency and say why
    cal = gpu_table.GpuCalibration.read(csv)
    _stand_in_sheet(block, cal)
    items = layouts.calibration_items(block)
    missing = next(it for it in items if it["id"] not in cal.by_id and it["kind"] == "conv")
    with pytest.raises(gpu_table.CalibrationGap, match=f"partial calibration: {n} of {total} items measured"):
        cal.seconds({**missing, "d": 10**6, "id": "x"})
    rows = pd.DataFrame(predictions.paper_predictions(block, cal))
    # either basis is labelled: on the partial table (interpolated), or assumed saying why not on it
    label = (rf"partial calibration: {n} of {total} items measured"
             rf"|not used: .*partial calibration: {n} of {total}")
    assert rows["basis"].str.contains(label).all() and len(rows) == 3
    assert len(pd.DataFrame(predictions.sensitivity(block, cal))) > 0

    again = _calibrate(*args)
    assert again.returncode == 0, again.stderr
    table = pd.read_csv(csv)
    assert list(table["id"]) == _order(block)
    meta = json.loads(gpu_table.sidecar(csv).read_text())
    assert meta["partial"] is False and meta["items_measured"] == total
    assert [s["stopped"] for s in meta["sessions"]] == ["budget", "complete"]


def test_the_first_tier_alone_lets_every_paper_layout_be_predicted(tmp_path, test_config):
    """A table cut after the `predictions` tier (as a budget would leave it): every setting predicted on the
    measured basis, the rest interpolated and labelled; the compute check skips nothing it has."""
    config, block = _toy(tmp_path, test_config)
    got = _calibrate("--config", str(config), "--device", "cpu", "--out", str(tmp_path / "cal"))
    assert got.returncode == 0, got.stderr
    csv = Path(got.stdout.strip().splitlines()[-1])
    first = {it["id"] for t, it in gpu_plan.ordered(layouts.calibration_items(block)) if t == "predictions"}
    table = pd.read_csv(csv)
    table[table["id"].isin(first)].to_csv(csv, index=False)
    meta = json.loads(gpu_table.sidecar(csv).read_text())
    gpu_table.sidecar(csv).write_text(json.dumps({**meta, "partial": True}))
    cal = gpu_table.GpuCalibration.read(csv)
    assert cal.partial and cal.measured_items == len(first) < cal.total_items
    _stand_in_sheet(block, cal)
    rows = pd.DataFrame(predictions.paper_predictions(block, cal, every_basis=True))
    assert set(rows["compute_basis"]) == {"mapped", "calibrated", "assumed"}
    measured = rows[rows["compute_basis"] != "assumed"]
    assert (measured["interpolated_items_all_splits"] > 0).any()
    total = _n_toy(test_config)
    cut = f"partial calibration: {len(first)} of {total} items measured"
    assert measured["basis"].str.contains(cut).all()
    assert compute_check.compute_check(cal) == []  # no step measured yet: nothing to check, no crash
    # cut to its first row: no split of any setting can be timed from it; the headline says why it is not used
    table[table["id"].isin(first)].head(1).to_csv(csv, index=False)
    cal = gpu_table.GpuCalibration.read(csv)
    rows = pd.DataFrame(predictions.paper_predictions(block, cal))
    assert (rows["compute_basis"] == "assumed").all()
    unused = f"the GPU calibration is not used: .*partial calibration: 1 of {total}"
    assert rows["basis"].str.contains(unused).all()
    assert len(pd.DataFrame(predictions.sensitivity(block, cal))) > 0


def test_at_the_papers_shapes_the_first_tiers_cover_every_prediction_and_the_compute_check():
    """configs/paper.yaml: a table of the `predictions` tier alone (stand-in times: this checks coverage,
    not values) predicts every setting on the measured bases; with the `compute_term` tier every step is
    checked."""
    block = validate_config(yaml.safe_load((REPO / "configs" / "paper.yaml").read_text()))["spatial"]
    order = gpu_plan.ordered(layouts.calibration_items(block))
    meta = {"gpu_model": "NVIDIA H100 80GB HBM3", "partial": True, "items": len(order),
            "block": {k: block[k] for k in ("papers", "extrapolate", "machine", "gpu_calibration")}}
    for tiers, steps in ((("predictions",), 0), (("predictions", "compute_term"), 9)):
        rows = pd.DataFrame([{"id": it["id"], "kind": it["kind"], "key": it["key"],
                              "network": it.get("network", ""),
                              "axis": it.get("axis", ""), "d": it.get("d", it.get("depth", 0)),
                              "h": it.get("h", it.get("height", 0)), "batch": it["batch"],
                              "units": it.get("units", 0), "median_s": 1e-3, "p25_s": 1e-3, "p75_s": 1e-3}
                             for t, it in order if t in tiers])
        cal = gpu_table.GpuCalibration(rows, meta)
        pred = pd.DataFrame(predictions.paper_predictions(block, cal, every_basis=True))
        assert (pred["compute_basis"].value_counts() == 5).all() and len(pred) == 15
        assert (pred.loc[pred["compute_basis"] != "assumed", "interpolated_items_all_splits"] > 0).all()
        # each row counts its own layout's items, measured and interpolated
        assert (pred.loc[pred["compute_basis"] != "assumed", "measured_items"] > 0).all()
        assert len(compute_check.compute_check(cal)) == steps
    assert sum(t == "predictions" for t, _ in order) < len(order) / 3


@pytest.mark.cuda
def test_gpu_calibration_of_the_papers_layouts_on_cuda(tmp_path, test_config):
    from hpcdl.studies.spatial.calibration import gpu

    cfg = dict(test_config)
    cfg["spatial"] = {**cfg["spatial"], **TOY}
    block = validate_config(cfg)["spatial"]
    csv = gpu.run(block, "cuda", tmp_path, "test")
    meta = json.loads(gpu_table.sidecar(csv).read_text())
    assert meta["cuda"] and meta["cudnn"] and meta["tf32"] is False and meta["partial"] is False
    assert meta["cudnn_benchmark"] is True and meta["sessions"][-1]["stopped"] == "complete"
    table = pd.read_csv(csv)
    assert (table["median_s"] > 0).all() and (table["search_s"] >= 0).all() and (table["ref_s"] > 0).all()
    assert list(table["id"]) == [it["id"] for _, it in gpu_plan.ordered(layouts.calibration_items(block))]
