"""The shuffle study on its device (#24): the device is threaded from the task app through the point to
the ranks, every collective's backend follows the device of the tensor it moves (gloo for CPU tensors,
NCCL for CUDA ones, never NCCL with a CPU tensor), the exchange keeps its samples in host memory on a
gloo group of its own unless `exchange_device: device` moves them as CUDA tensors over NCCL, and every
row names what it was measured on. CPU tests run real ranks here; tests marked `cuda` need a GPU."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from references import apply_exchange

from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.platform.kit.device import Placement, dist_backend, visible_gpus
from hpcdl.platform.kit.rank_runtime.launch import RankFailure, run_ranks
from hpcdl.studies.shuffle import compute, partition, rank_state, tables
from hpcdl.studies.shuffle import data as shuffle_data

FMNIST = "/usr/share/datasets/fashion-mnist"
# one batch per rank and epoch on the CPU: the tests are about where tensors go, not about learning
TRAIN = dict(epochs=2, batch_size=128, lr=0.1, momentum=0.9, model={"kind": "mlp_bn", "width": 8, "depth": 1})
N_TRAIN = 200


def _run(seed: int, fraction: float = 0.0, slot: int = 0) -> dict:
    return {"seed": seed, "kakurenbo_fraction": fraction, "round": 0, "slot": slot}


def _points(data: dict, exchange_device: str = "host", train_kw: dict = TRAIN) -> list[dict]:
    """A partial point (the exchange) and a KAKURENBO point (per-sample records merged over ranks)."""
    common = dict(data=data, alpha=0.1, exchange_device=exchange_device, exchange_timeout_s=30, **train_kw)
    return [dict(strategy="partial", q=0.5, partitioning="random", runs=[_run(0)], **common),
            dict(strategy="global", q=1.0, partitioning="shared", runs=[_run(0), _run(0, 0.2, 1)], **common)]


def _mismatched(calls: list[dict]) -> list[dict]:
    """Calls whose group's backend is not the one for the device of the tensor they move."""
    return [c for c in calls if c["backend"] != dist_backend(c["tensor_device"])]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return shuffle_data.prepare(FMNIST, tmp_path_factory.mktemp("cache"), n_train=N_TRAIN, n_val=40, seed=0)


# ---- CPU: real ranks ---------------------------------------------------------------------------------

def test_on_the_cpu_every_collective_is_gloo_on_cpu_tensors(tiny_data):
    out = run_ranks("shuffle_rank_checks:collectives_of_training", 2, {"points": _points(tiny_data)},
                    timeout_s=180, device="cpu")
    for r in out:
        assert r["placement"] == {"device": "cpu", "compute": "cpu", "comm": "cpu", "backend": "gloo",
                                  "shared": False, "label": "cpu (gloo)"}
        assert r["default_backend"] == "gloo"
        assert not _mismatched(r["calls"]), _mismatched(r["calls"])
        seen = {(c["op"], c["default_group"]) for c in r["calls"]}
        # the exchange on its own group; validation, BN buffers and KAKURENBO's merge on the default one
        assert {("all_to_all_single", False), ("all_reduce", True), ("broadcast", True)} <= seen
        merges = [c for c in r["calls"] if c["op"] == "all_reduce" and c["shape"] == [4, N_TRAIN]]
        assert len(merges) == TRAIN["epochs"]                  # one per epoch of the F = 0.2 run
        partial, kk = r["records"]
        assert {x["device"] for x in partial + kk} == {"cpu (gloo)"}
        assert {x["exchange_device"] for x in partial + kk} == {"host"}
        assert all(x["samples_sent"] == 50 for x in partial)   # Q*N/M = 0.5 * 200 / 2: it exchanged


