"""The checkpoint study on its device (#25): checkpoint.device is resolved once by the task app and
carried by every point, so stored points are keyed by it; every row names it; the ceiling, the
claims and the figures say which ceiling and which device apply. CPU tests cover the routing, the
columns, the claims' text and the config; tests marked `cuda` cover what only a GPU does (the pinned
snapshot, the sync save's device-to-host copy, DCP from GPU ranks over NCCL, resume onto the GPU)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from hpcdl.platform.kit.config import validate_config
from hpcdl.platform.kit.device import visible_gpus
from hpcdl.platform.kit.study import spec
from hpcdl.studies.checkpoint import claims, compute, distributed, saver, sweep, tables, training
from hpcdl.studies.checkpoint.formats import FORMATS
from hpcdl.studies.checkpoint.instruments import CEILINGS, synthetic_state

ALL = list(FORMATS)
TINY = {"n_samples": 64, "n_features": 8, "n_classes": 4, "width": 16, "depth": 1, "batch_size": 8}


def _cfg(test_config: dict, **block) -> dict:
    cfg = copy.deepcopy(test_config)
    cfg["checkpoint"] = {**cfg["checkpoint"], **block}
    return validate_config(cfg)


# ---- CPU: declaration, routing, columns ------------------------------------------------------------

def test_the_study_declares_its_cuda_path_and_the_gpus_a_task_holds(test_config):
    s = spec("checkpoint")
    assert s.devices == ("cpu", "cuda")
    assert s.task_gpus(_cfg(test_config, dcp_ranks=[2])) == 2      # the largest DCP launch, one per rank
    assert s.task_gpus(_cfg(test_config, dcp_ranks=[1, 4])) == 4
    assert s.task_gpus(_cfg(test_config, dcp_ranks=[], formats=["torch"])) == 1  # single-process points


def test_every_point_carries_the_device_so_points_are_keyed_by_it(test_config):
    cfg = _cfg(test_config, gpu_sharing=True)
    for make in (sweep.io_points, sweep.resume_points, sweep.overhead_points):
        cpu, gpu = make(cfg, "cpu"), make(cfg, "cuda")
        assert {p["device"] for p in cpu} == {"cpu"} and {p["device"] for p in gpu} == {"cuda"}
        assert len(cpu) == len(gpu) and all(a != b for a, b in zip(cpu, gpu, strict=True))
    ranks_cpu = [p for p in sweep.io_points(cfg, "cpu") if p["kind"] == "ranks"]
    ranks_gpu = [p for p in sweep.io_points(cfg, "cuda") if p["kind"] == "ranks"]
    assert ranks_gpu and all(p["gpu_sharing"] is True for p in ranks_gpu)
    assert all("gpu_sharing" not in p for p in ranks_cpu)   # it means nothing on the CPU
    with pytest.raises(ValueError, match="resolved device"):
        sweep.io_points(cfg, "auto")


def test_on_the_cpu_a_point_names_its_device_ceiling_and_phases(tmp_path):
    sync = compute.run_point("torch", "sync", 4096, str(tmp_path), repeats=2, device="cpu")
    for r in sync:
        assert r["device"] == "cpu" and r["ceiling"] == CEILINGS["cpu"] and r["roundtrip_ok"]
        assert math.isnan(r["d2h_s"]) and math.isnan(r["d2h_ceiling_s"])  # no device-to-host copy
        assert math.isnan(r["snapshot_s"]) and math.isnan(r["persist_s"])
        assert r["storage_ceiling_s"] == pytest.approx(r["ceiling_s"])  # the ceiling is the storage's
    for fmt in ("torch", "dcp"):
        for r in compute.run_point(fmt, "async", 4096, str(tmp_path), repeats=2, device="cpu"):
            assert r["device"] == "cpu" and r["ceiling"] == "" and math.isnan(r["ceiling_s"])
            assert 0 < r["snapshot_s"] <= r["blocking_s"]      # the snapshot is what blocks
            assert 0 < r["persist_s"] <= r["commit_s"]         # the background phase, up to the commit
            assert r["blocking_s"] + r["persist_s"] == pytest.approx(r["commit_s"], abs=1e-9)
    with pytest.raises(ValueError, match="resolved device"):
        compute.run_point("torch", "sync", 4096, str(tmp_path), device="gpu")


def test_cpu_state_is_snapshotted_into_plain_memory_and_saved_without_a_copy(tmp_path):
    flat = synthetic_state(3000, 0)
    assert not saver.on_gpu(flat)
    snap = saver.Snapshot()
    snap.prepare(flat)
    assert not snap.pinned and math.isnan(snap.gpu_copy_s)
    out = snap.take(flat)
    assert all(torch.equal(out[k], flat[k]) for k in flat) and snap.copy_s >= 0
    t = saver.save(flat, tmp_path, "a", "npz")
    assert math.isnan(t.d2h_s)


def test_dcp_ranks_on_the_cpu_are_gloo_and_say_so(tmp_path):
    rows = distributed.run_point(2, 8192, str(tmp_path), repeats=1, device="cpu", timeout_s=120)
    assert len(rows) == 1
    r = rows[0]
    assert r["device"] == "cpu" and r["placement"] == "cpu (gloo)" and r["roundtrip_ok"]
    assert r["ceiling"] == CEILINGS["cpu"] and math.isnan(r["d2h_ceiling_s"])


def test_resume_on_the_cpu_records_where_it_resumed(tmp_path):
    rec = training.resume_check("torch", str(tmp_path), TINY, 6, 3, device="cpu")
    assert rec["bit_identical"], rec["mismatched"]
    assert rec["device"] == "cpu" and rec["resumed_on"] == "cpu"
    with pytest.raises(ValueError, match="resolved device"):
        training.resume_check("torch", str(tmp_path), TINY, 6, 3, device="auto")


def test_the_phases_of_a_resume_check_agree_in_and_out_of_process(tmp_path):
    """On the GPU every phase runs in a fresh process (resume_check): the same phase gives the same
    fingerprint there as here, and the `first` phase leaves its checkpoint in the given format."""
    from hpcdl.studies.checkpoint import integrity

    spec = training.TrainSpec(**{**TINY, "dropout": 0.3})
    here = training._phase("reference", tmp_path, spec, 6, "cpu", "torch")
    there = training._in_fresh_process("reference", tmp_path, spec, 6, "cpu", "torch", 120)
    assert here == there and there["params_on"] == "cpu" and "next_cuda" not in there
    first = training._in_fresh_process("first", tmp_path / "r", spec, 3, "cpu", "npz", 120)
    latest = integrity.latest(tmp_path / "r")
    assert latest.name == "step-000000003" and integrity.read_manifest(latest)["format"] == "npz"
    assert first["checkpoint_bytes"] > 0


def _raw(device: str | None) -> pd.DataFrame:
    rows = []
    for fmt in ("torch", "npz"):
        for mode, blocking in (("sync", 2.0), ("async", 0.1)):
            for rep, scale in enumerate((1.0, 1.2)):
                rows.append({"format": fmt, "mode": mode, "process_group": False, "ranks": 1,
                             "n_params": 1024, "repeat": rep, "state_bytes": 4096, "file_bytes": 4200,
                             "blocking_s": blocking * scale, "durable_s": 1.5, "commit_s": 2.0,
                             "load_s": 1.0, "verify_s": 0.1, "write_bw_bytes_per_s": 2800.0,
                             "ceiling_s": 1.2 if mode == "sync" else np.nan,
                             "ceiling_bw_bytes_per_s": 3400.0 if mode == "sync" else np.nan,
                             "bw_over_ceiling": 0.8 if mode == "sync" else np.nan,
                             "ceiling_spread": 0.02 if mode == "sync" else np.nan,
                             "save_peak_extra_rss_bytes": 0, "load_peak_extra_rss_bytes": 0,
                             "roundtrip_ok": True, "status": "ok", "error": ""})
    df = pd.DataFrame(rows)
    if device is not None:
        df["device"] = device
        df["ceiling"] = [CEILINGS[device] if m == "sync" else "" for m in df["mode"]]
    return df


def test_io_cost_is_keyed_by_device_and_pairs_async_blocking_with_sync():
    cost = tables.io_cost(_raw("cuda"))
    assert set(cost["device"]) == {"cuda"}
    a = cost[cost["mode"] == "async"].set_index("format")
    assert a.loc["torch", "sync_blocking_s"] == pytest.approx(2.2)        # median of 2.0, 2.4
    assert a.loc["torch", "blocking_over_sync"] == pytest.approx(0.11 / 2.2)
    s = cost[cost["mode"] == "sync"]
    assert s["blocking_over_sync"].isna().all() and set(s["ceiling"]) == {CEILINGS["cuda"]}
    # a raw table from before the CUDA path: all measured on the CPU, divided by the storage ceiling
    old = tables.io_cost(_raw(None))
    assert set(old["device"]) == {"cpu"}
    assert set(old.loc[old["mode"] == "sync", "ceiling"]) == {CEILINGS["cpu"]}
    assert old["d2h_s"].isna().all() and old["snapshot_s"].isna().all()


def _judge(tmp_path: Path, test_config: dict, device: str | None) -> dict:
    cfg = _cfg(test_config, formats=["torch", "npz"], dcp_ranks=[],
               sizes={"min_params": 1024, "max_params": 1024, "points": 1})
    t = tmp_path / "tables"
    t.mkdir(parents=True, exist_ok=True)
    tables.io_cost(_raw(device)).to_csv(t / "io_cost.csv", index=False)
    resume = pd.DataFrame({"format": ["torch", "npz"], "status": "ok", "error": "", "bit_identical": True})
    if device is not None:
        resume["device"] = device
    resume.to_csv(t / "resume.csv", index=False)
    pd.DataFrame(columns=["kind", "point", "error"]).to_csv(t / "failures.csv", index=False)
    return {c["id"]: c for c in claims.judge(cfg, tmp_path)}


def test_claims_with_cpu_thresholds_say_the_device_they_hold_for(tmp_path, test_config):
    cpu = _judge(tmp_path / "cpu", test_config, "cpu")
    old = _judge(tmp_path / "old", test_config, None)   # tables from before the device column
    for by_id in (cpu, old):
        assert by_id["async_blocking"]["statement"].endswith(", on the CPU")
        assert "storage ceiling probed" in by_id["bandwidth_vs_ceiling"]["statement"]
        assert {c["measured"]["device"] for c in by_id.values()} == {"cpu"}
    assert cpu["bandwidth_vs_ceiling"]["measured"]["ceiling"] == CEILINGS["cpu"]
    assert [cpu[k]["status"] for k in sorted(cpu)] == [old[k]["status"] for k in sorted(old)]

    gpu = _judge(tmp_path / "gpu", test_config, "cuda")
    a, b = gpu["async_blocking"], gpu["bandwidth_vs_ceiling"]
    assert "pinned host memory" in a["statement"] and "device-to-host copy" in a["statement"]
    assert "D2H + storage ceiling" in b["statement"]
    for c in (a, b):
        assert c["statement"].endswith("on the GPU (CUDA); the threshold was set for the CPU")
    assert b["measured"]["ceiling"] == CEILINGS["cuda"] and b["measured"]["device"] == "cuda"
    assert "onto the GPU" in gpu["resume_bit_identical"]["statement"]
    # the verdicts come from the same numbers whatever the device
    assert a["status"] == cpu["async_blocking"]["status"] == "passed"           # 0.11 / 2.2 = 5 % <= 10 %
    assert b["status"] == cpu["bandwidth_vs_ceiling"]["status"] == "failed"     # 0.8 < 0.9
    assert b["measured"]["best_bw_over_ceiling"] == pytest.approx(0.8)


def test_a_defective_gpu_ceiling_is_named_as_the_d2h_plus_storage_ceiling(tmp_path, test_config):
    cfg = _cfg(test_config, formats=["torch"], dcp_ranks=[], modes=["sync"],
               sizes={"min_params": 1024, "max_params": 1024, "points": 1})
    raw = _raw("cuda")
    raw = raw[(raw["format"] == "torch") & (raw["mode"] == "sync")].assign(bw_over_ceiling=1.5)
    one = tables.single_process(tables.io_cost(raw))
    no_failures = pd.DataFrame(columns=["kind", "point", "error"])
    c = claims._claim_bandwidth(one, cfg["checkpoint"], 1024, no_failures, "cuda")
    assert c["status"] == "not_measured"
    assert f"the {CEILINGS['cuda']} ceiling is defective" in c["reason"]


def test_figures_of_a_gpu_run_name_its_ceiling_and_rank_backend(tmp_path, test_config):
    from hpcdl.studies.checkpoint import figures

    raw = _raw("cuda")
    dcp = raw[raw["mode"] == "sync"].head(1).assign(format="dcp", process_group=True, ranks=2,
                                                      placement="cuda:0 (nccl) / cuda:1 (nccl)")
    (tmp_path / "tables").mkdir()
    tables.io_cost(pd.concat([raw, dcp])).to_csv(tmp_path / "tables" / "io_cost.csv", index=False)
    figures.draw(_cfg(test_config), tmp_path)
    for fig in spec("checkpoint").figures:
        assert (tmp_path / "figures" / f"{fig}.png").stat().st_size > 5000, fig
    assert figures._ranks_label("cuda", "cuda:0 (nccl) / cuda:1 (nccl)") == "NCCL GPU"
    assert figures._ranks_label("cuda", "cuda:0 (shared GPU, gloo via host memory)") == "shared-GPU gloo"
    assert figures._ranks_label("cpu", "cpu (gloo)") == "gloo"


def test_a_run_whose_points_all_failed_takes_its_device_from_the_provenance(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "io.provenance.json").write_text(json.dumps({"device": "cuda", "gpu_model": "X"}))
    assert tables.run_device(pd.DataFrame(), tmp_path) == "cuda"
    assert tables.run_device(pd.DataFrame(), tmp_path / "elsewhere") == "cpu"
    assert tables.run_device(pd.DataFrame({"device": ["cuda", "cuda"]})) == "cuda"


# ---- CUDA ---------------------------------------------------------------------------------------------

def _gpu_state(n: int = 300_000) -> dict:
    return {k: t.to("cuda") for k, t in synthetic_state(n, 3).items()}


@pytest.mark.cuda
def test_the_snapshot_of_gpu_state_is_a_pinned_copy_into_reused_buffers():
    flat = _gpu_state()
    snap = saver.Snapshot()
    snap.prepare(flat)
    assert snap.pinned and all(b.is_pinned() and b.device.type == "cpu" for b in snap.buffers.values())
    ptrs = {k: b.data_ptr() for k, b in snap.buffers.items()}
    want = {k: t.cpu() for k, t in flat.items()}
    out = snap.take(flat)
    for t in flat.values():  # training goes on: the GPU state changes right after the snapshot
        t.add_(1)
    torch.cuda.synchronize()
    assert all(torch.equal(out[k], want[k]) for k in want)
    assert snap.copy_s > 0 and 0 < snap.gpu_copy_s <= snap.copy_s * 1.5
    snap.take(flat)
    assert {k: b.data_ptr() for k, b in snap.buffers.items()} == ptrs   # reused, not reallocated
    assert all(torch.equal(snap.buffers[k], flat[k].cpu()) for k in flat)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ALL)
def test_async_save_of_gpu_state_blocks_for_the_snapshot_only(tmp_path, fmt):
    """Every format, DCP included (torch 2.11 broke DCP's own staging on a saver's second use),
    snapshots into the saver's reused pinned buffers, save after save."""
    flat = _gpu_state()
    ck = saver.AsyncCheckpointer(tmp_path, fmt)
    ck.prepare(flat)
    assert ck.snapshot.pinned and all(b.is_pinned() for b in ck.snapshot.buffers.values())
    ptrs = {k: b.data_ptr() for k, b in ck.snapshot.buffers.items()}
    for i in range(3):
        want = {k: t.cpu() for k, t in flat.items()}
        blocking = ck.save(flat, f"s{i}")
        for t in flat.values():  # training overwrites the GPU state as soon as save() returns
            t.mul_(-1).add_(1)
        timing = ck.wait()
        assert timing.blocking_s == blocking and 0 < timing.snapshot_s <= blocking
        assert timing.persist_s > 0
        assert timing.commit_s == pytest.approx(blocking + timing.persist_s, abs=1e-6)
        assert {k: b.data_ptr() for k, b in ck.snapshot.buffers.items()} == ptrs
        back = saver.load(timing.path)
        assert all(torch.equal(back[k], want[k]) for k in want), f"save {i}"


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ALL)
def test_sync_save_of_gpu_state_includes_the_device_to_host_copy(tmp_path, fmt):
    flat = _gpu_state()
    t = saver.save(flat, tmp_path, "s", fmt)
    assert 0 < t.d2h_s < t.durable_s <= t.commit_s
    back = saver.load(t.path)
    assert all(torch.equal(back[k], flat[k].cpu()) for k in flat)


