"""Offload study: correctness of every strategy against no offload, the fast-tier accounting and its
budget, bytes moved, the capacity search, bad input and faults, and the task app end to end."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from dataclasses import replace

import pandas as pd
import pytest
import torch

from hpcdl.platform.kit.claims import write_claims
from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.platform.kit.procenv import child_env
from hpcdl.studies.offload import claims as offload_claims
from hpcdl.studies.offload import figures, tables
from hpcdl.studies.offload.accounting import BudgetExceeded, TensorTooLarge
from hpcdl.studies.offload.capacity import largest_depth
from hpcdl.studies.offload.slowtier import FileTier, SlowTierError
from hpcdl.studies.offload.timeline import Timeline
from hpcdl.studies.offload.train import RunSpec, train

OFFLOADS = ("optimizer", "activations", "both")
W, B = 32, 48


def _spec(tmp_path, strategy, depth=3, **kw) -> RunSpec:
    base = dict(
        width=W,
        depth=depth,
        batch=B,
        steps=3,
        slow_dir=str(tmp_path),
        bucket_mb=0.005,
        warmup_steps=1,
        trim_heap=False,
        rss_interval_s=0.01,
    )
    return RunSpec(strategy, **{**base, **kw})


def test_training_leaves_copy_cores_to_the_slow_tier_and_restores_the_threads(tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        for copy_cores, expected in ((1, 2), (0, 3), (5, 1)):  # never fewer than one compute thread
            rec, _ = train(_spec(tmp_path, "optimizer", copy_cores=copy_cores))
            assert rec["compute_threads"] == expected, copy_cores
            assert torch.get_num_threads() == 3  # the caller's count is back
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("foreach", [True, False])
def test_every_offload_strategy_trains_to_bit_identical_weights(tmp_path, foreach):
    runs = {s: train(_spec(tmp_path, s, foreach=foreach), keep_weights=True) for s in ("none", *OFFLOADS)}
    ref = runs["none"][2]
    for s in OFFLOADS:
        rec, _, weights = runs[s]
        assert all(torch.equal(a, b) for a, b in zip(weights, ref, strict=True)), s
        assert rec["weights_sha256"] == runs["none"][0]["weights_sha256"]
    # and training moved the weights (the equality is not of untouched initial values)
    init = torch.nn.Sequential(
        *[m for m in __import__("hpcdl.studies.offload.model", fromlist=["x"]).build_mlp(W, 3, 0)]
    )
    assert not torch.equal(next(init.parameters()), ref[0])
    assert not list(tmp_path.iterdir()), "offload files left behind"


@pytest.mark.cuda
def test_on_cuda_every_strategy_trains_to_none_weights_and_offload_lowers_the_allocator_peak(tmp_path):
    """The CUDA tiers: GPU memory (the allocator's peak) and pinned host memory; save_on_cpu included."""
    runs = {s: train(_spec(tmp_path, s, depth=4, device="cuda", batch=256), keep_weights=True)
            for s in ("none", *OFFLOADS, "save_on_cpu")}
    ref_rec, _, ref = runs["none"]
    assert ref_rec["device"] == "cuda" and ref_rec["peak_measured_by"] == "torch.cuda.max_memory_allocated"
    for s, (rec, timeline, weights) in runs.items():
        assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(weights, ref, strict=True)), s
        assert rec["tier"] == "gpu>pinned_host" and timeline, s
    assert runs["both"][0]["peak_fast_bytes"] < ref_rec["peak_fast_bytes"]
    assert runs["optimizer"][0]["bytes_to_slow"] > 0