def test_a_point_records_the_device_it_ran_on_through_to_the_tables(tiny_data):
    point = {"point": "local-q0-random-M2", "strategy": "local", "q": 0.0, "partitioning": "random",
             "world_size": 2, "kakurenbo": False, "runs": [_run(0)]}
    train_kw = {**TRAIN, "epochs": 1, "alpha": 0.1, "exchange_timeout_s": 20, "exchange_device": "device"}
    raw = pd.DataFrame(compute.run_point(point=point, train=train_kw, data=tiny_data, timeout_s=180,
                                         device="cpu"))
    assert len(raw) == 2 and set(raw["device"]) == {"cpu (gloo)"}
    assert set(raw["exchange_device"]) == {"host"}             # on the CPU "device" is host memory
    final = tables.final_table(tables.epoch_table(raw), N_TRAIN)
    assert final[["device", "exchange_device"]].values.tolist() == [["cpu (gloo)", "host"]]
    # a raw table from before rows named their device says so
    older = tables.epoch_table(raw.drop(columns=["device", "exchange_device"]))
    assert set(older["device"]) == {"not recorded"}


# ---- CPU: no ranks ---------------------------------------------------------------------------------

def test_the_device_exchange_needs_one_gpu_per_rank_and_says_what_to_change():
    shared = Placement("cuda", "cuda:0", "cpu", "gloo", shared=True)
    with pytest.raises(ValueError, match=r"exchange_device: device .*shared GPU.*exchange_device: host"):
        rank_state.Where(shared, "device", "partial")
    assert rank_state.Where(shared, "device", "local").samples_on == "device"   # no exchange, no NCCL needed
    assert rank_state.Where(shared, "host", "partial").samples_on == "host"
    own = Placement("cuda", "cuda:1", "cuda:1", "nccl")
    where = rank_state.Where(own, "device", "partial")
    assert (where.samples_on, str(where.samples), str(where.comm)) == ("device", "cuda:1", "cuda:1")
    cpu = Placement("cpu", "cpu", "cpu", "gloo")
    assert rank_state.Where(cpu, "device", "partial").samples_on == "host"
    with pytest.raises(ValueError, match="exchange_device must be one of"):
        rank_state.Where(cpu, "gpu", "partial")


def test_exchange_device_is_a_config_key_with_host_by_default(test_config):
    assert validate_config(test_config)["shuffle"]["exchange_device"] == "host"
    bad = {**test_config, "shuffle": {**test_config["shuffle"], "exchange_device": "gpu"}}
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    assert err.value.key == "shuffle.exchange_device" and "host" in str(err.value)


@pytest.mark.skipif(visible_gpus() > 0, reason="needs a machine without a GPU")
def test_task_app_refuses_cuda_without_a_gpu_before_writing(write_config, tmp_path, capsys):
    from tasks.shuffle import main

    with pytest.raises(SystemExit) as exit_:
        main(["--config", str(write_config(studies=["shuffle"], shuffle={"device": "cuda"}))])
    assert exit_.value.code == 2
    assert "'shuffle.device'" in capsys.readouterr().err
    assert not (tmp_path / "results" / "shuffle").exists()


def test_batches_never_leave_one_sample_alone():
    """Batch norm cannot train on one sample, and ranks whose partitions differ by one sample must
    take as many steps (DDP all-reduces once per step on every rank)."""
    assert [(s.start, s.stop) for s in rank_state.batches(101, 50)] == [(0, 50), (50, 101)]
    assert len(rank_state.batches(101, 50)) == len(rank_state.batches(100, 50)) == 2
    assert [(s.start, s.stop) for s in rank_state.batches(7, 3)] == [(0, 3), (3, 7)]
    assert [(s.start, s.stop) for s in rank_state.batches(1, 3)] == [(0, 1)]


# ---- CUDA --------------------------------------------------------------------------------------

GPU_TRAIN = dict(epochs=3, batch_size=64, lr=0.1, momentum=0.9,
                 model={"kind": "mlp_bn", "width": 32, "depth": 1})


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory):
    return shuffle_data.prepare(FMNIST, tmp_path_factory.mktemp("gpu-cache"), n_train=1200, n_val=300, seed=0)


