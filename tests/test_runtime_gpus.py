"""GPU tasks in the task runtime: the local backend's GPU pool (real worker processes, a pool given
by HPCDL_GPU_POOL: what is tested is the CUDA_VISIBLE_DEVICES each task sees, no GPU needed), the
GPU constraint as the local backend reads it, and the app's check at start (`device: cuda` where no
GPU is visible exits 2 naming the key, before anything is written).

(The constraint as the PyCOMPSs binding records it: tests/test_pycompss_conformance.py; the
generated commands: tests/test_compss_cmd.py.)
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import runtime_tasks as rt

from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.platform.orchestration.task_runtime import compss_wait_on, set_local_cores
from hpcdl.platform.orchestration.task_runtime.gpus import (
    GpuError,
    apply_gpus,
    gpu_pool,
    resolve_gpus,
    task_gpus,
)
from hpcdl.platform.orchestration.task_runtime.local import processor_units

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def pool(monkeypatch):
    """A fresh local backend (8 slots, so GPUs are what bounds it) whose GPU pool is `ids`."""
    def make(ids: str, per_task: str = "1"):
        monkeypatch.setenv("HPCDL_GPU_POOL", ids)
        monkeypatch.setenv("HPCDL_TEST_GPUS", per_task)
        set_local_cores(8)
    yield make
    set_local_cores(None)


def _overlap(a, b) -> float:
    return min(a["end"], b["end"]) - max(a["start"], b["start"])


def _ids(record) -> list[str]:
    return record["cuda_visible_devices"].split(",")


def test_concurrent_gpu_tasks_never_hold_the_same_gpu(pool):
    pool("0,1,2,3")
    runs = compss_wait_on([rt.gpu_task(2.0) for _ in range(6)])
    assert all(len(_ids(r)) == 1 and _ids(r)[0] in {"0", "1", "2", "3"} for r in runs), runs
    pairs = [(a, b) for a, b in itertools.combinations(runs, 2) if _overlap(a, b) > 0]
    assert pairs, "no two tasks overlapped: the test shows nothing"
    assert all(a["cuda_visible_devices"] != b["cuda_visible_devices"] for a, b in pairs), pairs
    # never more tasks at once than GPUs: at every task's start, at most 4 hold one
    for r in runs:
        assert sum(o["start"] <= r["start"] < o["end"] for o in runs) <= 4, runs
    # CUDA reads CUDA_VISIBLE_DEVICES once per process: a worker process serves one set of ids only,
    # and is kept for the next task given the same ids (6 tasks on 4 GPUs: some worker served two)
    ids_of = {}
    for r in runs:
        ids_of.setdefault(r["pid"], set()).add(r["cuda_visible_devices"])
    assert all(len(v) == 1 for v in ids_of.values()), ids_of
    assert len(ids_of) < len(runs), runs


def test_a_worker_that_shares_a_gpu_with_a_new_id_set_is_replaced(pool):
    """One id, then two ids overlapping it, then the first again: three processes, never two alive
    holding one GPU."""
    pool("3,4", per_task="1")
    first = compss_wait_on(rt.gpu_task(0.1))
    again = compss_wait_on(rt.gpu_task(0.1))
    both = compss_wait_on(rt.two_gpu_task(0.1))
    last = compss_wait_on(rt.gpu_task(0.1))
    assert first["pid"] == again["pid"] and first["cuda_visible_devices"] == "3"
    assert both["cuda_visible_devices"] == "3,4" and both["pid"] != first["pid"]
    assert last["pid"] not in (first["pid"], both["pid"]), (first, both, last)
    for gone in (first["pid"],):
        deadline = time.monotonic() + 10
        while _alive(gone) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(gone), f"replaced worker {gone} still running"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purpose
        return f.read().split()[2] != "Z"


def test_a_task_holds_as_many_gpus_as_it_asks_and_waits_for_them(pool):
    pool("4,5,6")
    runs = compss_wait_on([rt.two_gpu_task(1.0) for _ in range(3)])
    for r in runs:
        ids = _ids(r)
        assert len(ids) == len(set(ids)) == 2 and set(ids) <= {"4", "5", "6"}, r
    # 2 + 2 > 3 GPUs: no two of them ran at once
    assert all(_overlap(a, b) <= 0 for a, b in itertools.combinations(runs, 2)), runs


def test_more_gpus_than_the_pool_runs_alone_with_the_whole_pool(pool):
    pool("5,7", per_task="4")
    big, small = compss_wait_on([rt.gpu_task(1.0), rt.two_gpu_task(0.5)])
    assert _ids(big) == ["5", "7"] and _ids(small) == ["5", "7"]
    assert _overlap(big, small) <= 0


def test_a_task_without_gpus_keeps_the_environment_it_started_with(pool, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "9")  # what the app was started with
    pool("0,1")
    cpu, gpu = compss_wait_on([rt.cpu_task(0.1), rt.gpu_task(0.1)])
    assert cpu["cuda_visible_devices"] == "9"  # as under COMPSs: only GPU tasks are bound
    assert gpu["cuda_visible_devices"] in ("0", "1")


def test_zero_gpus_is_a_cpu_task(pool):
    pool("0,1", per_task="0")
    (run,) = compss_wait_on([rt.gpu_task(0.1)])
    assert run["cuda_visible_devices"] == os.environ.get("CUDA_VISIBLE_DEVICES")


def test_an_empty_pool_refuses_a_gpu_task_naming_the_pool(pool):
    pool("")
    with pytest.raises(GpuError, match=r"gpu_task asks for 1 GPU\(s\) but the local GPU pool is empty.*"
                                        r"HPCDL_GPU_POOL=''"):
        rt.gpu_task(0.1)


def test_the_pool_comes_from_the_environment_and_fakes_no_gpu(monkeypatch):
    assert gpu_pool({"HPCDL_GPU_POOL": "0, 1,3"}) == ["0", "1", "3"]
    assert gpu_pool({"HPCDL_GPU_POOL": ""}) == []
    for bad in ("0,,1", "0,0"):
        with pytest.raises(GpuError, match=rf"HPCDL_GPU_POOL='{bad}' is not a list of distinct GPU ids"):
            gpu_pool({"HPCDL_GPU_POOL": bad})
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the rest checks a machine without one")
    # CUDA_VISIBLE_DEVICES lists ids, but none is a GPU torch can use: the pool is empty
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpu_pool({"CUDA_VISIBLE_DEVICES": "0,1"}) == [] and gpu_pool({}) == []


def test_the_constraint_is_read_as_compss_reads_it():
    gpu = [{"processorType": "CPU", "computingUnits": "$U"}, {"processorType": "GPU", "computingUnits": "$G"}]
    assert processor_units(processors=gpu) == (("$U",), ("$G",))
    assert processor_units(computing_units="3") == (("3",), ())
    assert processor_units() == (("1",), ())
    # a listed GPU alone: the cores are computing_units, or COMPSs's default of one
    assert processor_units("2", [{"processorType": "GPU", "computingUnits": "1"}]) == (("2",), ("1",))
    assert processor_units(processors=[{"processorType": "GPU"}]) == (("1",), ("1",))
    with pytest.raises(ValueError, match="computing_units beside a CPU processor"):
        processor_units("2", gpu)
    with pytest.raises(ValueError, match="field 'cores' is not a COMPSs processor field"):
        processor_units(processors=[{"processorType": "GPU", "cores": 1}])
    with pytest.raises(ValueError, match="processorType 'FPGA'"):
        processor_units(processors=[{"processorType": "FPGA"}])


def test_bad_gpu_counts_name_the_key():
    assert resolve_gpus("0", "k") == 0 and resolve_gpus("$G", "k", {"G": "2"}) == 2
    for value, message in (("-1", "is not a GPU count"), ("two", "is not a GPU count"),
                           ("$NOPE_UNSET", "NOPE_UNSET, which is not set")):
        with pytest.raises(GpuError, match=rf"spatial GPUs={value!r}.*{message}".replace("$", r"\$")):
            resolve_gpus(value, "spatial GPUs", environ={})


def _cfg(test_config, **spatial) -> dict:
    return validate_config({**test_config, "spatial": {**test_config["spatial"], **spatial}})


def test_gpus_per_task_follow_the_device(test_config, monkeypatch):
    # test.yaml: spatial's largest run has 2 ranks, one GPU each on cuda
    assert task_gpus("spatial", _cfg(test_config, device="cpu")) == 0
    assert task_gpus("spatial", _cfg(test_config), device="cuda") == 2
    assert task_gpus("malleable", validate_config(test_config), device="cuda") == 0  # holds none
    monkeypatch.delenv("HPCDL_SPATIAL_GPUS", raising=False)
    assert apply_gpus("spatial", _cfg(test_config, device="cpu"), "local") == ("cpu", 0)
    assert os.environ["HPCDL_SPATIAL_GPUS"] == "0"


def test_gpus_must_match_what_the_compss_runtime_started_with(test_config, monkeypatch):
    cfg = _cfg(test_config, device="cpu")
    monkeypatch.delenv("HPCDL_SPATIAL_GPUS", raising=False)
    with pytest.raises(GpuError, match=r"started with HPCDL_SPATIAL_GPUS=None but spatial.device \(cpu\) "
                                       r"resolves to cpu here.*start runcompss with HPCDL_SPATIAL_GPUS=0"):
        apply_gpus("spatial", cfg, "compss")
    monkeypatch.setenv("HPCDL_SPATIAL_GPUS", "2")
    with pytest.raises(GpuError, match="HPCDL_SPATIAL_GPUS='2'"):
        apply_gpus("spatial", cfg, "compss")
    monkeypatch.setenv("HPCDL_SPATIAL_GPUS", "0")
    assert apply_gpus("spatial", cfg, "compss") == ("cpu", 0)


def test_cuda_without_a_gpu_is_refused_naming_the_key(test_config):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    with pytest.raises(ConfigError, match=r"config key 'spatial.device': 'cuda' is not allowed; allowed: "
                                          r"auto or cpu: no GPU is visible here"):
        apply_gpus("spatial", _cfg(test_config, device="cuda"), "local")


# every study with a CUDA path
@pytest.mark.parametrize("study", ["spatial", "shuffle", "microbatch", "offload", "hetmem", "checkpoint",
                                   "hpo"])
def test_task_app_with_device_cuda_and_no_gpu_exits_2_and_writes_nothing(study, write_config, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    cfg = write_config(**{study: {"device": "cuda"}})
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCDL_")}
    proc = subprocess.run([sys.executable, "-m", f"tasks.{study}", "--config", str(cfg)], cwd=REPO,
                          env={**env, "HPCDL_RUNTIME": "local", "HPCDL_PROGRESS": "0"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"error: config key '{study}.device': 'cuda' is not allowed" in proc.stderr
    assert "no GPU is visible here" in proc.stderr
    assert not (tmp_path / "results").exists()