def test_points_run_on_the_device_the_app_resolved(test_config):
    """The app resolves offload.device once: every point names it, and save_on_cpu (a CUDA strategy)
    is a point only there."""
    from hpcdl.platform.kit.study import spec
    from hpcdl.studies.offload.sweep import capacity_points, sweep_points

    cfg = validate_config(test_config)
    cfg["offload"]["strategies"] = ["none", "both", "save_on_cpu"]
    on_gpu = sweep_points(cfg, "cuda")
    assert {p["device"] for p in on_gpu} == {"cuda"} and "save_on_cpu" in {p["strategy"] for p in on_gpu}
    on_cpu = sweep_points(cfg, "cpu")
    assert {p["device"] for p in on_cpu} == {"cpu"} and "save_on_cpu" not in {p["strategy"] for p in on_cpu}
    assert {p["spec"]["device"] for p in capacity_points(cfg, "cuda")} == {"cuda"}
    assert spec("offload").task_gpus(cfg) == 1
    # every sweep point measures both tiers after its run; a capacity trial does not
    assert {(p["tier_probe"]["bytes"], p["tier_probe"]["rounds"]) for p in on_cpu} == {(64 << 20, 3)}
    assert all("tier_probe" not in p["spec"] for p in capacity_points(cfg, "cpu"))


def test_a_point_runs_on_the_device_it_carries_and_is_not_resolved_again(tmp_path, monkeypatch):
    """The worker takes the point's device as the app resolved it; an unresolved or absent one is an
    error naming offload.device, not a second resolution."""
    from hpcdl.platform.kit import device as device_mod
    from hpcdl.studies.offload import compute

    def resolved_again(*args):
        raise AssertionError("the worker resolved the device again")

    monkeypatch.setattr(device_mod, "resolve", resolved_again)
    rec, _ = train(_spec(tmp_path, "none", steps=2))
    assert rec["device"] == "cpu"
    with pytest.raises(ValueError, match=r"device is 'auto', not a resolved device.*offload.device"):
        train(_spec(tmp_path, "none", device="auto"))
    point = {"strategy": "none", "width": W, "depth": 2, "batch": B, "steps": 2, "slow_dir": str(tmp_path)}
    with pytest.raises(ValueError, match=r"lacks 'device' \(the resolved offload.device"):
        compute.measure_point(point)


def test_fast_tier_accounts_every_kind_and_offload_lowers_the_peak(tmp_path):
    depth = 6
    n = depth * (W * W + W)
    act = B * W * 4
    recs = {s: train(_spec(tmp_path, s, depth=depth))[0] for s in ("none", *OFFLOADS)}
    none = recs["none"]
    assert none["peak_parameters_bytes"] == 4 * n
    assert none["peak_optimizer_state_bytes"] == 8 * n  # Adam's two moments
    assert (
        none["peak_activations_bytes"] == (2 * depth + 2) * act
    )  # 2 per block + the loss's input and target
    assert "peak_optimizer_staging_bytes" not in none
    assert "peak_optimizer_state_bytes" not in recs["optimizer"]
    acc = {s: r["peak_accounted_bytes"] for s, r in recs.items()}
    assert acc["both"] < acc["activations"] < acc["none"] and acc["both"] < acc["optimizer"]
    assert recs["both"]["peak_activations_bytes"] <= 5 * act  # 2 in-flight writes + 1 in use + 2 prefetched
    for r in recs.values():  # on CPU the fast tier's peak is measured (RSS), the registry's kept beside it
        assert r["peak_measured_by"] == "anonymous RSS high-water mark"
        assert 0 <= r["peak_fast_bytes"] <= r["peak_extra_rss_bytes"]  # the steps' peak, within the run's
        assert r["peak_rss_bytes"] > 0 and r["step_s"] > 0


def test_bytes_moved_each_way_are_exactly_the_offloaded_tensors(tmp_path):
    depth, act, window = 4, B * W * 4, 2
    n = depth * (W * W + W)
    opt = train(_spec(tmp_path, "optimizer", depth=depth))[0]
    assert opt["bytes_to_slow"] == opt["bytes_from_slow"] == 3 * 4 * n  # master, exp_avg, exp_avg_sq
    acts = train(_spec(tmp_path, "activations", depth=depth, write_window=window))[0]
    saved = 2 * depth + 2
    assert acts["bytes_to_slow"] == saved * act
    assert acts["bytes_from_slow"] == (saved - window) * act  # the last writes' tensors are used from memory
    both = train(_spec(tmp_path, "both", depth=depth))[0]
    assert both["bytes_to_slow"] == saved * act + 12 * n
    assert 0.0 <= both["hidden_frac"] <= 1.0
    assert both["exposed_transfer_s"] <= both["step_s"]