@pytest.mark.cuda
@pytest.mark.parametrize("exchange_device", ["host", "device"])
def test_one_rank_trains_on_its_gpu_with_nccl_on_cuda_tensors(gpu_data, exchange_device):
    points = _points(gpu_data, exchange_device, GPU_TRAIN)
    points[0] = {**points[0], "strategy": "local", "q": 0.0}       # one rank exchanges nothing
    (r,) = run_ranks("shuffle_rank_checks:collectives_of_training", 1, {"points": points}, timeout_s=300,
                     device="cuda")
    assert r["placement"]["compute"] == r["placement"]["comm"] == "cuda:0"
    assert r["default_backend"] == "nccl"
    assert not _mismatched(r["calls"]), _mismatched(r["calls"])
    assert {c["tensor_device"] for c in r["calls"] if c["default_group"]} == {"cuda"}
    local, kk = r["records"]
    assert {x["device"] for x in local + kk} == {"cuda:0 (nccl)"}
    assert {x["exchange_device"] for x in local} == {exchange_device}
    assert local[-1]["val_acc"] > 0.5 and kk[-1]["val_acc"] > 0.5     # it learned on the GPU
    assert all(x["fwd_bwd_s"] > 0 and x["epoch_s"] >= x["fwd_bwd_s"] for x in local + kk)


@pytest.mark.cuda
def test_the_device_exchange_delivers_what_the_host_exchange_does():
    (r,) = run_ranks("shuffle_rank_checks:exchange_to_self", 1, {"k": 37}, timeout_s=120, device="cuda")
    for host, dev in zip(r["host"], r["device"], strict=True):
        np.testing.assert_array_equal(host, dev)
    assert r["bytes"][0] == r["bytes"][1] == 37 * compute.SAMPLE_BYTES
    assert r["device_time_s"] > 0


def _expected_ids(data: dict, m: int, q: float, seed: int, epochs: int) -> list[np.ndarray]:
    y = np.load(data["y_train"])
    ids = partition.make_partition("skewed", y, m, seed, 0.2)
    for epoch in range(epochs):
        ids = apply_exchange(ids, q, seed, epoch)
    return ids


def _partial(data: dict, exchange_device: str) -> dict:
    return dict(data=data, strategy="partial", q=0.3, partitioning="skewed", alpha=0.2, runs=[_run(5)],
                return_ids=True, exchange_device=exchange_device, exchange_timeout_s=60, **GPU_TRAIN)


@pytest.mark.cuda
@pytest.mark.skipif(visible_gpus() < 2, reason="two ranks on their own GPUs need two GPUs")
def test_two_ranks_exchange_the_same_samples_on_their_gpus_as_in_host_memory(gpu_data):
    expected = _expected_ids(gpu_data, 2, 0.3, 5, GPU_TRAIN["epochs"])
    got = {}
    for on in ("host", "device"):
        res = run_ranks("hpcdl.studies.shuffle.train:train_rank", 2, _partial(gpu_data, on), timeout_s=300,
                        device="cuda")
        got[on] = res
        for r, want in zip(res, expected, strict=True):
            np.testing.assert_array_equal(r["ids"], want)              # the pure plan, sample for sample
        assert [res[i]["records"][0]["device"] for i in (0, 1)] == ["cuda:0 (nccl)", "cuda:1 (nccl)"]
        assert {x["exchange_device"] for r in res for x in r["records"]} == {on}
    for rank in (0, 1):
        host, dev = got["host"][rank]["records"], got["device"][rank]["records"]
        assert [x["bytes_sent"] for x in host] == [x["bytes_sent"] for x in dev]
        assert [x["samples_held"] for x in host] == [x["samples_held"] for x in dev]


@pytest.mark.cuda
def test_ranks_sharing_a_gpu_exchange_in_host_memory_and_refuse_the_device_exchange(gpu_data):
    m = visible_gpus() + 1                                          # one rank more than GPUs: shared
    out = run_ranks("shuffle_rank_checks:collectives_of_training", m,
                    {"points": [{k: v for k, v in _partial(gpu_data, "host").items() if k != "return_ids"}]},
                    timeout_s=300, device="cuda", gpu_sharing=True)
    shared = [r for r in out if r["placement"]["shared"]]
    assert shared and all(r["default_backend"] == "gloo" and r["placement"]["comm"] == "cpu" for r in shared)
    for r in out:
        assert not _mismatched(r["calls"]), _mismatched(r["calls"])
    assert any("shared GPU" in x["device"] for r in shared for x in r["records"][0])
    with pytest.raises(RankFailure, match="exchange_device: host"):
        run_ranks("hpcdl.studies.shuffle.train:train_rank", m, _partial(gpu_data, "device"), timeout_s=300,
                  device="cuda", gpu_sharing=True)
