"""The micro-batched convolution study: DP and ILP against brute force, exactness of every candidate
and of the executing wrapper, backend verification, workspace measurement, bad input, the task app."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from torch import nn

from hpcdl.platform.kit.config import ConfigError, load_config
from hpcdl.platform.kit.procenv import child_env
from hpcdl.platform.kit.stages import read_or_empty
from hpcdl.studies.microbatch.choice import bench
from hpcdl.studies.microbatch.choice.algorithms import (
    ALGORITHMS,
    ALL_KERNELS,
    FUSED,
    KERNELS,
    KernelCall,
    verify,
)
from hpcdl.studies.microbatch.choice.bench import benchmark_layer
from hpcdl.studies.microbatch.choice.exact import rel_err
from hpcdl.studies.microbatch.choice.execute import MicroBatchedConv2d, microbatch_network
from hpcdl.studies.microbatch.choice.plan_timing import execute_network
from hpcdl.studies.microbatch.common import ilp
from hpcdl.studies.microbatch.common.dp import KernelDP, WorkspaceError, challenger_prices, policy_sizes
from hpcdl.studies.microbatch.common.workloads import ConvLayer, alexnet, deepbench, resnet18

REPO = Path(__file__).resolve().parent.parent
CPU_ALGS = [n for n, a in ALGORITHMS.items() if a.device == "cpu"]
SMALL = ConvLayer("small", 8, 16, 9, 9, 3, 3, 1, 1, 1)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------ planner


def _table(rng, batch, algs=("a", "b", "c")):
    """Synthetic benchmark: per-sample cost with a fixed overhead, workspace growing with size."""
    return {
        (a, b): (
            float(rng.uniform(0.1, 1.0) + b * rng.uniform(0.1, 1.0)),
            float(b * rng.integers(1, 50) + rng.integers(0, 30)),
        )
        for a in algs
        for b in range(1, batch + 1)
    }


def _brute(table, batch, sizes, limit):
    """Best (time) over every ordered division of `batch` into allowed sizes, each with any algorithm."""
    best = np.inf
    algs = sorted({a for a, _ in table})

    def parts(n):
        if n == 0:
            yield []
            return
        for s in sizes:
            if s <= n:
                for rest in parts(n - s):
                    yield [s, *rest]

    for division in parts(batch):
        for choice in itertools.product(algs, repeat=len(division)):
            cfg = [table[(a, b)] for a, b in zip(choice, division, strict=True)]
            if max(w for _, w in cfg) <= limit:
                best = min(best, sum(t for t, _ in cfg))
    return best


@pytest.mark.parametrize("policy", ["undivided", "powerOfTwo", "all"])
def test_dp_matches_brute_force_under_every_limit(policy):
    rng = np.random.default_rng(1)
    batch = 6
    table = _table(rng, batch)
    dp = KernelDP(table, batch, policy, label="layer x (forward)")
    sizes = policy_sizes(policy, batch)
    for limit in [np.inf, *sorted({w for _, w in table.values()})[::7]]:
        want = _brute(table, batch, sizes, limit)
        if np.isinf(want):
            with pytest.raises(WorkspaceError, match="layer x"):
                dp.best(limit)
            continue
        idx, t, ws = dp.best(limit)
        assert t == pytest.approx(want, rel=1e-12)
        steps = dp.division(idx)
        assert sum(b for _, b in steps) == batch and ws <= limit
        assert sum(table[s][0] for s in steps) == pytest.approx(t, rel=1e-12)
        assert max(table[s][1] for s in steps) == ws
    front = dp.front()
    assert np.all(np.diff(front.workspace) > 0) and np.all(np.diff(front.time_s) < 0)  # a Pareto front


def test_policy_sizes_and_uneven_last_micro_batch():
    assert policy_sizes("undivided", 10) == [10]
    assert policy_sizes("powerOfTwo", 10) == [1, 2, 4, 8, 10]
    assert policy_sizes("all", 3) == [1, 2, 3]
    # per-sample time falls with size, so 8 + 2 (uneven) beats any power-of-two-only tiling of 10
    table = {("a", b): (1.0 + 0.1 * b if b != 10 else 100.0, b) for b in policy_sizes("powerOfTwo", 10)}
    dp = KernelDP(table, 10, "powerOfTwo")
    steps = dp.division(dp.best()[0])
    assert sorted(b for _, b in steps) == [2, 8]
    with pytest.raises(ValueError, match="policy"):
        policy_sizes("fibonacci", 4)


def test_a_challenger_leaves_the_default_only_when_its_typical_time_beats_the_defaults_best():
    default = ("onednn-nchw", 4)
    # fastest repeats: the native path 20 % faster than the default, but its median repeat is not
    table = {default: (10.0, 0.0), ("native-nchw", 4): (8.0, 0.0), ("native-nchw", 2): (4.5, 0.0),
             ("native-nchw", 1): (3.0, 0.0)}
    noisy = {default: 13.0, ("native-nchw", 4): 10.5, ("native-nchw", 2): 5.5, ("native-nchw", 1): 3.5}
    priced = challenger_prices(table, noisy, default, margin=0.05, extra_s=0.25)
    assert priced[default] == (10.0, 0.0)
    assert priced[("native-nchw", 4)] == (10.75, 0.0)  # its median plus the executor's cost
    assert priced[("native-nchw", 2)] == (5.75, 0.0)  # 2 + 2: 11.5, slower than the default too
    dp = KernelDP(priced, 4, "powerOfTwo")
    assert dp.division(dp.best()[0]) == [default]
    # a steady challenger (median within the margin of its fastest) wins on its fastest + margin
    steady = {**noisy, ("native-nchw", 4): 8.1}
    priced = challenger_prices(table, steady, default, margin=0.05, extra_s=0.25)
    assert priced[("native-nchw", 4)][0] == pytest.approx(8.0 * 1.05 + 0.25)
    dp = KernelDP(priced, 4, "powerOfTwo")
    assert dp.division(dp.best()[0]) == [("native-nchw", 4)]
    # a kernel the default does not run (the separate pair beside a fused default): no incumbent
    assert challenger_prices(table, noisy, None, 0.05, 0.25)[default] == (13.25, 0.0)


def test_workspace_limit_below_every_need_names_the_layer():
    table = {("onednn-nchw", b): (1.0, 1000.0 * b) for b in (1, 2, 4)}
    dp = KernelDP(table, 4, "powerOfTwo", label="layer conv3 (backward_filter)")
    with pytest.raises(WorkspaceError, match=r"layer conv3 \(backward_filter\).*smaller than every"):
        dp.best(limit_bytes=999.0)


def test_ilp_matches_brute_force_and_respects_the_budget():
    rng = np.random.default_rng(3)
    dps = {f"l{i}/forward": KernelDP(_table(rng, 4), 4, "all") for i in range(3)}
    fronts = {k: d.front() for k, d in dps.items()}
    counts = {"l0/forward": 1, "l1/forward": 2, "l2/forward": 1}
    least = sum(counts[k] * f.workspace.min() for k, f in fronts.items())
    for budget in (least, least * 1.5, least * 3, 1e12):
        res = ilp.solve(fronts, counts, budget)
        best = np.inf
        for combo in itertools.product(*[range(len(f.time_s)) for f in fronts.values()]):
            ws = sum(counts[k] * fronts[k].workspace[j] for k, j in zip(fronts, combo, strict=True))
            if ws <= budget:
                best = min(
                    best, sum(counts[k] * fronts[k].time_s[j] for k, j in zip(fronts, combo, strict=True))
                )
        assert res.time_s == pytest.approx(best, rel=1e-9)
        assert res.workspace_bytes <= budget * (1 + 1e-9)
    sweep = ilp.network_front(fronts, counts, [least * 0.5, least, least * 2, least * 8])
    assert [r["feasible"] for r in sweep] == [False, True, True, True]
    times = [r["time_s"] for r in sweep[1:]]
    assert times == sorted(times, reverse=True)  # more workspace never makes the network slower


def test_ilp_fused_backward_alternative_matches_brute_force():
    rng = np.random.default_rng(5)
    fronts = {
        k: KernelDP(_table(rng, 3), 3, "all").front()
        for k in ("l/forward", "l/backward", "l/backward_data", "l/backward_filter")
    }
    counts = dict.fromkeys(fronts, 1)
    groups = [("l/backward", "l/backward_data", "l/backward_filter")]
    f = {k: list(zip(v.time_s, v.workspace, strict=True)) for k, v in fronts.items()}
    for budget in (200.0, 400.0, 1e9):
        best = np.inf
        for a in f["l/forward"]:
            for b in f["l/backward"]:
                if a[1] + b[1] <= budget:
                    best = min(best, a[0] + b[0])
            for d in f["l/backward_data"]:
                for w in f["l/backward_filter"]:
                    if a[1] + d[1] + w[1] <= budget:
                        best = min(best, a[0] + d[0] + w[0])
        if np.isinf(best):
            with pytest.raises(WorkspaceError):
                ilp.solve(fronts, counts, budget, groups)
            continue
        res = ilp.solve(fronts, counts, budget, groups)
        assert res.time_s == pytest.approx(best, rel=1e-9)
        chosen = set(res.choice)
        assert chosen in ({"l/forward", "l/backward"}, {"l/forward", "l/backward_data", "l/backward_filter"})


def test_ilp_budget_below_the_least_need_names_the_layer():
    table = {("a", 1): (1.0, 100.0), ("a", 2): (1.5, 300.0)}
    fronts = {
        "conv1/forward": KernelDP(table, 2, "all").front(),
        "conv2/backward_data": KernelDP({k: (t, w * 10) for k, (t, w) in table.items()}, 2, "all").front(),
    }
    with pytest.raises(WorkspaceError, match=r"conv2/backward_data"):
        ilp.solve(fronts, {"conv1/forward": 1, "conv2/backward_data": 1}, 500.0)


# ---------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("alg", [pytest.param(n, marks=[pytest.mark.cuda] if a.device == "cuda" else [])
                                 for n, a in ALGORITHMS.items()])
def test_every_candidate_micro_batched_equals_the_undivided_layer(alg):
    device = ALGORITHMS[alg].device
    for batch, division in ((5, [1, 4]), (5, [2, 2, 1]), (4, [4])):
        call = KernelCall(SMALL, batch, device, seed=7)
        x = call.x.clone().requires_grad_(True)
        w = call.weight.clone().requires_grad_(True)
        y = torch.nn.functional.conv2d(x, w, padding=1)
        y.backward(call.grad_out)
        ref = {
            "forward": y.detach(),
            "backward_data": x.grad,
            "backward_filter": w.grad,
            FUSED: (x.grad, w.grad),
        }
        for kernel in ALL_KERNELS:
            got = call.run_division(kernel, [(alg, b) for b in division])
            assert rel_err(got, ref[kernel]) <= 1e-5, (alg, kernel, division)


def test_wrapper_in_a_network_gives_the_undivided_outputs_and_gradients():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False)
    )
    ref_net = nn.Sequential(*[m for m in net])
    import copy

    ref_net = copy.deepcopy(net)
    plans = {
        "0": {
            "forward": [("native-nhwc", 3), ("onednn-nchw", 3)],
            "backward_data": [("onednn-nhwc", 6)],
            "backward_filter": [("native-nchw", 1), ("onednn-nhwc", 5)],
        },
        "2": {
            "forward": [("onednn-nhwc", 2), ("onednn-nhwc", 2), ("native-nchw", 2)],
            "backward_data": [("native-nhwc", 4), ("native-nhwc", 2)],
            "backward_filter": [("onednn-nchw", 6)],
        },
    }
    microbatch_network(net, plans)
    assert isinstance(net[0], MicroBatchedConv2d) and isinstance(net[2], MicroBatchedConv2d)
    x = torch.randn(6, 3, 12, 12)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = net(xa), ref_net(xb)
    g = torch.randn_like(yb)
    ya.backward(g)
    yb.backward(g)
    assert rel_err(ya, yb) <= 1e-5 and rel_err(xa.grad, xb.grad) <= 1e-5
    for pa, pb in zip(net.parameters(), ref_net.parameters(), strict=True):
        assert rel_err(pa.grad, pb.grad) <= 1e-5
    # another batch size: the plan is stretched (last micro-batch uneven), still exact
    x7 = torch.randn(7, 3, 12, 12)
    assert rel_err(net(x7), ref_net(x7)) <= 1e-5
    with pytest.raises(ValueError, match="no Conv2d named"):
        microbatch_network(nn.Sequential(nn.ReLU()), {"0": plans["0"]})


def test_a_division_that_does_not_add_up_is_refused():
    call = KernelCall(SMALL, 4, "cpu")
    with pytest.raises(ValueError, match="layer small.*do not add up to the batch size 4"):
        call.run_division("forward", [("onednn-nchw", 3)])


# ------------------------------------------------------------------ backends and workspace


def test_the_forced_backend_is_the_one_that_runs():
    call = KernelCall(SMALL, 4, "cpu")
    for kernel in KERNELS:
        assert verify(call, kernel, ALGORITHMS["onednn-nchw"], 4).startswith("oneDNN convolution")
        assert "slow_conv2d" in verify(call, kernel, ALGORITHMS["native-nhwc"], 4)


def test_bench_times_plans_on_the_wall_clock_even_on_one_cpu_thread():
    """Time a call spends off its thread counts: a call that sleeps 20 ms (no CPU time at all) is
    timed at >= 20 ms, and every raw table's `clock` column says wall. On one thread the study used
    the thread's CPU time before, which timed such a call at ~0."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert bench.clock("cpu") == (time.perf_counter, "wall")
        assert bench.clock("cuda")[1] == "wall (synchronised)"
        timed = bench.time_rounds([lambda i: time.sleep(0.02), lambda i: None], "cpu", repeats=2, warmup=0)
    finally:
        torch.set_num_threads(threads)
    (slept, slept_median, slept_wall), (idle, _, _) = timed
    assert slept >= 0.02 and slept_median >= 0.02 and slept_wall >= 0.04
    assert idle < slept