def test_timeline_hidden_fraction_is_one_minus_exposed_over_transfer():
    tl = Timeline()
    log = tl.start()
    t0 = log.base
    tl.add("to_slow", "x", t0 + 0.0, t0 + 1.0, 10)
    log.add("from_slow", "x", t0 + 1.0, t0 + 4.0, 30)
    tl.add("wait", "x", t0 + 3.0, t0 + 4.0)
    tl.stop()
    tl.add("wait", "x", t0 + 5.0, t0 + 9.0)  # between steps: part of no step
    log.resolve()
    tl = log
    assert tl.transfer_s() == pytest.approx(4.0)
    assert tl.exposed_s() == pytest.approx(1.0)
    assert tl.hidden_fraction() == pytest.approx(0.75)
    assert tl.bytes("from_slow") == 30


def test_budget_is_enforced_on_the_measured_peak_and_capacity_is_decided_by_trials(tmp_path):
    # width 128: a layer holds ~0.3 MiB, well above the RSS sampling noise; a 4 MiB budget
    spec = _spec(tmp_path, "none", width=128, steps=2, warmup_steps=0, budget_mb=4, trim_heap=True)
    result = largest_depth(spec, 64)
    d = result["max_depth"]
    assert d >= 1 and not result["capped_at_max_depth"]
    assert f"{d}:fit" in result["probes"] and f"{d + 1}:over" in result["probes"]
    assert result["peak_measured_by"] == "anonymous RSS high-water mark"
    assert 0 < result["peak_accounted_bytes_at_max"] <= 4 << 20
    with pytest.raises(BudgetExceeded, match="offload.budget_mb"):
        train(replace(spec, depth=2 * d + 2))  # far over: the registry alone stops it
    both = largest_depth(replace(spec, strategy="both"), 64)
    assert both["max_depth"] > d


def test_the_measured_peak_alone_fails_a_trial_the_registry_would_pass(tmp_path, monkeypatch):
    from hpcdl.studies.offload import process_memory

    spec = _spec(tmp_path, "none", width=128, depth=2, steps=2, warmup_steps=0, budget_mb=4, trim_heap=True)
    rec, _ = train(spec)
    assert rec["peak_accounted_bytes"] < 4 << 20 and rec["peak_fast_bytes"] < 4 << 20
    real, calls = process_memory.rss_bytes, []

    def held_more():  # after the run's start the process holds 8 MiB the registry does not count
        calls.append(1)
        return real() + (8 << 20 if len(calls) > 1 else 0)

    monkeypatch.setattr(process_memory, "rss_bytes", held_more)
    with pytest.raises(BudgetExceeded, match="anonymous RSS high-water mark"):
        train(spec)


def test_budget_smaller_than_the_largest_tensor_is_a_clear_error(tmp_path, test_config):
    cfg = {**test_config, "studies": ["offload"]}
    cfg["offload"] = {
        **cfg["offload"],
        "model": {**cfg["offload"]["model"], "width": 512, "batch": 64},
        "capacity": {**cfg["offload"]["capacity"], "budget_mb": 0.5},
    }
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    assert "offload.capacity.budget_mb" in str(err.value) and "512x512 fp32 weight" in str(err.value)
    assert "1048576 bytes" in str(err.value)
    with pytest.raises(
        TensorTooLarge, match=r"'offload.budget_mb'.*512x512 fp32 weight of 1.00 MiB \(1048576 bytes"
    ):
        train(_spec(tmp_path, "none", width=512, batch=64, budget_mb=0.1))
    with pytest.raises(
        TensorTooLarge, match=r"'offload.budget_mb'.*4096x64 fp32 activation of 1.00 MiB \(1048576 bytes"
    ):
        train(_spec(tmp_path, "none", width=64, batch=4096, budget_mb=0.5))


def test_missing_slow_tier_directory_names_the_path_and_creates_nothing(tmp_path):
    missing = tmp_path / "no" / "such"
    with pytest.raises(SlowTierError, match=f"slow-tier directory {missing} does not exist"):
        train(_spec(missing, "both"))
    assert not (tmp_path / "no").exists()