@pytest.mark.cuda
def test_a_gpu_point_divides_by_the_d2h_plus_storage_ceiling(tmp_path):
    rows = compute.run_point("safetensors", "sync", 1 << 20, str(tmp_path), repeats=2, device="cuda")
    for r in rows:
        assert r["device"] == "cuda" and r["ceiling"] == CEILINGS["cuda"] and r["roundtrip_ok"]
        assert r["d2h_s"] > 0 and r["d2h_ceiling_s"] > 0
        # the ceiling of a moment is its D2H probe plus its storage probe
        assert r["ceiling_s"] == pytest.approx(r["storage_ceiling_s"] + r["d2h_ceiling_s"])
        assert r["bw_over_ceiling"] == pytest.approx(r["write_bw_bytes_per_s"] / r["ceiling_bw_bytes_per_s"])
    for r in compute.run_point("torch", "async", 1 << 20, str(tmp_path), repeats=1, device="cuda"):
        assert r["device"] == "cuda" and r["roundtrip_ok"] and 0 < r["snapshot_s"] <= r["blocking_s"]


@pytest.mark.cuda
@pytest.mark.parametrize("ranks", [1, 2])
def test_dcp_from_gpu_ranks_over_nccl_round_trips(tmp_path, ranks):
    if visible_gpus() < ranks:
        pytest.skip(f"{ranks} NCCL ranks need {ranks} GPUs, {visible_gpus()} visible")
    rows = distributed.run_point(ranks, 1 << 20, str(tmp_path), repeats=1, device="cuda", timeout_s=300)
    r = rows[0]
    assert r["device"] == "cuda" and r["roundtrip_ok"] and r["ceiling"] == CEILINGS["cuda"]
    assert "(nccl)" in r["placement"] and "shared" not in r["placement"]
    assert r["d2h_ceiling_s"] > 0 and r["ceiling_s"] > r["d2h_ceiling_s"]


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ALL)
def test_resume_onto_the_gpu_is_bit_identical(tmp_path, fmt):
    rec = training.resume_check(fmt, str(tmp_path), {**TINY, "dropout": 0.2}, 12, 5, device="cuda")
    assert rec["bit_identical"], rec["mismatched"]
    assert rec["device"] == "cuda" and rec["resumed_on"].startswith("cuda")


@pytest.mark.cuda
def test_a_cpu_checkpoint_cannot_resume_a_gpu_run_exactly():
    cpu = training.Trainer(training.TrainSpec(**TINY))
    gpu = training.Trainer(training.TrainSpec(**TINY), device="cuda")
    from hpcdl.studies.checkpoint import integrity, state

    with pytest.raises(integrity.CheckpointError, match="no CUDA generator state"):
        gpu.load_state_dict(state.unflatten(state.flatten(cpu.state_dict())))


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_overhead_run_trains_on_the_gpu_and_checkpoints_from_it(tmp_path, mode):
    r = training.overhead_run(mode, 2, "torch", str(tmp_path), TINY, steps=6, warmup_steps=1, device="cuda")
    assert r["device"] == "cuda" and r["n_checkpoints"] == 3 and r["stall_mean_s"] > 0
    assert not any(tmp_path.iterdir())
