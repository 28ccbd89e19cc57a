"""Checkpoint study: formats, integrity, async snapshots, training-state resume, table helpers."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
import torch

from hpcdl.studies.checkpoint import compute, instruments, integrity, saver, state, sweep, tables, training
from hpcdl.studies.checkpoint.formats import FORMATS

ALL = list(FORMATS)


def small_state() -> dict:
    g = torch.Generator().manual_seed(1)
    return {"layers.0.weight": torch.randn(8, 16, generator=g), "layers.0.bias": torch.randn(8, generator=g),
            "counts": torch.arange(5), "flag": torch.tensor(3)}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_flatten_roundtrip_keeps_types_exactly():
    groups = [{"betas": (0.9, 0.999), "lr": 1e-3, "amsgrad": False, "x": None}]
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    nested = {"model": {"w": torch.randn(3, 2)},
              "opt": {"state": {0: {"step": torch.tensor(4.0)}}, "groups": groups},
              "rng": rng, "loader": {"epoch": 2, "batch": 7}}
    flat = state.flatten(nested)
    assert all(isinstance(t, torch.Tensor) for t in flat.values())
    back = state.unflatten(flat)
    assert list(back["opt"]["state"]) == [0]  # int keys stay ints (optimizer load_state_dict needs them)
    assert back["opt"]["groups"][0]["betas"] == (0.9, 0.999)
    assert back["opt"]["groups"][0]["x"] is None and back["opt"]["groups"][0]["amsgrad"] is False
    assert back["rng"]["python"] == nested["rng"]["python"]
    np_state = back["rng"]["numpy"]
    assert np_state[0] == "MT19937" and np_state[1].dtype == np.uint32
    assert np.array_equal(np_state[1], nested["rng"]["numpy"][1])
    assert torch.equal(back["model"]["w"], nested["model"]["w"])
    assert back["loader"] == {"epoch": 2, "batch": 7}


def test_flatten_rejects_unsupported_objects():
    with pytest.raises(TypeError, match="cannot checkpoint a object at x"):
        state.flatten({"x": object()})


@pytest.mark.parametrize("fmt", ALL)
def test_sync_save_load_roundtrip_commits_atomically(tmp_path, fmt):
    flat = small_state()
    t = saver.save(flat, tmp_path, "step-000000001", fmt)
    assert t.path == tmp_path / "step-000000001" and (t.path / integrity.MANIFEST).is_file()
    assert integrity.read_manifest(t.path)["format"] == fmt
    assert t.file_bytes >= state.tensor_bytes(flat)
    assert 0 < t.durable_s <= t.commit_s
    assert [p.name for p in tmp_path.iterdir()] == ["step-000000001"]  # no staging leftovers
    assert_same(saver.load(t.path), flat)
    with pytest.raises(integrity.CheckpointError, match="already exists"):
        saver.save(flat, tmp_path, "step-000000001", fmt)


@pytest.mark.parametrize("fmt", ALL)
def test_async_save_persists_the_snapshot_not_later_updates(tmp_path, fmt):
    flat = small_state()
    want = {k: v.clone() for k, v in flat.items()}
    ck = saver.AsyncCheckpointer(tmp_path, fmt)
    ck.prepare(flat)
    blocking = ck.save(flat, "a")
    for t in flat.values():  # training goes on and changes the weights in place
        t.add_(1)
    timing = ck.wait()
    assert blocking >= 0 and timing.blocking_s == blocking and timing.commit_s >= timing.durable_s
    assert_same(saver.load(timing.path), want)
    ck.save(flat, "b")  # the next snapshot sees the new values
    assert_same(saver.load(ck.wait().path), flat)


@pytest.mark.parametrize("fmt", ALL)
def test_one_async_saver_snapshots_into_the_same_buffers_save_after_save(tmp_path, fmt):
    """CheckFreq's phase 1 copies into the saver's own preallocated snapshot, for DCP as for the
    others, and one saver serves many saves: on the GPU image's torch 2.11, a saver whose snapshot
    was DCP's stager failed its first save after prepare(), the stager's second use. Saves 1 and 3
    start while the previous persist may still run (save() waits for it), 0 and 2 are waited for."""
    flat = small_state()
    ck = saver.AsyncCheckpointer(tmp_path, fmt)
    ck.prepare(flat)
    ptrs = {k: b.data_ptr() for k, b in ck.snapshot.buffers.items()}
    assert ptrs.keys() == flat.keys()
    wants = []
    for i in range(4):
        wants.append({k: v.clone() for k, v in flat.items()})
        blocking = ck.save(flat, f"step-{i}")
        for t in flat.values():  # training changes the state in place while the persist runs
            t.mul_(2).add_(1)
        assert {k: b.data_ptr() for k, b in ck.snapshot.buffers.items()} == ptrs  # reused, not new
        if i % 2 == 0:
            timing = ck.wait()
            assert timing.path == tmp_path / f"step-{i}" and timing.blocking_s == blocking
            # recorded: training resumed at the snapshot's end, before the persist committed
            assert 0 <= timing.snapshot_s <= timing.blocking_s < timing.commit_s
            assert timing.persist_s > 0 and timing.durable_s <= timing.commit_s
            assert timing.commit_s == pytest.approx(timing.blocking_s + timing.persist_s, abs=1e-6)
    ck.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step-{i}" for i in range(4)]
    for i, want in enumerate(wants):  # each checkpoint holds the state at its own save
        assert_same(saver.load(tmp_path / f"step-{i}"), want)


def test_async_dcp_saves_on_ranks_keep_off_the_training_process_group(tmp_path):
    """With a process group initialised (2 gloo ranks) each rank's background DCP save runs alone,
    beside the main thread's all-reduces on the default group, and commits that rank's own state
    whole in that rank's own directory."""
    from hpcdl.platform.kit.rank_runtime.launch import run_ranks

    out = run_ranks("checkpoint_rank_probes:async_dcp_saves_beside_collectives", 2,
                    {"root": str(tmp_path), "saves": 3, "reduces": 20}, timeout_s=180)
    for r, res in enumerate(out):
        assert res["rank"] == r and res["world"] == 2
        assert res["mismatched"] == [], res
        assert res["entries"] == ["step-0", "step-1", "step-2"]
        assert res["w_after"] == r + 3 * 20 * 2.0  # every all-reduce summed both ranks' ones


