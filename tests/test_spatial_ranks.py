"""Spatial study on real ranks (forked + gloo): exactness in float64 on 1, 2 and 4 ranks,
hybrid data x spatial training equal to whole-batch training, and faults (no hangs)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from references import reference_losses

from hpcdl.platform.rank_runtime.launch import RankFailure, run_ranks
from hpcdl.studies.spatial.data import ensure_dataset

TOL = 1e-10
# kernel 1/3/5, stride 1/2, same/valid padding, an even and an uneven depth
CASES = [dict(cin=2, cout=3, kernel=k, stride=s, padding=p, depth=d, height=9, width=5)
         for k in (1, 3, 5) for s in (1, 2) for p in ("same", "valid") for d in (16, 13)]
MODEL = {"channels": [3, 4], "dense": [8]}


def _suite(nprocs, grid):
    conv = run_ranks("rank_probes:conv_cases", nprocs, {"cases": CASES, "grid": grid},
                     timeout_s=240)
    model = run_ranks("hpcdl.studies.spatial.exactness:model_case", nprocs,
                      {"shape": (16, 12, 10), "model": MODEL, "grid": grid}, timeout_s=240)
    return conv, model


@pytest.mark.parametrize("nprocs,grid", [
    (1, (1, 1)), (2, (2, 1)),
    pytest.param(4, (4, 1), marks=pytest.mark.slow), pytest.param(4, (2, 2), marks=pytest.mark.slow)],
    ids=["1rank", "2ranks-depth", "4ranks-depth", "4ranks-depth-height"])
def test_partitioned_conv_and_model_exact(nprocs, grid):
    conv, model = _suite(nprocs, grid)
    assert len(conv) == nprocs and all(len(r) == len(CASES) for r in conv)
    for rank_rows in conv:
        for row in rank_rows:
            for key in ("err_out", "err_grad_input", "err_grad_weight", "err_grad_bias"):
                assert row[key] <= TOL, (key, row)
    for row in model:
        assert row["err_loss"] <= TOL and row["err_grad_input"] <= TOL and row["err_grad_params"] <= TOL, row
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
    per_rank = run_ranks("hpcdl.studies.spatial.calibration:collectives", 2,
                         {"sizes_bytes": sizes, "repeats": 2, "gap_s": 0.002}, timeout_s=120)
    for rows in per_rank:
        kinds = ("allreduce", "allgather", "exchange")
        assert [(r["kind"], r["size_bytes"]) for r in rows] == [
            (k, s * (2 if k == "allgather" else 1)) for s in sizes for k in kinds]
        assert all(r["gap_s"] == 0.002 and r["ranks"] == 2 and 0 < r["time_s"] < 5 for r in rows)


def test_calibration_gap_is_a_config_key_with_a_default(test_config):
    from hpcdl.platform.config import validate_config

    cfg = validate_config(test_config)
    assert cfg["spatial"]["calibration"]["comm_gap_ms"] == 2.0
