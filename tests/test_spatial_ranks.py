"""Spatial study on real ranks (forked + gloo): exactness in float64 on 1, 2 and 4 ranks,
hybrid data x spatial training equal to whole-batch training, and faults (no hangs).

The same float64 exactness suite, training and calibration on CUDA (marked `cuda`: they skip without
a GPU): one rank on its GPU, two over NCCL where two GPUs are visible, and ranks sharing one GPU over
gloo (halos staged through host memory) everywhere."""

from __future__ import annotations

import re

import numpy as np
import pytest
from references import reference_losses

from hpcdl.common.layers import build_spec
from hpcdl.platform.kit.rank_runtime.launch import RankFailure, run_ranks
from hpcdl.studies.spatial.data import ensure_dataset

TOL = 1e-10
# kernel 1/3/5, stride 1/2, same/valid padding, an even and an uneven depth
CASES = [dict(cin=2, cout=3, kernel=k, stride=s, padding=p, depth=d, height=9, width=5)
         for k in (1, 3, 5) for s in (1, 2) for p in ("same", "valid") for d in (16, 13)]
MODEL = {"channels": [3, 4], "dense": [8]}


def _suite(nprocs, grid, **placed):
    conv = run_ranks("rank_probes:conv_cases", nprocs, {"cases": CASES, "grid": grid},
                     timeout_s=240, **placed)
    model = run_ranks("hpcdl.studies.spatial.exactness:model_case", nprocs,
                      {"shape": (16, 12, 10), "model": MODEL, "grid": grid}, timeout_s=240, **placed)
    return conv, model


def _assert_exact(conv, model, nprocs):
    assert len(conv) == nprocs and all(len(r) == len(CASES) for r in conv)
    for rank_rows in conv:
        for row in rank_rows:
            for key in ("err_out", "err_grad_input", "err_grad_weight", "err_grad_bias"):
                assert row[key] <= TOL, (key, row)
    for row in model:
        assert row["err_loss"] <= TOL and row["err_grad_input"] <= TOL and row["err_grad_params"] <= TOL, row


@pytest.mark.parametrize("nprocs,grid", [
    (1, (1, 1)), (2, (2, 1)),
    pytest.param(4, (4, 1), marks=pytest.mark.slow), pytest.param(4, (2, 2), marks=pytest.mark.slow)],
    ids=["1rank", "2ranks-depth", "4ranks-depth", "4ranks-depth-height"])
def test_partitioned_conv_and_model_exact(nprocs, grid):
    conv, model = _suite(nprocs, grid, device="cpu")
    _assert_exact(conv, model, nprocs)
    # device cpu: every rank computed on the host and its group ran gloo
    assert {(r["device"], r["placement"], r["backend"]) for r in model} == {("cpu", "cpu (gloo)", "gloo")}
    assert {(row["device"], row["placement"]) for rows in conv for row in rows} == {("cpu", "cpu (gloo)")}
    if grid == (4, 1):
        # 16 planes over 4 ranks, then halved by each pool: every rank keeps a slab to the end
        assert model[0]["out_sizes"][0] == (1, 1, 1, 1)


def test_halo_larger_than_slab_fails_on_every_rank_without_hang():
    # 4 planes over 3 ranks = slabs [2, 1, 1]: rank 0 needs 2 planes from rank 1, which has 1
    with pytest.raises(RankFailure) as info:
        run_ranks("rank_probes:conv_cases", 3,
                  {"cases": [dict(cin=1, cout=1, kernel=5, stride=1, padding="same", depth=4, height=4,
                                  width=4)]}, timeout_s=120)
    assert not info.value.timed_out  # failed on its own, not stopped by the 120 s hang guard
    assert "halo larger than slab" in str(info.value)


def test_dead_neighbour_is_a_halo_exchange_error_naming_the_peer(monkeypatch):
    monkeypatch.setenv("HPCDL_HALO_TIMEOUT_S", "60")
    with pytest.raises(RankFailure) as info:
        run_ranks("hpcdl.studies.spatial.exactness:model_case", 2,
                  {"shape": (16, 8, 8), "model": MODEL, "die_rank": 1, "die_status": 0}, timeout_s=90)
    assert not info.value.timed_out and info.value.group_formed
    msg = str(info.value)
    # the peer's death closed the connection: an error at once, not the 60 s deadline
    assert re.search(r"HaloExchangeError: rank 0: halo exchange \((receive from|send to) rank 1, tag \d+\) "
                     r"failed within 60 s", msg), msg