def test_benchmark_rows_record_backend_workspace_and_skip_an_unavailable_backend():
    call = KernelCall(SMALL, 4, "cpu")
    rows = pd.DataFrame(
        benchmark_layer(
            call,
            ["native-nchw", "onednn-nchw", "cudnn-benchmark-nchw"],
            [1, 2, 4],
            "cpu",
            repeats=2,
            warmup=1,
        )
    )
    only_unavailable = benchmark_layer(call, ["cudnn-benchmark-nchw"], [4], "cpu", repeats=2, warmup=1)
    assert [r["status"] for r in only_unavailable] == ["skipped"] * len(ALL_KERNELS)
    skipped = rows[rows["algorithm"] == "cudnn-benchmark-nchw"]
    assert len(skipped) == 12 and (skipped["status"] == "skipped").all()
    assert skipped["reason"].str.contains("cuda algorithm and this run is on cpu").all()
    ok = rows[rows["status"] == "ok"]
    assert len(ok) == 24 and (ok["time_s"] > 0).all()
    assert set(ok["kernel"]) == set(ALL_KERNELS)
    assert set(ok["backend_ran"]) == {"native", "onednn"}
    # the native path is always what runs when forced; oneDNN runs at the full batch, while at
    # micro-batch 1 PyTorch's dispatcher may pick the native path for a shape this small: recorded
    assert (ok[ok["algorithm"] == "native-nchw"]["backend_ran"] == "native").all()
    assert ok[(ok["algorithm"] == "onednn-nchw") & (ok["micro_batch"] == 4)]["forced_ok"].all()
    assert (ok[~ok["forced_ok"].astype(bool)]["backend_ran"] == "native").all()
    # the native path's im2col columns buffer is workspace that grows with the micro-batch
    cols = SMALL.cin * SMALL.kh * SMALL.kw * SMALL.out_hw[0] * SMALL.out_hw[1] * 4
    fwd = ok[(ok["algorithm"] == "native-nchw") & (ok["kernel"] == "forward")].set_index("micro_batch")
    assert fwd.loc[1, "workspace_bytes"] >= cols
    assert fwd.loc[2, "workspace_bytes"] >= 2 * cols
    assert fwd.loc[4, "workspace_bytes"] >= 4 * cols