def _unshare_ok() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


IN_NAMESPACE = """
import sys
from hpcdl.studies.offload.train import RunSpec, train
from hpcdl.studies.offload.slowtier import SlowTierError
try:
    train(RunSpec(sys.argv[2], 64, 4, 256, 2, slow_dir=sys.argv[1], bucket_mb=0.05, trim_heap=False))
except SlowTierError as exc:
    print("ERROR", exc)
"""


@pytest.mark.skipif(
    not _unshare_ok(), reason="needs unprivileged user+mount namespaces (unshare -rm) for a small tmpfs"
)
@pytest.mark.parametrize(
    ("opts", "strategy", "words"),
    [("size=64k", "activations", "is full"), ("ro,size=1m", "both", "is read-only"),
     ("size=64k", "zero_offload", "is full")],  # its fp32 masters (66 kB) alone do not fit
)
def test_full_or_read_only_slow_tier_names_the_path_and_leaves_nothing(tmp_path, repo, opts, strategy, words):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = (
        f'mount -t tmpfs -o {opts} tmpfs {mnt} && {sys.executable} -c "$0" {mnt} {strategy}'
        f" && ls -A {mnt} | wc -l"
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, IN_NAMESPACE],
        capture_output=True,
        text=True,
        cwd=repo,
        env=child_env(repo),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("ERROR") and f"slow-tier directory {mnt} {words}" in lines[0], proc.stdout
    assert "offload.slow_dir" in lines[0]
    assert lines[-1] == "0", "files left in the slow-tier directory"