@pytest.mark.slow
def test_stalled_neighbour_times_out_with_clear_error(monkeypatch):
    monkeypatch.setenv("HPCDL_HALO_TIMEOUT_S", "3")
    with pytest.raises(RankFailure) as info:
        run_ranks("hpcdl.studies.spatial.exactness:model_case", 2,
                  {"shape": (16, 8, 8), "model": MODEL, "stall_rank": 1, "stall_s": 60}, timeout_s=90)
    assert not info.value.timed_out
    # the survivor's deadline fired (the stalled rank would only wake after 60 s)
    msg = str(info.value)
    assert re.search(r"HaloExchangeError: rank 0: halo exchange \((receive from|send to) rank 1(, tag \d+)?"
                     r"\) (timed out after 3 s|failed within 3 s: .*Timed out)", msg), msg


@pytest.mark.slow
def test_hybrid_training_equals_whole_batch_training(tmp_path):
    data = ensure_dataset(tmp_path, (16, 12, 8), 8, 0, (0.5, 2.0), (-3.0, -1.0))
    kw = dict(data_dir=str(data), model=MODEL, batch_size=4, iterations=3, lr=1e-2, seed=0)
    ref = reference_losses(**kw, dtype="float64")
    res = run_ranks("hpcdl.studies.spatial.train:train_run", 4,
                    {**kw, "n_data": 2, "grid": (2, 1), "dtype": "float64"}, timeout_s=240)
    assert {r["data_index"] for r in res} == {0, 1}
    losses = np.array([[rec["loss"] for rec in r["records"]] for r in res])
    # spatial ranks of one data group see the same loss; the mean over groups is the whole-batch loss
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-12)
    hybrid = (losses[0] + losses[2]) / 2
    np.testing.assert_allclose(hybrid, ref, rtol=1e-9)
    rec = res[0]["records"][-1]
    for key in ("io_s", "compute_s", "halo_s", "gather_s", "allreduce_s", "total_s"):
        assert rec[key] >= 0
    assert rec["halo_s"] > 0 and rec["allreduce_s"] > 0
    assert res[0]["slab_depth"] == 8 and res[0]["peak_rss_mb"] > 0


def test_collectives_calibrate_after_the_same_compute_gap_on_both_ranks():
    sizes = [1024, 65536]
    per_rank = run_ranks("hpcdl.studies.spatial.calibration.comm_timings:collectives", 2,
                         {"sizes_bytes": sizes, "repeats": 2, "gap_s": 0.002}, timeout_s=120)
    for rows in per_rank:
        kinds = ("allreduce", "allgather", "exchange")
        assert [(r["kind"], r["size_bytes"]) for r in rows] == [
            (k, s * (2 if k == "allgather" else 1)) for s in sizes for k in kinds]
        assert all(r["gap_s"] == 0.002 and r["ranks"] == 2 and 0 < r["time_s"] < 5 for r in rows)


def test_calibration_gap_is_a_config_key_with_a_default(test_config):
    from hpcdl.platform.kit.config import validate_config

    cfg = validate_config(test_config)
    assert cfg["spatial"]["calibration"]["comm_gap_ms"] == 2.0


# ---- the same on CUDA (skipped without a GPU) -------------------------------------------------

def _gpus() -> int:
    from hpcdl.platform.kit.device import visible_gpus

    return visible_gpus()


def _one_gpu(monkeypatch):
    """Ranks started from here see one GPU (the first of this process's): with gpu_sharing they share
    it over gloo, whatever the machine has."""
    import os

    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", first)


# (ranks, grid, layout): "nccl" one GPU per rank (needs as many GPUs), "shared" all ranks on one GPU
CUDA_LAYOUTS = [(1, (1, 1), "nccl"), (2, (2, 1), "nccl"), (2, (2, 1), "shared"), (4, (2, 2), "shared")]