def test_workloads_have_the_papers_shapes():
    a = alexnet(224)
    assert [(ly.cin, ly.cout, ly.height) for ly in a] == [
        (3, 64, 224),
        (64, 192, 27),
        (192, 384, 13),
        (384, 256, 13),
        (256, 256, 13),
    ]
    r = resnet18(224)
    assert sum(ly.count for ly in r) == 20  # 17 3x3/7x7 convs + 3 downsamples
    assert r[1].height == 56 and r[-1].height == 7
    assert [ly.height for ly in deepbench(1.0)][:2] == [161, 79]
    with pytest.raises(ValueError, match="image size 16 is too small"):
        resnet18(16)


# ------------------------------------------------------------------------- config and the app


def test_each_network_point_runs_on_the_device_the_app_resolved(test_config):
    """The app resolves microbatch.device once; its points (and so their stored results) name it."""
    from hpcdl.platform.kit.config import validate_config
    from hpcdl.platform.kit.study import spec
    from hpcdl.studies.microbatch.sweep import network_points

    cfg = validate_config(test_config)
    assert {p["device"] for p in network_points(cfg, "cuda")} == {"cuda"}
    assert {p["device"] for p in network_points(cfg)} == {"cpu"}
    assert spec("microbatch").task_gpus(cfg) == 1  # on CUDA each network's task holds one GPU


