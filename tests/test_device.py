"""The one device mechanism (hpcdl.platform.kit.device): the schema key every study block takes, its
resolution and errors, the backend from the device, one rank per GPU, the Slurm resources, and the
device in every table's provenance. Tests marked `cuda` need a GPU and skip without one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hpcdl.platform.kit.config import (
    SHARED_BLOCK_KEYS,
    ConfigError,
    block_schema,
    load_config,
    validate_config,
)
from hpcdl.platform.kit.device import (
    LayoutError,
    check_layout,
    dist_backend,
    rank_placement,
    resolve,
    study_device,
    visible_gpus,
)
from hpcdl.platform.kit.rank_runtime.launch import build_command, run_ranks
from hpcdl.platform.kit.rank_runtime.placement import local_rank_and_world
from hpcdl.platform.kit.results import write_table
from hpcdl.platform.kit.sidecars import read_sidecars
from hpcdl.platform.kit.study import registered, spec
from hpcdl.platform.orchestration import wiring
from hpcdl.studies.spatial.sweep import expand as expand_spatial

REPO = Path(__file__).resolve().parents[1]
NO_GPU = visible_gpus() == 0


# ---- the schema: one definition, every study block ---------------------------------------------

def test_every_study_block_takes_device_and_gpu_sharing_with_defaults(test_config):
    cfg = validate_config(test_config)
    for study in registered():
        assert cfg[study]["device"] in ("auto", "cpu", "cuda"), study
        assert cfg[study]["gpu_sharing"] is False, study
    # the test config pins two studies to the CPU; the rest default to auto
    assert cfg["microbatch"]["device"] == "cpu" and cfg["spatial"]["device"] == "auto"


def test_a_bad_device_names_the_key_and_the_choices(test_config):
    bad = {**test_config, "spatial": {**test_config["spatial"], "device": "gpu"}}
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    assert err.value.key == "spatial.device" and "auto, cpu, cuda" in str(err.value)


def test_a_study_schema_may_not_redefine_a_shared_key(tmp_path):
    schema_dir = tmp_path / "schema"
    schema_dir.mkdir()
    for file in SHARED_BLOCK_KEYS.values():
        (schema_dir / file).write_text((REPO / "configs" / "schema" / file).read_text())
    (schema_dir / "spatial.yaml").write_text(yaml.safe_dump(
        {"type": "object", "properties": {"device": {"enum": ["cpu"]}}}))
    with pytest.raises(ValueError, match="'device' is defined once for every study"):
        block_schema(schema_dir / "spatial.yaml")


@pytest.mark.parametrize("name", ["default.yaml", "paper.yaml", "gpu.yaml"])
def test_repo_configs_state_their_devices(name):
    cfg = load_config(REPO / "configs" / name)
    devices = {s: cfg[s]["device"] for s in cfg["studies"]}
    if name in ("default.yaml", "paper.yaml"):  # each study on what its host has
        assert set(devices.values()) == {"auto"}
    if name == "gpu.yaml":  # a study with a CUDA path runs on it there, never silently on the CPU
        for study, device in devices.items():
            assert device == ("cuda" if "cuda" in spec(study).devices else "cpu"), study


# ---- resolution -----------------------------------------------------------------------------------

def test_cpu_and_auto_resolve_here():
    assert resolve("cpu", "x.device") == "cpu"
    assert resolve("auto", "x.device") == ("cpu" if NO_GPU else "cuda")


@pytest.mark.skipif(not NO_GPU, reason="asks for cuda where none is visible")
def test_cuda_without_a_gpu_is_an_error_naming_the_key(test_config):
    with pytest.raises(ConfigError) as err:
        resolve("cuda", "spatial.device")
    assert err.value.key == "spatial.device" and "no GPU is visible" in str(err.value)
    cfg = validate_config({**test_config, "spatial": {**test_config["spatial"], "device": "cuda"}})
    with pytest.raises(ConfigError, match="'spatial.device'"):
        study_device(cfg, "spatial")


def test_a_study_without_a_cuda_path_stays_on_the_cpu(test_config):
    assert "cuda" not in spec("malleable").devices
    cfg = validate_config(test_config)
    assert study_device(cfg, "malleable") == "cpu"      # auto
    cfg["malleable"]["device"] = "cuda"
    with pytest.raises(ConfigError, match="the malleable study has no CUDA path"):
        study_device(cfg, "malleable")


# ---- backend and placement ------------------------------------------------------------------------

def test_backend_follows_the_device():
    assert dist_backend("cpu") == "gloo" and dist_backend("cuda") == "nccl"
    with pytest.raises(ValueError, match="not a resolved device"):
        dist_backend("auto")


def test_one_rank_per_gpu():
    p = rank_placement("cuda", 2, 4, gpus=4)
    assert (p.compute, p.comm, p.backend, p.shared) == ("cuda:2", "cuda:2", "nccl", False)
    cpu = rank_placement("cpu", 1, 2, gpus=8)   # a CPU study never touches a GPU, whatever the host has
    assert (cpu.compute, cpu.comm, cpu.backend) == ("cpu", "cpu", "gloo")


def test_a_rank_bound_to_its_own_gpu_sees_it_at_index_0(monkeypatch):
    monkeypatch.setenv("HPCDL_GPU_PER_RANK_BOUND", "1")   # srun --gpus-per-task=1
    assert rank_placement("cuda", 3, 4, gpus=1).compute == "cuda:0"


def test_more_ranks_than_gpus_names_the_layout(monkeypatch):
    monkeypatch.delenv("HPCDL_GPU_PER_RANK_BOUND", raising=False)
    with pytest.raises(LayoutError, match="3 ranks on this node but 2 GPU"):
        rank_placement("cuda", 2, 3, gpus=2)
    with pytest.raises(LayoutError, match="4 ranks per node on 1 visible GPU"):
        check_layout("cuda", 4, 1, sharing=False, what="spatial")
    check_layout("cuda", 4, 1, sharing=True, what="spatial")   # explicitly allowed


def test_shared_gpus_talk_over_gloo_through_host_memory(monkeypatch):
    monkeypatch.delenv("HPCDL_GPU_PER_RANK_BOUND", raising=False)
    places = [rank_placement("cuda", r, 3, gpus=2, sharing=True) for r in range(3)]
    assert [p.compute for p in places] == ["cuda:0", "cuda:1", "cuda:0"]
    assert {(p.comm, p.backend, p.shared) for p in places} == {("cpu", "gloo", True)}
    assert "shared GPU" in places[0].label


def test_local_ranks_from_the_slurm_step_layout(monkeypatch):
    for var in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_TASKS_PER_NODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2),1")
    monkeypatch.setenv("SLURM_NODEID", "2")
    assert local_rank_and_world() == (0, 1)
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert local_rank_and_world() == (1, 2)


def test_real_cpu_ranks_run_gloo_on_host_tensors(monkeypatch):
    for var in ("SLURM_JOB_ID", "HPCDL_LAUNCHER"):
        monkeypatch.delenv(var, raising=False)
    seen = run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", 2, {"value": 1.0},
                     timeout_s=120, device="cpu")
    assert [r["sum"] for r in seen] == [3.0, 3.0]
    assert {(r["backend"], r["compute"], r["tensor_device"]) for r in seen} == {("gloo", "cpu", "cpu")}


@pytest.mark.skipif(not NO_GPU, reason="needs a machine without a GPU")
def test_cuda_ranks_without_gpus_are_refused_before_any_rank_starts(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(LayoutError, match="2 ranks per node on 0 visible GPU"):
        run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", 2, {}, device="cuda")
    with pytest.raises(ValueError, match="resolved device"):
        run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", 2, {}, device="auto")


def test_srun_gives_each_rank_its_own_gpu(tmp_path):
    cmd = build_command(4, "m:f", tmp_path, slurm=True, master_addr="n1", master_port=1, gpus_per_rank=1)
    assert cmd[:3] == ["srun", "--ntasks=4", "--gpus-per-task=1"]
    cpu = build_command(4, "m:f", tmp_path, slurm=True, master_addr="n1", master_port=1)
    assert not any(a.startswith("--gpus") for a in cpu)
    torchrun = build_command(4, "m:f", tmp_path, slurm=False, master_addr="h", master_port=1,
                             local="torchrun")
    assert "--nproc-per-node=4" in torchrun


# ---- Slurm resources ------------------------------------------------------------------------------

def test_run_rule_asks_slurm_for_one_gpu_per_rank(test_config):
    cfg = validate_config(test_config)
    spatial = spec("spatial")
    largest = spatial.task_gpus(cfg)
    assert largest == max(p["ranks"] for p in expand_spatial(cfg["spatial"]))
    cfg["spatial"]["device"] = "cuda"
    res = wiring.run_resources(spatial, cfg, environ={})
    assert res["gpu"] == largest and res["tasks"] == largest and "slurm_partition" not in res
    res = wiring.run_resources(spatial, cfg, environ={"HPCDL_SLURM_GPU_PARTITION": "gpu"})
    assert res["slurm_partition"] == "gpu"
    cfg["spatial"]["device"] = "cpu"
    assert "gpu" not in wiring.run_resources(spatial, cfg, environ={"HPCDL_SLURM_GPU_PARTITION": "gpu"})
    cfg["spatial"]["device"] = "auto"   # auto: a named GPU partition decides, never the submitting host
    assert wiring.run_gpus(spatial, cfg, environ={"HPCDL_SLURM_GPU_PARTITION": "gpu"}) == largest
    assert wiring.run_gpus(spatial, cfg, environ={}) == 0
    cfg["hpo"]["device"], cfg["hpo"]["workers"], cfg["hpo"]["grid"]["workers"] = "cuda", 3, [1, 2]
    assert wiring.run_gpus(spec("hpo"), cfg, environ={}) == 3  # concurrent trials, a GPU each
    cfg["malleable"]["device"] = "cuda"   # no CUDA path: never asks for GPUs
    assert wiring.run_gpus(spec("malleable"), cfg, environ={"HPCDL_SLURM_GPU_PARTITION": "gpu"}) == 0


# ---- provenance -----------------------------------------------------------------------------------

def test_tables_record_the_device_and_derived_tables_copy_it(tmp_path, test_config):
    from hpcdl.platform.kit.config import study_config

    cfg = study_config(validate_config(test_config), "spatial")
    study = tmp_path / "spatial"
    write_table(pd.DataFrame({"x": [1]}), study / "raw" / "runs.csv", cfg, started_at=0.0)
    raw = read_sidecars(study / "raw", "runs")[0]
    assert raw["device_requested"] == "auto" and raw["device"] == ("cpu" if NO_GPU else "cuda")
    assert ("gpu_model" in raw) == (not NO_GPU)
    # a stage on another host: its table says where the run was measured, not where it was derived
    other = {**cfg, "spatial": {**cfg["spatial"], "device": "cpu"}}
    write_table(pd.DataFrame({"y": [2]}), study / "tables" / "derived.csv", other, started_at=0.0)
    derived = json.loads((study / "tables" / "derived.provenance.json").read_text())
    assert derived["device"] == raw["device"] and derived["device_requested"] == "auto"


# ---- on a GPU -------------------------------------------------------------------------------------

@pytest.mark.cuda
def test_cuda_resolves_and_is_recorded(test_config):
    from hpcdl.platform.kit.device import cuda_record

    assert resolve("cuda", "x.device") == "cuda"
    rec = cuda_record()
    for key in ("gpu_model", "driver", "cuda", "cudnn", "nccl"):
        assert rec[key] and rec[key] != "unavailable", key
    print(json.dumps(rec), file=sys.stderr)


@pytest.mark.cuda
def test_cuda_ranks_all_reduce_over_nccl_on_their_gpu(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    n = min(visible_gpus(), 2)
    seen = run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", n, {"value": 1.0},
                     timeout_s=180, device="cuda")
    assert [r["sum"] for r in seen] == [n * (n + 1) / 2] * n
    assert {r["backend"] for r in seen} == {"nccl"}
    assert [r["tensor_device"] for r in seen] == [f"cuda:{i}" for i in range(n)]


@pytest.mark.cuda
def test_ranks_sharing_one_gpu_run_gloo_when_allowed(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    n = visible_gpus() + 1
    with pytest.raises(LayoutError):
        run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", n, {}, device="cuda")
    seen = run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", n, {"value": 1.0},
                     timeout_s=180, device="cuda", gpu_sharing=True)
    assert {r["backend"] for r in seen} == {"gloo"} and {r["tensor_device"] for r in seen} == {"cpu"}
    assert {r["compute"] for r in seen} <= {f"cuda:{i}" for i in range(visible_gpus())}
