"""The spatial task app end to end on the tiny test config, then aggregate, plot and claims."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from hpcdl.cli import main as cli
from tasks.spatial import main as app


@pytest.mark.slow
def test_spatial_app_end_to_end(tmp_path):
    cfg = yaml.safe_load(open("configs/test.yaml"))
    cfg.update(results_dir=str(tmp_path / "results"), studies=["spatial"],
               data={**cfg["data"], "resources_dir": str(tmp_path / "resources")})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    app(["--config", str(path)])
    out = tmp_path / "results" / "spatial"
    runs = pd.read_csv(out / "raw" / "runs.csv")
    assert list(runs["status"]) == ["ok"] * 4
    assert set(runs["run"]) == {"strong-d1x1x1", "strong-d1x2x1", "hybrid-d2x1x1", "train-d1x1x1"}
    iters = pd.read_csv(out / "raw" / "iterations.csv")
    assert {"io_s", "compute_s", "halo_s", "allreduce_s", "total_s", "loss"} <= set(iters.columns)
    assert (out / "raw" / "runs.provenance.json").exists()
    assert list((tmp_path / "resources" / "spatial").glob("grf-16x16x16-*/fields.npy"))
    for step in ("aggregate", "plot", "claims"):
        assert cli([step, "spatial", "--config", str(path)]) == 0
    table = pd.read_csv(out / "tables" / "runs.csv")
    assert table["pred_time_per_iter_s"].gt(0).all() and table["time_per_iter_s"].gt(0).all()
    for fig in ("strong_scaling", "weak_scaling", "oracle_parity", "extrapolation", "memory", "loss"):
        assert (out / "figures" / f"{fig}.png").stat().st_size > 1000
    claims = {c["id"]: c for c in json.loads((out / "claims.json").read_text())["claims"]}
    assert set(claims) == {"partitioned_exact", "strong_speedup_2", "oracle_error", "loss_falls",
                           "oracle_picks_spatial"}
    assert claims["partitioned_exact"]["passed"]
    assert claims["partitioned_exact"]["measured"]["max_relative_error"]["1x2x1"] < 1e-10  # per layout
    oracle = claims["oracle_error"]["measured"]
    runs = pd.read_csv(out / "tables" / "runs.csv")
    within = runs["ranks"] <= oracle["cores"]
    assert oracle["mean_abs_error"] == pytest.approx(runs["oracle_error"].abs().mean())
    assert oracle["mean_abs_error_ranks_within_cores"] == pytest.approx(
        runs.loc[within, "oracle_error"].abs().mean())
