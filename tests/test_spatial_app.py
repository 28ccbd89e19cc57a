"""The spatial task app end to end on the tiny test config, then its tables, figures and claims stages."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import yaml

from hpcdl.platform import load_config, read_table
from hpcdl.platform.orchestration.cli import main as cli
from tasks.spatial import main as app


@pytest.mark.slow
def test_spatial_app_end_to_end(tmp_path):
    cfg = yaml.safe_load(open("configs/test.yaml"))
    cfg.update(results_dir=str(tmp_path / "results"), studies=["spatial"],
               data={**cfg["data"], "resources_dir": str(tmp_path / "resources")})
    # device auto: the host here, the GPU (shared by a run's ranks where it has fewer) on a GPU machine
    # two calibration rounds: repeat 0 is predicted by round 0's own oracle (tables.oracle_repeats)
    cfg["spatial"] = {**cfg["spatial"], "gpu_sharing": True,
                      "calibration": {**cfg["spatial"]["calibration"], "rounds": 2}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    app(["--config", str(path)])
    out = tmp_path / "results" / "spatial"
    runs = pd.read_csv(out / "raw" / "runs.csv")
    assert list(runs["status"]) == ["ok"] * 5
    # every table says where it was measured: the resolved device, and how the ranks talked
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert set(runs["device"]) == {device}
    if device == "cpu":
        assert set(runs["placement"]) == {"cpu (gloo)"}
        for table in ("ranks", "exactness", "calibration"):
            assert set(pd.read_csv(out / "raw" / f"{table}.csv")["placement"]) == {"cpu (gloo)"}, table
    assert set(runs["run"]) == {"strong-d1x1x1", "strong-d1x2x1", "hybrid-d2x1x1", "ceiling-d1x2x1",
                                "train-d1x1x1"}
    iters = pd.read_csv(out / "raw" / "iterations.csv")
    assert {"io_s", "compute_s", "halo_s", "allreduce_s", "total_s", "loss", "cpu_s", "machine_busy_s",
            "steal_s"} <= set(iters.columns)
    # every iteration carries this rank's CPU seconds and the machine's busy seconds from /proc/stat
    assert iters["cpu_s"].gt(0).all() and iters["machine_busy_s"].ge(0).all()
    ceiling = iters[iters["run"] == "ceiling-d1x2x1"]
    assert (ceiling[["halo_s", "gather_s", "allreduce_s"]] == 0).all(axis=None)  # no communication at all
    # #59: the ceiling is measured in its strong run's launch, step for step, every iteration of both
    strong2 = iters[iters["run"] == "strong-d1x2x1"]
    assert sorted(ceiling["iteration"]) == sorted(strong2["iteration"])
    assert (strong2[["halo_s", "gather_s"]].sum(axis=1) > 0).all()
    pair = runs.set_index("run").loc[["strong-d1x2x1", "ceiling-d1x2x1"]]
    assert list(pair["launch_wall_s"].round(6).unique()) == [round(pair["launch_wall_s"].iloc[0], 6)]
    assert pair.loc["ceiling-d1x2x1", "paired_with"] == "strong-d1x2x1"
    cal = pd.read_csv(out / "raw" / "calibration.csv")
    assert {"round", "other_cpu_s", "section_s"} <= set(cal.columns)
    assert cal["other_cpu_s"].ge(0).all() and cal["section_s"].gt(0).all()
    assert (out / "raw" / "runs.provenance.json").exists()
    assert list((tmp_path / "resources" / "spatial").glob("grf-16x16x16-*/fields.npy"))
    for stage in ("tables", "figures", "claims"):
        assert cli(["spatial", stage, "--config", str(path)]) == 0
    table = pd.read_csv(out / "tables" / "runs.csv")
    assert set(table["device"]) == {device}
    trained = table[table["kind"] != "ceiling"]
    assert trained["pred_time_per_iter_s"].gt(0).all() and table["time_per_iter_s"].gt(0).all()
    assert {"phases", "phases_disturbed", "other_load_cores", "disturbed"} <= set(table.columns)
    strong2 = table[table["run"] == "strong-d1x2x1"].iloc[0]
    assert strong2["efficiency_vs_ceiling"] == pytest.approx(strong2["speedup"] / strong2["ceiling_speedup"])
    papers = pd.read_csv(out / "tables" / "paper_predictions.csv")
    assert [(r.network, r.gpus, r.spatial_split) for r in papers.itertuples()] == [
        ("cosmoflow", 512, 8), ("cosmoflow", 1024, 16), ("cosmoflow", 2048, 32), ("unet3d", 256, 16),
        ("unet3d", 512, 32)]
    assert papers["time_per_iter_s"].gt(0).all()
    assert (papers["depth"] * papers["height"] == papers["spatial_split"]).all()
    # no calibration under this run's resources_dir: the breakdown rests on the assumed efficiency, its
    # terms add up to the time per iteration
    breakdown = pd.read_csv(out / "tables" / "paper_breakdown.csv")
    assert len(breakdown) == 5 and (breakdown["compute_basis"] == "assumed").all()
    assert breakdown["terms_sum_ms"].to_numpy() == pytest.approx(breakdown["time_per_iter_ms"].to_numpy())
    for fig in ("strong_scaling", "weak_scaling", "efficiency", "oracle_parity", "extrapolation",
                "paper_predictions", "memory", "loss"):
        assert (out / "figures" / f"{fig}.png").stat().st_size > 1000
    claims = {c["id"]: c for c in json.loads((out / "claims.json").read_text())["claims"]}
    assert set(claims) == {"partitioned_exact", "strong_efficiency_2", "oracle_error", "loss_falls",
                           "oracle_picks_spatial", "compute_term"}
    # no GPU calibration under this run's resources_dir (tmp): the whole-step check is not measured
    assert claims["compute_term"]["status"] == "not_measured"
    eff = claims["strong_efficiency_2"]["measured"]
    assert set(eff["speedup"]) == set(eff["ceiling_speedup"]) == {"strong-d1x2x1"}
    assert "strong-d1x2x1" in eff["disturbed_phases_excluded"]
    assert claims["partitioned_exact"]["passed"]
    assert claims["partitioned_exact"]["measured"]["max_relative_error"]["1x2x1"] < 1e-10  # per layout
    oracle = claims["oracle_error"]["measured"]
    runs = pd.read_csv(out / "tables" / "runs.csv")
    runs = runs[runs["kind"] != "ceiling"]  # not a training run: outside the oracle's claim
    # judged on the held-out run alone (test.yaml: the 12^3 train run), the in-sample runs beside it
    held = runs["run"].isin(cfg["spatial"]["held_out"])
    assert list(runs.loc[held, "oracle_sample"]) == ["held_out"] and oracle["held_out"] == ["train-d1x1x1"]
    within = held & (runs["ranks"] <= oracle["cores"])
    assert oracle["mean_abs_error"] == pytest.approx(runs.loc[held, "oracle_error"].abs().mean())
    assert oracle["mean_abs_error_ranks_within_cores"] == pytest.approx(
        runs.loc[within, "oracle_error"].abs().mean())
    inside = runs.loc[~held, "oracle_error"].abs().mean()
    assert oracle["in_sample"]["mean_abs_error"] == pytest.approx(inside)
    assert oracle["calibration"]["rows_held_out"] == 0  # neither calibrated model has a 12^3 shape
    # the held-out run's repeat 0 against the oracle fitted on calibration round 0 alone
    from hpcdl.studies.spatial import tables as spatial_tables

    block = load_config(path)["spatial"]
    assert sorted(cal["round"].unique()) == [0, 1]
    raw = [read_table(out / "raw" / f"{t}.csv") for t in ("runs", "iterations", "ranks")]
    measured = spatial_tables._summaries(*raw, block["warmup"], block["timing_statistic"],
                                         block["disturbed_load_cores"])
    own = spatial_tables._round_predictions(read_table(out / "raw" / "calibration.csv").query("round == 0"),
                                            block, measured)[0]
    reps = pd.read_csv(out / "tables" / "oracle_repeats.csv").set_index(["run", "repeat"])
    assert reps.loc[("train-d1x1x1", 0), "pred_round"] == 0
    assert reps.loc[("train-d1x1x1", 0), "pred_time_per_iter_s"] == pytest.approx(own["train-d1x1x1"])
    assert reps.loc[("train-d1x1x1", 0), "pred_time_per_iter_s"] != pytest.approx(
        runs.set_index("run").loc["train-d1x1x1", "pred_time_per_iter_s"], rel=1e-9)  # not the mean fit