def test_a_network_point_runs_on_its_device_as_resolved_never_resolving_it_again(test_config):
    """The worker takes the point's device as the app resolved it: `auto` (or none) is refused by name."""
    from hpcdl.platform.kit.config import validate_config
    from hpcdl.studies.microbatch.compute import run_network
    from hpcdl.studies.microbatch.sweep import network_points

    point = network_points(validate_config(test_config))[0]
    for device in ("auto", None):
        with pytest.raises(ValueError, match="the point must carry the device the task app resolved"):
            run_network(**{**point, "device": device})


def test_bad_config_values_name_the_key(test_config):
    base = {**test_config, "studies": ["microbatch"]}
    for block, key in (
        ({"device": "tpu"}, "microbatch.device"),
        ({"batch_size": 0}, "microbatch.batch_size"),
        ({"policies": ["fibonacci"]}, "microbatch.policies[0]"),
        ({"networks": ["resnet18"], "image_size": 20}, "microbatch.image_size"),
    ):
        cfg = {**base, "microbatch": {**test_config["microbatch"], **block}}
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"mb-bad-{os.getpid()}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            load_config(path)
        path.unlink()


def test_app_end_to_end_with_a_too_small_limit_then_an_unavailable_backend(tmp_path, test_config,
                                                                            run_task_app):
    cfg = {**test_config, "studies": ["microbatch"], "results_dir": str(tmp_path / "r")}
    cfg["microbatch"] = {
        **test_config["microbatch"],
        "networks": ["alexnet"],
        "algorithms": ["native-nchw", "cudnn-heuristic-nchw"],
        "batch_size": 3,
        # a per-kernel DP limit below every need: the network fails naming a layer
        "kernel_limit_mib": 0.0,
    }
    path = tmp_path / "c.yaml"
    proc = run_task_app("microbatch", cfg, path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    raw = tmp_path / "r" / "microbatch" / "raw"
    bench = pd.read_csv(raw / "bench.csv")
    fail = pd.read_csv(raw / "planning.csv")
    assert (fail["status"] == "failed").all()
    assert fail["error"].str.contains(r"WorkspaceError: layer conv\d").all()
    assert fail["error"].str.contains("smaller than every configuration").all()
    assert bench.empty or "failed" in set(bench["status"])
    summary = json.loads((raw / "run_summary.json").read_text())
    assert summary == {"ok": 0, "failed": 1, "skipped": 0, "total": 1}
    # with a usable limit the same app runs; the unavailable cuDNN candidate is recorded as skipped
    cfg["microbatch"]["kernel_limit_mib"] = None
    cfg["microbatch"]["backward_forms"] = ["separate"]  # μ-cuDNN's three kernels, no fused backward
    proc = run_task_app("microbatch", cfg, path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bench = pd.read_csv(raw / "bench.csv")
    cud = bench[bench["algorithm"] == "cudnn-heuristic-nchw"]
    assert len(cud) and (cud["status"] == "skipped").all() and cud["reason"].str.contains("on cpu").all()
    assert set(bench[bench["status"] == "ok"]["algorithm"]) == {"native-nchw", "onednn-nchw"}  # + default
    plans = pd.read_csv(raw / "plans.csv")
    assert set(plans["kernel"]) == {"forward", "backward_data", "backward_filter"}
    for r in plans.itertuples():
        assert sum(map(int, str(r.micro_batches).split("+"))) == 3  # B = 3: uneven divisions add up
    ex = pd.read_csv(raw / "execution.csv")
    assert (ex[["err_output", "err_grad_input", "err_grad_weight"]].max() <= 1e-5).all()
    # every distinct plan timed as a whole network in each round, beside the default's same round
    rounds = pd.read_csv(raw / "network_rounds.csv")
    assert set(rounds["plan_id"]) == set(ex["plan_id"])
    assert (rounds.groupby("plan_id")["round"].count() == cfg["microbatch"]["exec_repeats"]).all()
    assert (rounds[["plan_time_s", "default_time_s"]] > 0).all().all()
    # every move timed inside the network first: a layer left the default only where that gained enough
    vetted = read_or_empty(raw / "stack_vetting.csv")
    assert (vetted["confirmed"] == (vetted["in_stack_speedup"] >= vetted["needed_speedup"])).all()
    assert set(vetted["rounds"]) <= {cfg["microbatch"]["stack_vetting_rounds"]}
    pinned = set(ex[ex["pinned_by_vetting"]]["layer"])
    assert pinned == set(vetted[~vetted["confirmed"]]["layer"])
    assert set(ex[~ex["keeps_default"]]["layer"]) <= set(vetted[vetted["confirmed"]]["layer"]) | pinned
    # a pinned layer runs the default algorithm undivided in every plan (here through the executor:
    # this run offers only the separate backward)
    at_default = plans[plans["layer"].isin(pinned)]
    assert (at_default["micro_batches"].astype(str) == "3").all()
    assert (at_default["algorithms"] == "onednn-nchw").all()
    for stage in ("tables", "figures", "claims"):
        p = subprocess.run(
            [sys.executable, "-m", "hpcdl", "microbatch", stage, "--config", str(path)],
            cwd=REPO,
            env=child_env(REPO, HPCDL_PROGRESS="0"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((tmp_path / "r" / "microbatch" / "claims.json").read_text())
    claims = {c["id"]: c for c in doc["claims"]}
    assert set(claims) == {"algorithm_choice_not_slower", "algorithm_choice_prediction_within_tolerance",
                           "outputs_exact", "cudnn_plan_not_slower", "cudnn_tight_limit_speedup"}
    assert claims["outputs_exact"]["status"] == "passed"
    # μ-cuDNN's own experiment needs cuDNN: on the CPU its tables are empty and its claims not measured
    for table in (raw / "cudnn_limits.csv", raw.parent / "tables" / "cudnn_networks.csv"):
        assert table.exists() and read_or_empty(table).empty
    for cid in ("cudnn_plan_not_slower", "cudnn_tight_limit_speedup"):
        assert claims[cid]["status"] == "not_measured"
        assert "needs cuDNN's workspace-limited algorithms (a GPU)" in claims[cid]["reason"]
    figures = ("layer_speedup", "budget_speedup", "microbatch_sizes", "predicted_vs_measured", "cudnn_limits")
    for fig in figures:
        assert (tmp_path / "r" / "microbatch" / "figures" / f"{fig}.png").stat().st_size > 10_000


# ------------------------------------------------------------- whole-network execution and claims


def test_the_float64_result_tells_rounding_from_a_wrong_result():
    from hpcdl.studies.microbatch.choice.exact import exact
    from hpcdl.studies.microbatch.compute import exactness_rows

    call = KernelCall(SMALL, 5, "cpu", seed=3)
    for kernel in ALL_KERNELS:
        truth = exact(call, kernel)
        assert all(t.dtype == torch.float64 for t in (truth if kernel == FUSED else (truth,)))
        got = call.run_division(kernel, [("onednn-nchw", 1), ("native-nchw", 4)])
        assert rel_err(got, truth) <= 1e-6, kernel   # fp32 rounding alone
    # a weight gradient that left out one sample is far from it
    partial = call.output("backward_filter")
    call.run("backward_filter", ALGORITHMS["onednn-nchw"], 0, 4, partial)
    assert rel_err(partial, exact(call, "backward_filter")) > 0.05
    rows = exactness_rows(ALL_KERNELS, call, ["onednn-nchw", "native-nhwc"], "cpu", "net")
    assert len(rows) == 2 * len(ALL_KERNELS)
    assert all(r["err_fp64"] <= 1e-6 and r["default_err_fp64"] <= 1e-6 and r["max_rel_err"] <= 1e-5
               for r in rows)
    with pytest.raises(ValueError, match="unknown kernel 'sideways'"):
        exact(call, "sideways")


def test_plans_run_as_whole_networks_each_distinct_plan_once_a_round():
    layers = [ConvLayer("a", 4, 8, 9, 9, 3, 3, 1, 1, 1), ConvLayer("b", 8, 8, 5, 5, 3, 3, 1, 1, 1, count=2)]
    calls = {ly.name: KernelCall(ly, 4, "cpu", seed=i) for i, ly in enumerate(layers)}
    default = {"forward": [("onednn-nchw", 4)], FUSED: [("onednn-nchw", 4)]}
    divided = {"forward": [("native-nchw", 1), ("onednn-nchw", 3)], "backward_data": [("native-nchw", 4)],
               "backward_filter": [("onednn-nhwc", 2), ("onednn-nhwc", 2)]}
    plans = {"undivided/ilp": {"a": default, "b": default}, "all/ilp": {"a": divided, "b": default},
             "all/dp": {"a": dict(divided), "b": dict(default)}}
    units = execute_network(calls, plans, "cpu", rounds=3)
    assert list(units) == ["default", "undivided/ilp", "all/ilp"]       # all/dp equals all/ilp: one unit
    assert units["all/ilp"]["variants"] == ["all/ilp", "all/dp"]
    for u in units.values():
        assert len(u["times"]) == 3 and all(len(v) == 3 for v in u["layer_times"].values())
        for r, total in enumerate(u["times"]):  # layer times are parts of the one timed pass
            assert sum(v[r] for v in u["layer_times"].values()) <= total * (1 + 1e-9)
        assert max(e for errs in u["errors"].values() for e in errs.values()) <= 1e-5
    # the plan that keeps the default everywhere is run and timed itself, not given the default's times
    assert units["undivided/ilp"]["times"] != units["default"]["times"]


def test_a_move_slower_inside_the_network_pins_its_layer_and_the_planners_run_again():
    from hpcdl.studies.microbatch.choice.vetting import vet

    layers = [ConvLayer("a", 8, 16, 16, 16, 3, 3, 1, 1, 1), ConvLayer("b", 8, 8, 9, 9, 3, 3, 1, 1, 1)]
    calls = {ly.name: KernelCall(ly, 4, "cpu", seed=i) for i, ly in enumerate(layers)}
    default = {"forward": [("onednn-nchw", 4)], FUSED: [("onednn-nchw", 4)]}
    # one sample at a time through the native im2col path, both gradients apart: far slower than the default
    singles = [("native-nchw", 1)] * 4
    slow = {"forward": singles, "backward_data": singles, "backward_filter": singles}
    asked = []

    def planner(pinned):
        asked.append(pinned)
        a = default if "a" in pinned else slow
        return f"plans with {sorted(pinned)} pinned", {"a": {"all/ilp": a, "undivided/ilp": default},
                                                       "b": {"all/ilp": default, "undivided/ilp": default}}

    out = vet(planner, calls, lambda p: p == default, "cpu", rounds=3, needed_speedup=1.05)
    assert asked == [frozenset(), frozenset({"a"})]
    assert out.pinned == {"a"} and out.planned == "plans with ['a'] pinned"
    assert all(p == default for layers_ in out.variants.values() for p in layers_.values())
    [row] = out.rows  # only the moved layer, in the one plan that moves it
    assert (row["layer"], row["plan_id"], row["vetting_pass"], row["confirmed"]) == ("a", "all/ilp", 0, False)
    assert row["in_stack_speedup"] == pytest.approx(row["in_stack_default_s"] / row["in_stack_plan_s"])
    assert 0 < row["in_stack_speedup"] < 1 and row["rounds"] == 3
    assert row["layer_plan"].startswith("forward 1+1+1+1/native-nchw+native-nchw")
    assert out.seconds > 0
    # a move that reaches the needed speedup is kept, and the planners are not run again
    asked.clear()
    kept = vet(planner, calls, lambda p: p == default, "cpu", rounds=3, needed_speedup=0.0)
    assert asked == [frozenset()] and kept.pinned == set() and kept.variants["all/ilp"]["a"] == slow
    assert [r["confirmed"] for r in kept.rows] == [True]
    # without vetting rounds the first plans stand and nothing is timed
    asked.clear()
    unvetted = vet(planner, calls, lambda p: p == default, "cpu", rounds=0, needed_speedup=1.05)
    assert asked == [frozenset()] and unvetted.rows == [] and unvetted.variants["all/ilp"]["a"] == slow


def _mb_raw(speedups: dict, divided: int) -> dict[str, pd.DataFrame]:
    """Raw execution / rounds / plans rows of one network, its two policies sharing one ILP plan."""
    variants = {"undivided/ilp": "p", "all/ilp": "p", "undivided/dp": "p", "all/dp": "p"}
    ex, plans = [], []
    for v in variants:
        pol, pl = v.split("/")
        for layer, changed in (("conv1", True), ("conv2", False)):
            ex.append({"network": "alexnet", "policy": pol, "planner": pl, "layer": layer, "count": 2,
                       "plan_id": "p", "keeps_default": not changed, "measured_time_s": 1.0,
                       "measured_default_time_s": 1.0, "predicted_time_s": 0.9 if changed else 1.0,
                       "predicted_default_time_s": 1.0, "err_output": 0.0, "err_grad_input": 0.0,
                       "err_grad_weight": 1e-7, "device": "cpu", "status": "ok"})
            for k in ("forward", "backward"):
                plans.append({"network": "alexnet", "policy": pol, "planner": pl, "layer": layer, "kernel": k,
                              "n_micro_batches": 2 if (changed and k == "forward" and divided) else 1,
                              "status": "ok"})
    rounds = [{"network": "alexnet", "plan_id": "p", "variants": " ".join(variants), "round": r,
               "plan_time_s": 4.0 / s, "default_time_s": 4.0, "status": "ok"} for r, s in enumerate(speedups)]
    return {"execution": pd.DataFrame(ex), "network_rounds": pd.DataFrame(rounds),
            "plans": pd.DataFrame(plans)}


def _judge_raw(tmp_path, raw: dict) -> dict:
    from hpcdl.studies.microbatch import claims, tables

    t = tmp_path / "tables"
    t.mkdir(parents=True, exist_ok=True)
    tables.network_speedup(raw["execution"], raw["network_rounds"], raw["plans"]).to_csv(
        t / "network_speedup.csv", index=False)
    tables.network_rounds(raw["execution"], raw["network_rounds"]).to_csv(
        t / "network_rounds.csv", index=False)
    pd.DataFrame([{"network": "alexnet", "what": "plan", "kernel": "forward", "max_rel_err": 1e-7,
                   "layers": 2}]).to_csv(t / "exactness.csv", index=False)
    pd.DataFrame(columns=["network", "table", "error"]).to_csv(t / "failures.csv", index=False)
    cfg = {"microbatch": {"networks": ["alexnet"], "policies": ["undivided", "all"],
                          "prediction_tolerance": 0.1, "exact_tolerance": 1e-5}}
    return {c["id"]: c for c in claims.judge(cfg, tmp_path)}


def test_network_speedup_comes_from_whole_network_rounds_and_counts_a_shared_plan_once(tmp_path):
    from hpcdl.studies.microbatch import tables

    raw = _mb_raw((1.10, 1.12, 1.08), divided=1)
    nets = tables.network_speedup(raw["execution"], raw["network_rounds"], raw["plans"])
    ilp = nets[nets["planner"] == "ilp"].set_index("policy")
    assert ilp.loc["all", "measured_speedup"] == pytest.approx(1.10)          # mean of the rounds' ratios
    assert ilp.loc["all", "measured_plan_s"] == pytest.approx(4.0 / 1.10)     # median round, not a sum
    assert ilp.loc["all", "predicted_speedup"] == pytest.approx(4.0 / 3.8)    # count-weighted benchmark
    assert ilp.loc["all", "divided_kernels"] == 1 and ilp.loc["all", "layers_changed"] == 1
    c = _judge_raw(tmp_path, raw)
    slower = c["algorithm_choice_not_slower"]
    assert slower["status"] == "passed"
    assert list(slower["measured"]["holds"]) == ["alexnet [undivided, all]"]  # one plan, judged once
    assert slower["measured"]["distinct_plans"] == {"alexnet": 1}
    assert "undivided/dp" in slower["measured"]["shared_by"]["alexnet [undivided, all]"]
    assert "tests micro-batching" in slower["statement"]
    assert c["algorithm_choice_prediction_within_tolerance"]["status"] == "passed"  # 1.053 vs 1.10: -4 %


def test_claims_say_when_nothing_is_divided_and_straddle_within_noise(tmp_path):
    c = _judge_raw(tmp_path, _mb_raw((1.04, 0.97, 1.0), divided=0))
    slower = c["algorithm_choice_not_slower"]
    assert slower["status"] == "straddles"
    assert "tests per-kernel algorithm choice" in slower["statement"]
    assert "not micro-batching" in slower["statement"]
    one = _judge_raw(tmp_path / "one", _mb_raw((1.10,), divided=0))["algorithm_choice_not_slower"]
    assert one["status"] == "not_measured" and "an interval needs 2" in one["reason"]
