"""hetmem on its device (#25): the task app routes each app to the CPU path (traced, SIMULATED
reference, as before) or to the CUDA path (hpcdl.studies.hetmem.gpu: objects in GPU memory or in
pinned host memory mapped into the GPU, measured on that HARDWARE). CPU tests: routing, the CUDA
path's pure parts (placements, byte shares, the object-granularity estimator and policies, the
kernels' arithmetic on CPU tensors), its rows through the tables and claims. Tests marked `cuda`
need a GPU: the zero-copy view and a tiny end-to-end run."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.platform.kit.device import study_device
from hpcdl.platform.kit.procenv import child_env
from hpcdl.studies.hetmem import claims, gpu, gpu_apps, gpu_placement, gpu_tiers, sweep, tables

REPO = Path(__file__).resolve().parent.parent
TOOLS = pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("cc") is None,
                           reason="needs valgrind and a C compiler (make tools)")


def _cfg(test_config, **hetmem) -> dict:
    return validate_config({**test_config, "hetmem": {**test_config["hetmem"], **hetmem}})


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


# ---- routing -------------------------------------------------------------------------------------------

def test_the_study_declares_its_cuda_path_and_a_gpu_per_task(test_config):
    from hpcdl.platform.kit.study import spec

    s = spec("hetmem")
    assert s.devices == ("cpu", "cuda") and s.task_gpus(_cfg(test_config)) == 1
    assert study_device(_cfg(test_config, device="cpu"), "hetmem") == "cpu"


@pytest.mark.skipif(not _no_gpu(), reason="a GPU is visible: auto resolves to cuda here")
def test_without_a_gpu_auto_is_the_cpu_and_cuda_is_an_error_naming_the_key(test_config):
    assert study_device(_cfg(test_config, device="auto"), "hetmem") == "cpu"
    with pytest.raises(ConfigError, match=r"hetmem\.device"):
        study_device(_cfg(test_config, device="cuda"), "hetmem")


def test_cpu_points_and_keys_are_those_of_before_the_cuda_path(test_config):
    cfg = _cfg(test_config)
    assert sweep.app_points(cfg, "cpu") == test_config["hetmem"]["apps"]
    cpu_block = sweep.compute_block(cfg, "cpu")
    assert "gpu" not in cpu_block and "apps" not in cpu_block  # the GPU settings are no part of a CPU key
    on_gpu = sweep.app_points(cfg, "cuda")
    assert [p["device"] for p in on_gpu] == ["cuda"] * len(on_gpu)
    assert [{k: v for k, v in p.items() if k != "device"} for p in on_gpu] == test_config["hetmem"]["apps"]
    assert sweep.compute_block(cfg, "cuda")["gpu"] == {"scale": 1.0, "repeats": 5, "random_placements": 4}


@pytest.mark.parametrize("key, bad", [("scale", 0), ("scale", 9), ("repeats", 0), ("random_placements", -1)])
def test_gpu_settings_out_of_range_are_config_errors_naming_the_key(test_config, key, bad):
    with pytest.raises(ConfigError, match=rf"hetmem\.gpu\.{key}"):
        _cfg(test_config, gpu={key: bad})


def _app_tables(tmp_path, test_config, **block):
    """Run the real task app on one small app (gups) with `block` over the test config's hetmem block:
    the config, its raw/ directory, and the raw validation, policies and traces tables."""
    cfg = {**test_config, "studies": ["hetmem"], "results_dir": str(tmp_path / "r")}
    cfg["hetmem"] = {**test_config["hetmem"], "apps": [{"name": "gups", "size": 10, "iters": 1}], **block}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = child_env(REPO, HPCDL_PROGRESS="0")
    proc = subprocess.run([sys.executable, "-m", "tasks.hetmem", "--config", str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    raw = tmp_path / "r" / "hetmem" / "raw"
    return (cfg, raw, *(pd.read_csv(raw / f"{t}.csv") for t in ("validation", "policies", "traces")))


@TOOLS
def test_on_the_cpu_the_app_runs_the_simulated_path_with_its_numbers_and_names_the_device(
        tmp_path, test_config):
    """The task app on `device: cpu` gives the rows compute.run_app gives (the CPU path, unchanged),
    with a `device` column added."""
    from hpcdl.studies.hetmem.compute import run_app

    cfg, raw, val, pol, tr = _app_tables(tmp_path, test_config, device="cpu")
    for t in (val, pol, tr):
        assert set(t["device"]) == {"cpu"}
    assert set(val["reference"]) == set(pol["reference"]) == {"simulated"}
    assert json.loads((raw / "traces.provenance.json").read_text())["device"] == "cpu"
    block = sweep.compute_block(validate_config(cfg), "cpu")
    direct = run_app("gups", 10, 1, block, str(tmp_path / "direct"), block["seed"])
    want = pd.DataFrame(direct["validation"])
    # every deterministic number is the CPU path's own (timings aside)
    cols = ["placement", "sample_every", "fast_fraction", "est_runtime_s", "ref_runtime_s", "error",
            "samples"]
    pd.testing.assert_frame_equal(val[cols], want[cols], check_exact=False, rtol=1e-12)
    assert list(pol["policy"]) == [r["policy"] for r in direct["policies"]]
    same = pol["policy"].ne("ppo").to_numpy()
    assert np.allclose(pol["ref_runtime_s"][same], pd.DataFrame(direct["policies"])["ref_runtime_s"][same],
                       rtol=1e-12)


# ---- the CUDA path's pure parts -------------------------------------------------------------------------

def test_placements_are_bounds_each_object_alone_then_distinct_random_subsets():
    names = ["a", "b", "c"]
    plan = gpu_placement.placements(names, 10, np.random.default_rng(0))
    assert [p[0] for p in plan[:5]] == ["all_fast", "all_slow", "object:a", "object:b", "object:c"]
    assert plan[0][2] == frozenset(names) and plan[1][2] == frozenset()
    assert [p[1] for p in plan] == ["bound"] * 2 + ["object"] * 3 + ["random_objects"] * 3
    # only 2^3 - 5 = 3 subsets are left to draw, each once
    sets = [p[2] for p in plan]
    assert len(set(sets)) == len(sets) == 8
    assert set(sets) == {frozenset(c) for k in range(4) for c in itertools.combinations(names, k)}
    assert [p[0] for p in plan[5:]] == ["random#0", "random#1", "random#2"]
    # two objects: every subset is already a bound or an object alone
    assert len(gpu_placement.placements(["u", "v"], 4, np.random.default_rng(0))) == 4
    # the same seed, the same placements; none asked, none drawn
    again = gpu_placement.placements(names, 10, np.random.default_rng(0))
    assert again == plan and len(gpu_placement.placements(names, 0, np.random.default_rng(0))) == 5


def test_the_estimate_interpolates_by_the_share_of_moved_bytes():
    moved = {"a": 300.0, "b": 100.0, "c": 600.0}
    assert gpu_placement.byte_share(moved, {"a", "b"}) == pytest.approx(0.4)
    assert gpu_placement.estimate(moved, {"a", "b"}, 1.0, 6.0) == pytest.approx(0.4 * 1 + 0.6 * 6)
    assert gpu_placement.estimate(moved, set(moved), 1.0, 6.0) == 1.0
    assert gpu_placement.estimate(moved, set(), 1.0, 6.0) == 6.0
    with pytest.raises(ValueError, match=r"\['z'\] are not objects of the app \(a, b, c\)"):
        gpu_placement.byte_share(moved, {"a", "z"})


def test_the_object_estimator_is_the_byte_share_estimate_on_every_whole_object_placement():
    sizes = {"a": 10 * 4096, "b": 3 * 4096 + 5, "c": 4096}
    moved = {"a": 50.0, "b": 400.0, "c": 7.0}
    lay = gpu_placement.object_layout(sizes)
    assert lay.names == ["a", "b", "c"] and lay.pages_of.tolist() == [10, 4, 1]
    est = gpu_placement.object_estimator(lay, moved, 2.0, 9.0)
    for k in range(4):
        for fast in itertools.combinations(sizes, k):
            got = est.estimate_one(lay.mask(fast_objects=fast))
            assert got == pytest.approx(gpu_placement.estimate(moved, fast, 2.0, 9.0), rel=1e-12), fast


def test_policies_choose_whole_objects_that_fit_each_capacity():
    sizes = {"big": 8 * 4096, "hot": 2 * 4096, "warm": 4 * 4096, "cold": 2 * 4096}
    moved = {"big": 100.0, "hot": 1000.0, "warm": 200.0, "cold": 1.0}
    ag = {"capacities": [0.25, 0.75], "bins": 2, "migration_cost": 0.01, "invalid_penalty": 0.05,
          "max_steps": 6, "timesteps": 64, "rollouts": 2}
    choices, train_s = gpu_placement.policy_choices(sizes, moved, 1.0, 4.0, ag, 0, "toy")
    policies = ("greedy", "random", "ppo")
    assert [(c, p) for c, p, _ in choices] == [(c, p) for c in (0.25, 0.75) for p in policies]
    for cap, _, fast in choices:
        assert sum(sizes[n] for n in fast) <= cap * sum(sizes.values())
    greedy = {c: f for c, p, f in choices if p == "greedy"}
    # densest first (moved bytes per byte: hot, warm, big, cold), each that still fits: at 1/4 of 16
    # pages hot (2), not warm (4 more), cold (2); at 3/4 hot and warm, not big (8 more), cold
    assert greedy[0.25] == {"hot", "cold"} and greedy[0.75] == {"hot", "warm", "cold"}
    assert train_s > 0


def test_the_gpu_rows_go_through_the_tables_and_claims_as_hardware(tmp_path):
    """Rows built as the CUDA path builds them, from given step times: the tables keep `device` and
    `reference`, the speed table compares with a hardware run, the claims say they are about a GPU."""
    sizes = {"a": 8 * 4096, "b": 8 * 4096}
    moved = {"a": 3000.0, "b": 1000.0}
    plan = gpu_placement.placements(list(sizes), 4, np.random.default_rng(0))
    # step times that the estimate gets exactly right except object:b, 2 % off
    times = {frozenset(sizes): 1.0, frozenset(): 3.0, frozenset({"a"}): 1.5, frozenset({"b"}): 2.5 / 1.02}
    measured = {f: (t, 0.2) for f, t in times.items()}
    val = pd.DataFrame(gpu.validation_rows("toy", plan, measured, moved, sizes, 1e-6))
    val = val.assign(device="cuda (X)")
    assert val.set_index("placement")["error"].round(6).to_dict() == {
        "all_fast": 0.0, "all_slow": 0.0, "object:a": 0.0, "object:b": 0.02}
    choices = [(0.5, p, frozenset({"a"})) for p in ("greedy", "random", "ppo")]
    pol = pd.DataFrame(gpu.policy_rows("toy", choices, measured, moved, sizes, 0.5)).assign(device="cuda (X)")
    g = {"scale": 0.1, "repeats": 3}
    tr = pd.DataFrame([{**gpu.trace_row("toy", g, sizes, moved, plan, measured, "X"),
                        "device": "cuda (X)", "status": "ok", "error": ""}])
    assert tr["native_run_s"].iloc[0] == pytest.approx(np.median([1.2, 3.2, 1.7, 2.5 / 1.02 + 0.2]))
    assert tables.on_hardware(val) and not tables.on_hardware(val.assign(reference="simulated", device="cpu"))

    errs = tables.error_table(val)
    assert set(errs["reference"]) == {gpu.HARDWARE} and set(errs["device"]) == {"cuda (X)"}
    speed = tables.speed_table(val, 10, tr)
    row = speed.iloc[0]
    assert row["reference"] == "hardware run" and np.isnan(row["simulated_reference_s"])
    assert row["speedup"] == pytest.approx(tr["native_run_s"].iloc[0] / 1e-6)
    out = tmp_path / "tables"
    out.mkdir()
    for name, t in (("validation", val), ("speed", speed), ("policies", tables.policy_table(pol)),
                    ("tracing", tables.tracing_table(tr)), ("errors", errs)):
        t.to_csv(out / f"{name}.csv", index=False)
    cfg = {"hetmem": {"apps": [{"name": "toy", "size": 1, "iters": 1}], "sample_every": 10,
                      "agent": {"capacities": [0.5]}, "error_ceiling": 0.05, "speedup_floor": 100,
                      "bound_tolerance": 0.6}}
    got = {c["id"]: c for c in claims.judge(cfg, tmp_path)}
    err = got["estimate_error_le_5pct"]
    assert err["status"] == "passed" and err["measured"]["reference"] == gpu.HARDWARE
    assert err["measured"]["per_app_mean_abs_error"] == {"toy": 0.005}  # the counted rows, not N=10 ones
    assert err["measured"]["device"] == "cuda (X)"
    assert all(w in err["statement"] for w in ("on a GPU", "MEASURED", "set for the CPU path"))
    sp = got["estimate_100x_faster"]
    assert sp["status"] == "passed" and sp["measured"]["reference"] == "hardware run"
    assert "hardware run" in sp["statement"]
    bound = got["placement_near_all_fast"]
    assert bound["measured"]["gap_to_all_fast"] == {"toy": {"greedy": 0.5, "ppo": 0.5}}
    assert bound["status"] == "passed" and "MEASURED" in bound["statement"]
    # every app failed on the GPU: the claims still say what they would have been about
    empty = tmp_path / "failed"
    (empty / "tables").mkdir(parents=True)
    failed = {"app": "toy", "device": "cuda", "status": "failed", "error": "x\nRuntimeError: no UVA"}
    pd.DataFrame([failed]).to_csv(empty / "tables" / "tracing.csv", index=False)
    for c in claims.judge(cfg, empty):
        assert c["status"] == "not_measured" and "on a GPU" in c["statement"] and "no UVA" in c["reason"]


# ---- the kernels' arithmetic (torch on CPU tensors: the same code the GPU runs) ---------------------------

@pytest.mark.parametrize("app", sorted(gpu_apps.APPS))
def test_every_gpu_app_moves_bytes_of_every_object_and_its_step_changes_its_outputs(app):
    import torch

    objs, step, moved = gpu_apps.APPS[app](0.001)
    assert set(moved) == set(objs) and all(v > 0 for v in moved.values())
    before = {k: v.clone() for k, v in objs.items()}
    step(objs)
    changed = {k for k in objs if not torch.equal(before[k], objs[k])}
    want = {"stream": {"a"}, "stencil": {"u", "v"}, "cg": {"x", "r", "p", "q"}, "gups": {"table"},
            "mlp": {"w1", "w2", "hidden", "grad_hidden", "grad_w1", "grad_w2", "outputs"}}[app]
    assert changed == want


def test_stream_cg_and_stencil_steps_compute_what_they_claim():
    import torch

    o, step, _ = gpu_apps.APPS["stream"](0.001)
    step(o)
    assert torch.allclose(o["a"], o["b"] + 3.0 * o["c"], rtol=1e-15, atol=0)
    o, step, _ = gpu_apps.APPS["cg"](0.001)
    a = torch.sparse_csr_tensor(o["rowptr"], o["colidx"], o["values"]).to_dense()
    assert torch.equal(a, a.T) and (a.diagonal() == 4).all()  # the permuted 2-D Laplacian
    energy = []  # CG minimises 1/2 x'Ax - b'x over growing Krylov spaces: it falls every iteration
    for _ in range(5):
        step(o)
        energy.append(float(0.5 * o["x"] @ (a @ o["x"]) - o["x"].sum()))
    # CG's invariant r = b - A x holds (b = 1), and the energy fell at every step
    assert torch.allclose(o["r"], 1 - a @ o["x"], atol=1e-10)
    assert energy[0] < 0 and all(e1 < e0 for e0, e1 in zip(energy, energy[1:], strict=False))
    o, step, _ = gpu_apps.APPS["stencil"](0.001)
    u = o["u"].numpy().copy()

    def sweep_np(src, dst):
        dst[1:-1, 1:-1, 1:-1] = 0.4 * src[1:-1, 1:-1, 1:-1] + 0.1 * (
            src[:-2, 1:-1, 1:-1] + src[2:, 1:-1, 1:-1] + src[1:-1, :-2, 1:-1] + src[1:-1, 2:, 1:-1]
            + src[1:-1, 1:-1, :-2] + src[1:-1, 1:-1, 2:])

    v = np.zeros_like(u)
    sweep_np(u, v)
    sweep_np(v, u)
    step(o)
    assert np.allclose(o["u"].numpy(), u, rtol=1e-14) and np.allclose(o["v"].numpy(), v, rtol=1e-14)


# ---- CUDA ---------------------------------------------------------------------------------------------

@pytest.mark.cuda
def test_a_slow_object_is_pinned_host_memory_the_gpu_reads_and_writes_in_place():
    import torch

    dev = torch.device("cuda")
    assert gpu_tiers.check_zero_copy(dev)
    values = torch.arange(4096, dtype=torch.float64)
    slow = gpu_tiers.place(values, False, dev)
    host = slow._hetmem_host
    assert slow.is_cuda and host.is_pinned() and slow.data_ptr() == host.data_ptr()
    slow.mul_(2.0)  # a GPU kernel writes host memory: the host sees it with no copy
    torch.cuda.synchronize()
    assert torch.equal(host, 2.0 * values)
    host[0] = -1.0  # and the GPU reads what the host wrote
    assert slow[0].item() == -1.0
    fast = gpu_tiers.place(values, True, dev)  # device memory: a copy, not the host's buffer
    assert fast.is_cuda and not hasattr(fast, "_hetmem_host") and torch.equal(fast.cpu(), values)
    # the CG step runs on mapped index and value arrays (a sparse kernel on host memory)
    o, step, _ = gpu_apps.APPS["cg"](0.001)
    on = {k: gpu_tiers.place(v.clone(), k in ("x", "r"), dev) for k, v in o.items()}
    step(on)
    step(o)
    assert torch.allclose(on["x"].cpu(), o["x"], atol=1e-12)


@pytest.mark.cuda
def test_one_app_end_to_end_on_the_gpu_measures_the_slow_tier_slower_and_every_policy(test_config):
    block = sweep.compute_block(_cfg(test_config, device="cuda", gpu={"scale": 0.05, "repeats": 3,
                                                                       "random_placements": 2}), "cuda")
    out = gpu.run_app("stream", block, 0)
    val, pol, tr = pd.DataFrame(out["validation"]), pd.DataFrame(out["policies"]), out["trace"]
    assert len(val) == 2 + 3 + 2 and set(val["reference"]) == {gpu.HARDWARE}
    assert tr["zero_copy_verified"] and tr["all_slow_runtime_s"] > 2 * tr["all_fast_runtime_s"]
    bounds = val[val["kind"] == "bound"]
    assert (bounds["error"].abs() < 1e-12).all()  # the two measured runs are the estimate's inputs
    assert np.isfinite(val["error"]).all() and (val["ref_runtime_s"] > 0).all()
    assert len(pol) == 3 * len(block["agent"]["capacities"]) and (pol["ref_runtime_s"] > 0).all()
    assert tr["native_run_s"] > tr["native_compute_s"] > 0


@pytest.mark.cuda
def test_the_task_app_on_cuda_writes_hardware_rows_that_name_the_gpu(tmp_path, test_config):
    _, raw, val, pol, tr = _app_tables(tmp_path, test_config, device="cuda",
                                       gpu={"scale": 0.01, "repeats": 2, "random_placements": 0})
    assert list(tr["status"]) == ["ok"] and tr["device"].iloc[0].startswith("cuda (")
    assert set(val["reference"]) == set(pol["reference"]) == {gpu.HARDWARE}
    assert list(val["placement"]) == ["all_fast", "all_slow", "object:table", "object:ran"]
    assert json.loads((raw / "traces.provenance.json").read_text())["device"] == "cuda"