def _cuda_launch(nprocs, layout, monkeypatch) -> dict:
    if layout == "nccl" and _gpus() < nprocs:
        pytest.skip(f"{nprocs} ranks over NCCL need {nprocs} GPUs; {_gpus()} visible")
    if layout == "shared":
        _one_gpu(monkeypatch)
    return {"device": "cuda", "gpu_sharing": layout == "shared"}


def _assert_placed(rows, layout):
    for r in rows:
        if layout == "nccl":
            assert (r["device"], r["placement"]) == ("cuda", f"cuda:{r['rank']} (nccl)"), r
        else:
            assert (r["device"], r["placement"]) == ("cuda", "cuda:0 (shared GPU, gloo via host memory)"), r


@pytest.mark.cuda
@pytest.mark.parametrize("nprocs,grid,layout", CUDA_LAYOUTS,
                         ids=["1rank", "2ranks-nccl", "2ranks-shared-gpu", "4ranks-depth-height-shared-gpu"])
def test_partitioned_conv_and_model_exact_on_cuda(nprocs, grid, layout, monkeypatch):
    conv, model = _suite(nprocs, grid, **_cuda_launch(nprocs, layout, monkeypatch))
    _assert_exact(conv, model, nprocs)
    _assert_placed(model, layout)
    _assert_placed([row for rows in conv for row in rows], layout)
    assert {r["backend"] for r in model} == {"gloo" if layout == "shared" else "nccl"}


@pytest.mark.cuda
@pytest.mark.parametrize("nprocs,layout", [(1, "nccl"), (2, "nccl"), (2, "shared")],
                         ids=["1rank", "2ranks-nccl", "2ranks-shared-gpu"])
def test_training_on_cuda_equals_whole_batch_training(nprocs, layout, tmp_path, monkeypatch):
    placed = _cuda_launch(nprocs, layout, monkeypatch)
    data = ensure_dataset(tmp_path, (16, 8, 8), 8, 0, (0.5, 2.0), (-3.0, -1.0))
    kw = dict(data_dir=str(data), model=MODEL, batch_size=2, iterations=3, lr=1e-2, seed=0)
    ref = reference_losses(**kw, dtype="float64")  # one process, on the host
    runs = {}
    for overlap in (True, False):
        runs[overlap] = run_ranks("hpcdl.studies.spatial.train:train_run", nprocs,
                                  {**kw, "n_data": 1, "grid": (nprocs, 1), "dtype": "float64",
                                   "overlap": overlap, "bucket_kb": 0.5}, timeout_s=240, **placed)
    for res in runs.values():
        _assert_placed(res, layout)
        for r in res:
            np.testing.assert_allclose([rec["loss"] for rec in r["records"]], ref, rtol=1e-9)
            assert r["gpu_peak_mb"] > 0
            for rec in r["records"]:
                assert all(rec[k] >= 0 for k in ("io_s", "compute_s", "halo_s", "gather_s", "allreduce_s"))
                assert rec["total_s"] > 0
    if nprocs > 1:  # the exchanges were timed on the GPU's stream
        for key in ("halo_s", "gather_s"):
            assert sum(rec[key] for r in runs[False] for rec in r["records"]) > 0, key


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["nccl", "shared"], ids=["nccl", "shared-gpu"])
def test_calibration_on_cuda_times_every_kind(layout, tmp_path, monkeypatch):
    placed = _cuda_launch(2, layout, monkeypatch)
    data = ensure_dataset(tmp_path, (8, 8, 8), 4, 0, (0.5, 2.0), (-3.0, -1.0))
    rows = run_ranks("hpcdl.studies.spatial.calibration.microbench:calibrate_rank", 2, {
        "specs": [(build_spec((8, 8, 8), MODEL), 2)], "data_dir": str(data), "sizes_bytes": [1024, 65536],
        "fractions": [1.0, 0.5], "repeats": 2, "comm_gap_s": 0.001}, timeout_s=300, **placed)[0]
    kinds = {"pingpong", "allreduce", "allgather", "exchange", "conv", "pool", "dense", "optimizer", "io"}
    assert kinds <= {r["kind"] for r in rows}
    assert all(r["time_s"] > 0 and r["device"] == "cuda" for r in rows)