KILLED = """
import os, signal, sys, torch
from hpcdl.studies.offload.slowtier import FileTier
from hpcdl.studies.offload.timeline import Timeline
tier = FileTier(sys.argv[1], Timeline())
off = tier.reserve("acts", 1 << 20)
tier.put(torch.ones(1 << 18), "acts", off, "activation").wait()
print(tier.dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_an_interrupted_run_leaves_no_stale_offload_files_after_the_next_run(tmp_path, repo):
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=repo,
        env=child_env(repo),
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL
    stale = tmp_path / proc.stdout.strip().rsplit("/", 1)[-1]
    assert stale.is_dir() and (stale / "acts.bin").stat().st_size == 1 << 20
    train(_spec(tmp_path, "both"))  # the next run
    assert not stale.exists()
    assert not list(tmp_path.iterdir())
    # a live process's run directory is not touched
    live = FileTier(tmp_path, Timeline())
    FileTier(tmp_path, Timeline()).close()
    assert live.dir.is_dir()
    live.close()
    assert not list(tmp_path.iterdir())


def test_task_app_end_to_end_tables_figures_claims(tmp_path, repo, test_config, run_task_app):
    cfg = {**test_config, "studies": ["offload"], "results_dir": str(tmp_path / "r")}
    # two cores a task, one of them left to the copy threads (slow_tier.copy_cores defaults to 1)
    cfg["offload"] = {**cfg["offload"], "model": {**cfg["offload"]["model"], "depths": [3]},
                      "computing_units": "2"}
    path = tmp_path / "c.yaml"
    run = run_task_app("offload", cfg, path)
    assert run.returncode == 0, run.stderr[-3000:]
    raw = tmp_path / "r" / "offload" / "raw"
    steps = pd.read_csv(raw / "steps.csv")
    assert (steps["compute_threads"] == 1).all()
    assert set(steps["strategy"]) == {"none", *OFFLOADS, "zero_offload"} and (steps["status"] == "ok").all()
    # Myelin's strategies run none's Adam arithmetic: bit for bit. zero_offload's host step is torch's CPU
    # fused Adam (test.yaml): within tests/test_offload_zero.py's tolerance, judged by weights_equal below
    assert steps[steps["strategy"] != "zero_offload"]["weights_sha256"].nunique() == 1
    assert set(steps["precision"]) == {"fp32"} and steps["weights_sample"].str.split().str.len().eq(256).all()
    assert set(pd.read_csv(raw / "timeline.csv")["lane"]) == {"compute", "wait", "to_slow", "from_slow"}
    assert not (tmp_path / "r" / "offload" / "slow").exists()
    study = tmp_path / "r" / "offload"
    full = validate_config(cfg)
    tables.write(full, study)
    figures.draw(full, study)
    write_claims(study, "offload", offload_claims.judge(full, study), offload_claims.CLAIMS)
    tr = pd.read_csv(tmp_path / "r" / "offload" / "tables" / "tradeoff.csv")
    assert tr[tr["strategy"] != "zero_offload"]["bit_identical"].all()
    zero = tr[tr["strategy"] == "zero_offload"]
    assert (zero["weights_deviation_ulps"].fillna(0) <= 1.0).all()  # sqrt(3)/2 = 0.87 is the line
    # ZeRO-Offload keeps fp32 parameters and the gradients of a few buckets in the fast tier at fp32
    assert (zero["fast_bytes_per_param"] < 8.5).all()
    assert (tr[tr["strategy"] == "none"]["fast_bytes_per_param"] == 16).all()
    # at this size the measured (RSS) peak is mostly the process's fixed overheads: the registry's ratio
    # is the deterministic one; the measured ratio is there and positive
    both = tr[tr["strategy"] == "both"]
    assert (both["registry_ratio"] < 1).all() and (both["memory_ratio"] > 0).all()
    assert set(tr["peak_measured_by"]) == {"anonymous RSS high-water mark"}
    for fig in ("tradeoff", "breakdown", "capacity", "timeline"):
        assert (tmp_path / "r" / "offload" / "figures" / f"{fig}.png").stat().st_size > 10_000
    claims = {
        c["id"]: c for c in json.loads((tmp_path / "r" / "offload" / "claims.json").read_text())["claims"]
    }
    assert claims["weights_equal"]["status"] == "passed"
    assert set(claims) == {"memory_ratio", "hidden_fraction", "weights_equal", "capacity_ratio",
                           "zero_memory_ratio", "zero_capacity_ratio"}
    capacity = pd.read_csv(study / "tables" / "capacity.csv")
    assert set(capacity["strategy"]) == {"none", *OFFLOADS, "zero_offload"}
    # both tiers measured by every point, each way; the memory claims carry the bandwidths they were
    # judged (or not) on
    tier_table = pd.read_csv(study / "tables" / "tiers.csv")
    assert len(tier_table) == 4 and (tier_table["points"] == 5).all()
    assert (tier_table["bandwidth_bytes_per_s"] > 0).all()
    for cid in ("memory_ratio", "capacity_ratio", "zero_memory_ratio", "zero_capacity_ratio"):
        assert set(claims[cid]["measured"]["slow_tier_slowdown"]) == {"write", "read"}, claims[cid]
    steps_hidden = steps[steps["strategy"] != "none"]["hidden_frac_steps"].str.split()
    assert (steps_hidden.str.len() == 2).all()  # test.yaml: 3 steps, 1 warm-up
    # an explicit slow-tier directory that is missing: exit 2 naming the key and path, nothing written
    cfg["offload"]["slow_tier"] = {"dir": str(tmp_path / "absent"), "io_mode": "page_cache"}
    cfg["results_dir"] = str(tmp_path / "r2")
    bad = run_task_app("offload", cfg, path)
    assert bad.returncode == 2
    assert f"'offload.slow_dir': slow-tier directory {tmp_path / 'absent'} does not exist" in bad.stderr
    assert not (tmp_path / "r2" / "offload" / "raw").exists()


def test_dontneed_io_mode_goes_around_the_page_cache_and_trains_the_same_weights(tmp_path):
    ref = train(_spec(tmp_path, "none", depth=1, steps=2))[0]
    rec = train(_spec(tmp_path, "both", depth=1, steps=2, io_mode="dontneed", bucket_mb=1.0))[0]
    assert rec["io_mode"] == "dontneed"
    assert rec["weights_sha256"] == ref["weights_sha256"]
    assert rec["bytes_to_slow"] > 0 and rec["bytes_from_slow"] > 0
    with pytest.raises(ValueError, match="offload.io_mode"):
        FileTier(tmp_path, Timeline(), "direct")
    assert not list(tmp_path.iterdir())