def test_the_checkpoint_package_uses_no_dcp_staging_api():
    """The async DCP save stages into the study's own snapshot and persists with dcp.save. DCP's
    stagers / async_save changed between torch 2.11 (the GPU image: a reused stager raised
    KeyError: <class 'type'>) and 2.13 (the CPU venv), so the package must not come to rely on
    them again; a CPU run alone would not notice."""
    import ast
    from pathlib import Path

    import hpcdl.studies.checkpoint as pkg

    found = []
    for path in sorted(Path(pkg.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = {ast.Name: lambda n: [n.id], ast.Attribute: lambda n: [n.attr],
                     ast.alias: lambda n: [n.name, n.asname or ""],
                     ast.ImportFrom: lambda n: [n.module or ""]}.get(type(node), lambda n: [])(node)
            found += [f"{path.name}:{node.lineno}: {name}" for name in names
                      if any(bad in name.lower() for bad in ("stager", "async_save", "staging"))]
    assert found == [], f"DCP staging API used (breaks on torch 2.11, see saver's docstring): {found}"


@pytest.mark.parametrize("fmt", ALL)
def test_flipped_byte_fails_load_naming_the_file(tmp_path, fmt):
    t = saver.save(small_state(), tmp_path, "ck", fmt)
    victim = max(integrity.payload_files(t.path), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(integrity.CheckpointError) as err:
        saver.load(t.path)
    assert str(victim) in str(err.value) and "sha256" in str(err.value)


def test_truncated_missing_and_extra_files_are_refused(tmp_path):
    t = saver.save(small_state(), tmp_path, "ck", "torch")
    payload = t.path / "state.pt"
    payload.write_bytes(payload.read_bytes()[:100])
    with pytest.raises(integrity.CheckpointError, match=f"{payload} has 100 bytes"):
        saver.load(t.path)
    payload.unlink()
    with pytest.raises(integrity.CheckpointError, match=f"{payload} listed in .* is missing"):
        saver.load(t.path)
    (t.path / integrity.MANIFEST).unlink()
    with pytest.raises(integrity.CheckpointError, match="MANIFEST.json is missing"):
        saver.load(t.path)


def test_staging_directories_are_never_taken_for_checkpoints(tmp_path):
    saver.save(small_state(), tmp_path, "step-000000001", "npz")
    tmp = integrity.new_tmp_dir(tmp_path, "step-000000002")
    (tmp / "state.npz").write_bytes(b"half a file")
    assert integrity.latest(tmp_path) == tmp_path / "step-000000001"
    with pytest.raises(integrity.CheckpointError, match="uncommitted staging directory"):
        saver.load(tmp)


def test_torch_format_loads_weights_only(tmp_path):
    """A torch file that would need code execution to unpickle is refused."""
    t = saver.save(small_state(), tmp_path, "ck", "torch")
    evil = t.path / "state.pt"
    torch.save({"x": torch.zeros(1), "f": training.Loader(4, 2, 0)}, evil)
    from hpcdl.studies.checkpoint import formats

    with pytest.raises(Exception, match="[Ww]eights only load failed"):
        formats.get("torch").read(t.path)


def test_unknown_format_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown checkpoint format 'zip'; allowed: torch, safetensors"):
        saver.save(small_state(), tmp_path, "ck", "zip")
    assert not any(tmp_path.iterdir())


def test_resume_in_fresh_process_is_bit_identical(tmp_path):
    spec = {"width": 16, "depth": 1, "n_features": 8, "n_samples": 64, "batch_size": 8}
    rec = training.resume_check("safetensors", str(tmp_path), spec, steps_total=12, stop_at=5)
    assert rec["bit_identical"], rec["mismatched"]
    assert rec["state_sha256_uninterrupted"] == rec["state_sha256_resumed"]
    assert not any(tmp_path.iterdir())  # scratch removed


def test_resume_check_detects_a_missing_rng_restore(tmp_path):
    """The fingerprint is sensitive: dropping the RNG state from a resume changes the result."""
    spec = training.TrainSpec(width=16, depth=1, n_features=8, n_samples=64, batch_size=8, dropout=0.5)
    torch.set_num_threads(1)
    ref = training.Trainer(spec)
    ref.train(10)
    first = training.Trainer(spec)
    first.train(4)
    training.save_training_state(first, tmp_path, "torch")
    resumed = training.Trainer(spec, init_seed=99)
    loaded = state.unflatten(saver.load(integrity.latest(tmp_path)))
    resumed.load_state_dict(loaded)
    torch.manual_seed(99)  # as if the RNG state had not been checkpointed
    resumed.train(6)
    assert resumed.fingerprint()["state_sha256"] != ref.fingerprint()["state_sha256"]


def test_loader_position_resumes_mid_epoch():
    a = training.Loader(10, 3, seed=5)
    seq = [a.next_indices().tolist() for _ in range(7)]
    b = training.Loader(10, 3, seed=5)
    for _ in range(4):
        b.next_indices()
    c = training.Loader(10, 3, seed=5)
    c.load_state_dict(b.state_dict())
    assert [c.next_indices().tolist() for _ in range(3)] == seq[4:]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_overhead_run_counts_checkpoints_and_cleans_up(tmp_path, mode):
    spec = {"width": 16, "depth": 1, "n_features": 8, "n_samples": 64, "batch_size": 8}
    rec = training.overhead_run(mode, 2, "torch", str(tmp_path), spec, steps=6, warmup_steps=1)
    assert rec["n_checkpoints"] == 3 and rec["steps"] == 6 and rec["steps_per_s"] > 0
    assert rec["overhead_frac"] == pytest.approx(rec["train_s"] / rec["baseline_train_s"] - 1)
    assert rec["stall_total_s"] == pytest.approx(3 * rec["stall_mean_s"])
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="mode must be sync or async"):
        training.overhead_run("never", 2, "torch", str(tmp_path), spec, steps=6)


def test_young_daly_interval():
    assert training.young_daly_interval_s(3600, 10) == pytest.approx(268.328, rel=1e-5)
    with pytest.raises(ValueError, match="MTBF > 0"):
        training.young_daly_interval_s(0, 1)


def test_young_daly_table_minimises_expected_waste():
    row = {"mode": "sync", "baseline_steps_per_s": 10.0, "status": "ok"}
    ovh = tables.overhead_table(pd.DataFrame([
        {**row, "interval_steps": 5, "stall_mean_s": 0.2},
        {**row, "interval_steps": 20, "stall_mean_s": 0.1},
        {**row, "mode": "async", "interval_steps": 20, "stall_mean_s": 0.0, "status": "failed"}]))
    assert list(ovh["mode"]) == ["sync", "sync"] and list(ovh["interval_s"]) == [0.5, 2.0]
    yd = tables.young_daly_table(ovh, [50.0])
    row = yd.iloc[0]
    assert row["cost_s"] == 0.1 and row["interval_s"] == pytest.approx(np.sqrt(2 * 50 * 0.1))
    assert row["interval_steps"] == pytest.approx(row["interval_s"] * 10)
    t = np.linspace(0.5, 10, 500)
    assert row["expected_waste_frac"] == pytest.approx((0.1 / t + t / 100).min(), rel=1e-3)


def test_sweep_sizes_geometric():
    assert sweep.sweep_sizes(2**20, 2**26, 4) == [2**20, 2**22, 2**24, 2**26]
    assert sweep.sweep_sizes(4096, 4096, 1) == [4096]


def test_synthetic_state_and_ceiling(tmp_path):
    flat = instruments.synthetic_state(3 * instruments.LAYER_PARAMS // 2 + 7, seed=0)
    assert sum(t.numel() for t in flat.values()) == 3 * instruments.LAYER_PARAMS // 2 + 7
    assert all(t.dtype == torch.float32 for t in flat.values())
    assert instruments.storage_ceiling(tmp_path, 3 << 20) > 0
    assert instruments.storage_ceiling(tmp_path, state.tensor_bytes(flat), list(flat.values())) > 0
    assert not any(tmp_path.iterdir())  # probes and page-cache warm-ups removed


def test_ceiling_probe_writes_the_state_as_a_save_does(tmp_path):
    """The probe is a fresh staging directory beside the checkpoints holding one file of exactly the
    state's bytes, tensor after tensor (a save without its format's encoding); random data of the
    same size when no tensors are given."""
    flat = small_state()
    nbytes = state.tensor_bytes(flat)
    tmp, elapsed = instruments.write_probe(tmp_path, nbytes, list(flat.values()))
    assert elapsed > 0 and tmp.parent == tmp_path and integrity.TMP_MARK in tmp.name
    assert [p.name for p in tmp.iterdir()] == ["probe.bin"]
    want = b"".join(t.contiguous().numpy().tobytes() for t in flat.values())
    assert (tmp / "probe.bin").read_bytes() == want and len(want) == nbytes
    other, _ = instruments.write_probe(tmp_path, 3 * (8 << 10) + 5, chunk=8 << 10)
    assert (other / "probe.bin").stat().st_size == 3 * (8 << 10) + 5 and other != tmp


def test_page_cache_warm_up_leaves_nothing_behind(tmp_path):
    instruments.warm_pages(tmp_path, (1 << 20) + 3, chunk=1 << 16)
    instruments.warm_pages(tmp_path, 0)
    assert not any(tmp_path.iterdir())


def test_peak_rss_sees_a_large_allocation():
    with instruments.PeakRSS(0.001) as mem:
        x = torch.ones(64 << 18)  # 64 MiB, touched
    del x
    assert mem.peak_extra_bytes >= 48 << 20


def test_async_repeat_times_its_snapshot_passes_and_keeps_their_median(tmp_path):
    rows = compute.run_point("torch", "async", 1 << 16, str(tmp_path), repeats=2, snapshot_passes=3)
    for r in rows:
        passes = [float(t) for t in r["snapshot_passes_s"].split()]
        assert len(passes) == 3 and passes[0] == pytest.approx(r["snapshot_s"], rel=1e-5)
        assert all(t > 0 for t in passes)
        # the save's own blocking time, its snapshot copy swapped for the passes' median
        assert r["blocking_typical_s"] == pytest.approx(r["blocking_s"] - r["snapshot_s"] + np.median(passes),
                                                        rel=1e-4)
    one = compute.run_point("torch", "async", 1 << 16, str(tmp_path), repeats=1)[0]
    assert len(one["snapshot_passes_s"].split()) == 1 and one["blocking_typical_s"] == one["blocking_s"]
    sync = compute.run_point("torch", "sync", 1 << 16, str(tmp_path), repeats=1)[0]
    assert sync["snapshot_passes_s"] == "" and sync["blocking_typical_s"] == sync["blocking_s"]
    with pytest.raises(ValueError, match="snapshot_passes must be a whole number >= 1, got 0"):
        compute.run_point("torch", "async", 1 << 16, str(tmp_path), snapshot_passes=0)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("fmt,mode", [("torch", "sync"), ("dcp", "async")])
def test_run_point_records_every_measure_and_cleans_scratch(tmp_path, fmt, mode):
    rows = compute.run_point(fmt, mode, 8192, str(tmp_path), repeats=2)
    assert [r["repeat"] for r in rows] == [0, 1]
    for r in rows:
        assert r["state_bytes"] == 8192 * 4 and r["file_bytes"] >= r["state_bytes"] and r["roundtrip_ok"]
        assert r["durable_s"] > 0 and r["load_s"] >= r["verify_s"] > 0
        if mode == "sync":  # two probes around each save, the ratio paired with them
            assert r["ceiling_before_s"] > 0 and r["ceiling_after_s"] > 0 and r["ceiling_spread"] >= 0
            paired = r["write_bw_bytes_per_s"] / r["ceiling_bw_bytes_per_s"]
            assert r["bw_over_ceiling"] == pytest.approx(paired)
            # the ceiling is the faster probe, and on the CPU it is all storage
            faster = min(r["ceiling_before_s"], r["ceiling_after_s"])
            assert r["ceiling_s"] == faster == r["storage_ceiling_s"]
            assert np.isnan(r["d2h_ceiling_s"])
        else:  # nothing compares async bandwidth with the ceiling: no probe is paid for
            assert np.isnan(r["ceiling_s"]) and np.isnan(r["bw_over_ceiling"])
    assert not any(tmp_path.iterdir())


def test_ceiling_pair_is_the_faster_probe_and_their_disagreement():
    mib = 2**20
    pair = compute.ceiling_pair(100 * mib, before_s=1.0, after_s=0.25, write_bw=50.0 * mib)
    assert pair["ceiling_s"] == 0.25 and pair["ceiling_bw_bytes_per_s"] == pytest.approx(400 * mib)
    assert pair["bw_over_ceiling"] == pytest.approx(50 / 400)
    assert pair["ceiling_spread"] == pytest.approx((400 - 100) / 250)  # |bw_a - bw_b| / their mean


@pytest.mark.parametrize("slow_s", [0.55, 1.0, 4.0])
def test_a_noisier_probe_never_raises_the_ratio(slow_s):
    """One probe disturbed (slower) leaves the ratio where the undisturbed one puts it; probes that
    disagree around the same mean lower it. The old mean-of-probes ceiling raised it instead: a save
    at 0.9 of a 0.5 s probe read 4.05 beside a 4 s one."""
    n, bw = 100 * 2**20, 180.0 * 2**20  # the save writes at 0.9 of the quiet probe's 200 MiB/s
    quiet = compute.ceiling_pair(n, 0.5, 0.5, bw)["bw_over_ceiling"]
    assert quiet == pytest.approx(0.9)
    assert compute.ceiling_pair(n, 0.5, slow_s, bw)["bw_over_ceiling"] == pytest.approx(quiet)
    assert compute.ceiling_pair(n, slow_s, 0.5, bw)["bw_over_ceiling"] == pytest.approx(quiet)
    spread = slow_s - 0.5
    assert compute.ceiling_pair(n, 0.5 - spread / 10, 0.5 + spread / 10, bw)["bw_over_ceiling"] < quiet


def test_io_cost_ratio_is_the_median_of_per_repeat_paired_ratios():
    """torch measured while the storage was fast, npz while it was slow, both at half its speed:
    paired, both are 0.5; a ceiling pooled over the two (250) would have made them 0.8 and 0.2."""
    base = {"mode": "sync", "process_group": False, "ranks": 1, "n_params": 1024, "state_bytes": 4096,
            "file_bytes": 4096, "status": "ok", "error": "", "roundtrip_ok": True}
    rows = [{**base, "format": f, "repeat": rep, "write_bw_bytes_per_s": bw / 2, "ceiling_bw_bytes_per_s": bw,
             "bw_over_ceiling": 0.5, "ceiling_spread": 0.1 * (rep + 1)}
            for f, bw in (("torch", 400.0), ("npz", 100.0)) for rep in range(3)]
    # a DCP-ranks row carries one probe and no per-repeat ratio: write bandwidth / that probe
    rows.append({**base, "format": "dcp", "process_group": True, "ranks": 2, "repeat": 0,
                 "write_bw_bytes_per_s": 30.0, "ceiling_bw_bytes_per_s": 60.0})
    raw = pd.DataFrame(rows)
    raw = raw.reindex(columns=[*raw.columns, *(c for c in tables.MEDIAN_COLS if c not in raw)])
    out = tables.io_cost(raw).set_index("format")
    assert list(out.loc[["torch", "npz"], "bw_over_ceiling"]) == [0.5, 0.5]
    assert out.loc["torch", "repeats"] == 3 and out.loc["torch", "ceiling_spread"] == pytest.approx(0.2)
    assert out.loc["dcp", "bw_over_ceiling"] == 0.5 and np.isnan(out.loc["dcp", "ceiling_spread"])


def test_run_point_over_scratch_budget_fails_before_writing(tmp_path):
    with pytest.raises(RuntimeError, match="checkpoint.scratch_limit_mb"):
        compute.run_point("npz", "sync", 1 << 20, str(tmp_path), scratch_limit_mb=1)
    assert not any(tmp_path.iterdir())
