"""μ-cuDNN's engine-table driver (hpcdl.studies.microbatch.cudnn.engine_table, issue 42): its setting from
configs/gpu.yaml, the GPU slug, what it does without CUDA or with a bad config, and that its table is
what hpcdl.studies.microbatch.cudnn.limits plans on (rows HAND-MADE in the shape benchmark_layer returns,
times invented). `cuda`: a tiny config recorded end to end, and the budget stopping it after a layer.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hpcdl.studies.microbatch.common.workloads import alexnet
from hpcdl.studies.microbatch.cudnn import engine_table, limits

MiB = 2**20
ROOT = Path(__file__).resolve().parent.parent


def test_gpu_slugs_and_the_gpu_configs_setting():
    assert engine_table.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert engine_table.gpu_slug("NVIDIA H200") == "h200"
    assert engine_table.gpu_slug("NVIDIA A100-SXM4-40GB") == "a100"
    assert engine_table.gpu_slug("NVIDIA GeForce RTX 4090") == "rtx4090"
    with pytest.raises(ValueError, match="no short name in the GPU model 'NVIDIA'"):
        engine_table.gpu_slug("NVIDIA")
    # gpu.yaml's setting (mini-batch 256, three networks) is tests/test_microbatch_settings.py's


def _cuda_and_binding() -> bool:
    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("cudnn") is not None


@pytest.mark.skipif(_cuda_and_binding(), reason="CUDA and the cuDNN frontend are here: it would record")
def test_engine_table_without_cuda_says_why_and_writes_nothing(tmp_path):
    out = tmp_path / "tables"
    cmd = [sys.executable, "-m", "hpcdl.studies.microbatch.cudnn.engine_table", "--config",
           str(ROOT / "configs" / "gpu.yaml"), "--out", str(out / "microbatch_cudnn_{gpu}.csv")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "needs CUDA" in run.stdout or "needs the cudnn frontend" in run.stdout, run.stdout
    assert "nothing written" in run.stdout
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_engine_table_bad_config_names_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"studies": ["microbatch"], "microbatch": {"batch_size": 0}}))
    assert engine_table.main(["--config", str(bad), "--out", str(tmp_path / "t.csv")]) == 2
    assert "microbatch.batch_size" in capsys.readouterr().err
    good = str(ROOT / "configs" / "gpu.yaml")
    assert engine_table.main(["--config", good, "--out", str(tmp_path / "t.txt")]) == 2
    assert "--out must be a .csv path" in capsys.readouterr().err
    assert engine_table.main(["--config", good, "--out", str(tmp_path / "t.csv"), "--budget-s", "-1"]) == 2
    assert list(tmp_path.iterdir()) == [bad]


def _bench_rows(layer: str, fast_ws: int) -> list[dict]:
    """HAND-MADE rows shaped as cudnn.bench.benchmark_layer returns them (times invented)."""
    rows = []
    for kernel, b in itertools.product(("forward", "backward_filter"), (1, 2, 4)):
        cell = {"layer": layer, "count": 1, "kernel": kernel, "micro_batch": b, "plan_count": 3,
                "alignment": "x:4 w:16 y:16" if b == 1 else "x:16 w:16 y:16"}
        rows.append({**cell, "engine": "slow", "plan_index": 0, "workspace_bytes": 0, "status": "ok",
                     "reason": "", "ran": "slow", "time_s": 10.0 * b, "time_median_s": 10.5 * b,
                     "measured_workspace_bytes": 512, "bench_wall_s": 0.1})
        rows.append({**cell, "engine": "fast", "plan_index": 1, "workspace_bytes": fast_ws * b,
                     "status": "ok", "reason": "", "ran": "fast", "time_s": 4.0 * b + 1,
                     "time_median_s": 4.2 * b + 1,
                     "measured_workspace_bytes": fast_ws * b, "bench_wall_s": 0.1})
        rows.append({**cell, "engine": "", "plan_index": 2, "status": "skipped",
                     "reason": "cudnnGraphNotSupportedError: no kernel"})
    return rows


def test_the_table_format_is_what_the_planner_reads(tmp_path):
    path = tmp_path / "microbatch_cudnn_h100.csv"
    engine_table.start_table(path)
    assert path.read_text() == ",".join(engine_table.FIELDS) + "\n"
    assert set(limits.COLUMNS) <= set(engine_table.FIELDS)
    extra = {"batch_size": 4, "image_size": 227}
    for net, fast_ws in (("alexnet", 25 * MiB), ("resnet18", 100 * MiB)):
        rows = [{**r, "network": net, **extra} for r in _bench_rows("conv1", fast_ws)]
        engine_table.append_rows(path, rows)
    with pytest.raises(ValueError, match="two rows for engine slow"):
        limits.kernel_tables(pd.read_csv(path))  # conv1 of both networks: plan one network at a time
    alex = engine_table.load(path, "alexnet")
    assert len(alex) == 18 and set(alex["status"]) == {"ok", "skipped"}
    assert alex.loc[alex["status"] == "skipped", "time_s"].isna().all()
    plan = limits.per_layer(alex, 4, "powerOfTwo", 64 * MiB)
    assert plan[("conv1", "forward")].division == (("fast", 2), ("fast", 2))
    assert limits.per_layer(engine_table.load(path, "resnet18"), 4, "powerOfTwo", 64 * MiB)[
        ("conv1", "forward")].engines == "slow"
    with pytest.raises(ValueError, match="no rows of network 'vgg'.*alexnet, resnet18"):
        engine_table.load(path, "vgg")
    with pytest.raises(ValueError, match="unknown"):
        engine_table.append_rows(path, [{"unknown": 1}])


def test_the_first_layer_runs_whatever_the_budget_and_later_ones_only_if_it_covers_the_slowest():
    # the H200 run of 2026-11-27: a 1 ms budget was spent before the first layer, which then never ran
    assert not engine_table.budget_spent(0, -5.0, 0.0)
    assert engine_table.budget_spent(1, 0.4, 0.5)
    assert not engine_table.budget_spent(1, 0.6, 0.5)
    assert not engine_table.budget_spent(3, float("inf"), 9.0)


@pytest.mark.cuda
def test_engine_table_records_a_network_and_stops_at_its_budget(tmp_path):
    import torch

    cfg = tmp_path / "tiny.yaml"
    block = {"networks": ["alexnet"], "batch_size": 4, "image_size": 64, "repeats": 1, "warmup": 0,
             "policies": ["undivided", "powerOfTwo"], "device": "cuda"}
    cfg.write_text(yaml.safe_dump({"studies": ["microbatch"], "microbatch": block}))
    slug = engine_table.gpu_slug(torch.cuda.get_device_name(0))
    out = tmp_path / "microbatch_cudnn_{gpu}.csv"
    assert engine_table.main(["--config", str(cfg), "--out", str(out), "--budget-s", "0"]) == 0
    path = tmp_path / f"microbatch_cudnn_{slug}.csv"
    df = engine_table.load(path, "alexnet")
    assert list(pd.read_csv(path).columns) == list(engine_table.FIELDS)
    assert list(dict.fromkeys(df["layer"])) == [ly.name for ly in alexnet(64)]
    assert set(df["micro_batch"]) == {1, 2, 4}
    side = json.loads((tmp_path / f"microbatch_cudnn_{slug}.provenance.json").read_text())
    assert side["status"] == "complete" and len(side["layers_done"]) == 5 and side["rows"] == len(df)
    assert side["device"]["gpu_model"] == torch.cuda.get_device_name(0) and side["cudnn"]["same_cudnn"]
    assert side["command"].startswith("python -m hpcdl.studies.microbatch.cudnn.engine_table --config")
    assert side["torch"] == torch.__version__
    assert len(limits.per_layer(df, 4, "powerOfTwo", 64 * MiB)) == 15
    # a budget the first layer already spends: that layer's rows, and the sidecar says what is left
    assert engine_table.main(["--config", str(cfg), "--out", str(path), "--budget-s", "0.001"]) == 0
    side = json.loads((tmp_path / f"microbatch_cudnn_{slug}.provenance.json").read_text())
    assert side["status"] == "stopped at the budget" and side["layers_done"] == ["alexnet/conv1"]
    assert len(side["layers_left"]) == 4 and set(pd.read_csv(path)["layer"]) == {"conv1"}
