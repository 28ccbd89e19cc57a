"""μ-cuDNN's own setting on CUDA (issues 27, 42): cuDNN engines by id under workspace limits.

CPU tests: the limit planner (hpcdl.studies.microbatch.cudnn.limits) on HAND-MADE engine tables - the
numbers below are invented so that the expected plans can be worked out by hand, not measured -,
the config keys, and that the CPU path never imports the cuDNN frontend binding. `cuda` tests: plan
enumeration, every plan run by id against torch's convolution, the recorded plan names, graphs
declaring a misaligned input's real alignment (AlexNet's conv1 at 227x227 included), and the
benchmark table planned end to end. The alignment arithmetic and the run/skip decision are tested on
the CPU in test_microbatch_alignment.py, the engine-table driver in test_microbatch_engine_table.py.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys

import pandas as pd
import pytest

from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.studies.microbatch.common.dp import WorkspaceError
from hpcdl.studies.microbatch.common.workloads import alexnet
from hpcdl.studies.microbatch.cudnn import alignment as al
from hpcdl.studies.microbatch.cudnn import limits
from hpcdl.studies.microbatch.cudnn.engines import PACKAGE, enabled

MiB = 2**20
B = 4


def hand_made_table() -> pd.DataFrame:
    """HAND-MADE (not measured). Layer L1, mini-batch 4, micro-batches 1, 2, 4 (powerOfTwo).

    forward: "slow" takes 10 b s and no workspace; "fast" takes 4 b + 1 s and 25 b MiB.
    backward_filter: "a" takes 3 b s and no workspace; "b" takes b + 2 s and 10 b MiB.
    A row the benchmark marked over_limit (a tiny time) must never be planned with.
    """
    rows = []
    for b in (1, 2, 4):
        rows += [
            ("forward", b, "slow", 10.0 * b, 0),
            ("forward", b, "fast", 4.0 * b + 1, 25 * MiB * b),
            ("backward_filter", b, "a", 3.0 * b, 0),
            ("backward_filter", b, "b", b + 2.0, 10 * MiB * b),
        ]
    df = pd.DataFrame(rows, columns=["kernel", "micro_batch", "engine", "time_s", "workspace_bytes"])
    df.insert(0, "layer", "L1")
    df["status"] = "ok"
    huge = {
        "layer": "L1",
        "kernel": "forward",
        "micro_batch": 4,
        "engine": "huge",
        "time_s": 0.001,
        "workspace_bytes": 4096 * MiB,
        "status": "over_limit",
    }
    return pd.concat([df, pd.DataFrame([huge])], ignore_index=True)


FWD, WGRAD = ("L1", "forward"), ("L1", "backward_filter")


def test_undivided_baseline_is_the_fastest_engine_fitting_at_the_full_batch():
    t = hand_made_table()
    at8 = limits.undivided(t, B, 8 * MiB)
    assert at8[FWD].division == (("slow", 4),) and at8[FWD].time_s == 40.0
    assert at8[WGRAD].division == (("a", 4),) and at8[WGRAD].time_s == 12.0
    at64 = limits.undivided(t, B, 64 * MiB)
    assert at64[FWD].engines == "slow"  # fast needs 100 MiB at b=4
    assert at64[WGRAD].division == (("b", 4),) and at64[WGRAD].workspace_bytes == 40 * MiB
    assert limits.undivided(t, B, 512 * MiB)[FWD].division == (("fast", 4),)


def test_dp_divides_where_the_fast_engine_fits_only_smaller_micro_batches():
    t = hand_made_table()
    at64 = limits.per_layer(t, B, "powerOfTwo", 64 * MiB)
    assert at64[FWD].division == (("fast", 2), ("fast", 2))
    assert at64[FWD].time_s == 18.0 and at64[FWD].workspace_bytes == 50 * MiB
    assert at64[FWD].sizes == "2+2"
    at8 = limits.per_layer(t, B, "powerOfTwo", 8 * MiB)
    assert at8[FWD].time_s == 40.0 and set(at8[FWD].engines.split("+")) == {"slow"}
    assert limits.per_layer(t, B, "powerOfTwo", 512 * MiB)[FWD].division == (("fast", 4),)
    # undivided policy = the baseline, whatever the limit
    assert limits.per_layer(t, B, "undivided", 64 * MiB)[FWD].time_s == 40.0


def test_limit_sweep_and_network_speedup():
    t = hand_made_table()
    ref = {FWD: 15.0, WGRAD: 5.0}  # stands for PyTorch's default (cudnn.benchmark on): hand-made too
    rows = limits.limit_sweep(t, B, ["undivided", "powerOfTwo"], [512, 8, 64], ref)
    assert [r["limit_mib"] for r in rows][::4] == [8.0, 64.0, 512.0]
    at = {(r["limit_mib"], r["policy"], r["kernel"]): r for r in rows}
    r = at[(64.0, "powerOfTwo", "forward")]
    assert r["feasible"] and r["undivided_s"] == 40.0 and r["time_s"] == 18.0
    assert r["speedup"] == pytest.approx(40 / 18) and r["micro_batches"] == "2+2"
    assert r["pytorch_default_s"] == 15.0
    net = {(n["limit_mib"], n["policy"]): n for n in limits.network_speedup(rows)}
    assert net[(64.0, "powerOfTwo")]["speedup"] == pytest.approx((40 + 6) / (18 + 6))
    assert net[(64.0, "powerOfTwo")]["divided_kernels"] == 1
    assert net[(64.0, "powerOfTwo")]["pytorch_default_s"] == 20.0
    assert net[(8.0, "powerOfTwo")]["speedup"] == pytest.approx(1.0)
    assert net[(512.0, "powerOfTwo")]["speedup"] == pytest.approx(1.0)
    assert net[(64.0, "undivided")]["speedup"] == pytest.approx(1.0)


def test_a_limit_nothing_fits_names_the_kernel():
    t = hand_made_table()
    t.loc[t["engine"] == "slow", "workspace_bytes"] = 1 * MiB
    need = r"L1/forward: workspace limit 0\.500 MiB .* least is 1\.000 MiB"
    with pytest.raises(WorkspaceError, match=need):
        limits.undivided(t, B, 0.5 * MiB)
    rows = limits.limit_sweep(t, B, ["powerOfTwo"], [0.5])
    fwd = next(r for r in rows if r["kernel"] == "forward")
    assert not fwd["feasible"] and "L1/forward" in fwd["reason"] and math.isnan(fwd["speedup"])
    wgrad = next(r for r in rows if r["kernel"] == "backward_filter")
    assert wgrad["feasible"] and wgrad["time_s"] == 12.0
    assert not limits.network_speedup(rows)[0]["feasible"]


def test_ilp_shares_one_budget_between_kernels():
    t = hand_made_table()
    # fronts at b=4: forward (0, 40) (25, 20) (50, 18) (100, 17); backward_filter (0, 12) (20, 8) (40, 6)
    res, choice = limits.budget_plan(t, B, "powerOfTwo", 60 * MiB)
    assert res.time_s == pytest.approx(28.0) and res.workspace_bytes == pytest.approx(45 * MiB)
    assert choice[FWD].division == (("fast", 1),) * 4
    assert choice[WGRAD].division == (("b", 2), ("b", 2))
    base, base_choice = limits.budget_plan(t, B, "undivided", 60 * MiB)
    assert base.time_s == pytest.approx(46.0)
    assert base_choice[FWD].engines == "slow" and base_choice[WGRAD].engines == "b"
    with pytest.raises(WorkspaceError, match="budget"):
        limits.budget_plan(t.assign(workspace_bytes=t["workspace_bytes"] + MiB), B, "powerOfTwo", 1 * MiB)


def test_bad_tables_are_refused_with_the_reason():
    t = hand_made_table()
    with pytest.raises(ValueError, match="lacks column.*workspace_bytes"):
        limits.kernel_tables(t.drop(columns=["workspace_bytes"]))
    with pytest.raises(ValueError, match="L1/forward has two rows for engine slow at micro-batch 1"):
        limits.kernel_tables(pd.concat([t, t.iloc[[0]]]))
    with pytest.raises(ValueError, match="needs micro-batch sizes \\[3\\]"):
        limits.per_layer(t, B, "all", 64 * MiB)


def test_config_keys_default_and_validate():
    block = validate_config({"studies": ["microbatch"], "microbatch": {}})["microbatch"]
    assert block["cudnn"] == {"engines": False, "limits_mib": [8, 64, 512], "tf32": False, "networks": None,
                              "deepbench_limits_mib": None, "screen_ratio": None}
    for bad, key in [
        ({"limits_mib": [0]}, "microbatch.cudnn.limits_mib[0]"),
        ({"limits_mib": []}, "microbatch.cudnn.limits_mib"),
        ({"engines": "yes"}, "microbatch.cudnn.engines"),
        ({"engine": True}, "microbatch.cudnn"),
        ({"networks": ["vgg"]}, "microbatch.cudnn.networks[0]"),
        ({"deepbench_limits_mib": [0]}, "microbatch.cudnn.deepbench_limits_mib[0]"),
        ({"screen_ratio": 1}, "microbatch.cudnn.screen_ratio"),
    ]:
        with pytest.raises(ConfigError) as err:
            validate_config({"studies": ["microbatch"], "microbatch": {"cudnn": bad}})
        assert err.value.key.startswith(key), (bad, err.value.key)


def test_engines_with_device_cpu_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"'microbatch.cudnn.engines'.*CUDA only"):
        validate_config({"studies": ["microbatch"],
                         "microbatch": {"device": "cpu", "cudnn": {"engines": True}}})


def test_engines_run_only_on_cuda():
    on = {"cudnn": {"engines": True}}
    assert enabled(on, "cuda")
    assert not enabled(on, "cpu")
    assert not enabled({"cudnn": {"engines": False}}, "cuda")


def test_cpu_path_never_imports_the_binding():
    code = (
        "import sys\n"
        "import torch\n"
        "from hpcdl.studies.microbatch import compute\n"
        "from hpcdl.studies.microbatch.cudnn import engines as cudnn_engines, limits\n"
        "from hpcdl.studies.microbatch.common.workloads import ConvLayer\n"
        "import tasks.microbatch\n"
        "layer = ConvLayer('t', 2, 3, 6, 6, 3, 3, 1, 1, 1)\n"
        "x, w, dy = torch.zeros(2, 2, 6, 6), torch.zeros(3, 2, 3, 3), torch.zeros(2, 3, 6, 6)\n"
        "try:\n"
        "    cudnn_engines.KernelGraph(layer, 'forward', x, w, dy)\n"
        "except ValueError as exc:\n"
        "    assert 'only on CUDA' in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('a CPU KernelGraph was built')\n"
        "assert 'cudnn' not in sys.modules, 'the CPU path imported the cuDNN frontend'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.skipif(importlib.util.find_spec("cudnn") is not None, reason="the binding is installed here")
def test_missing_binding_names_the_package():
    from hpcdl.studies.microbatch.cudnn.engines import binding

    with pytest.raises(RuntimeError, match=f"needs the Python package {PACKAGE}.*microbatch.cudnn.engines"):
        binding()


# The planner on recorded engine tables (tests/data/microbatch_cudnn_<gpu>.csv, every one there) and
# the check failing on corrupted copies: test_microbatch_cudnn_study.py::test_planner_on_recorded_tables.


# ----------------------------------------------------------------------------------------- CUDA


def _small_call():
    import torch  # noqa: F401

    from hpcdl.studies.microbatch.choice.algorithms import KernelCall
    from hpcdl.studies.microbatch.common.workloads import ConvLayer

    layer = ConvLayer("small", cin=8, cout=16, height=12, width=12, kh=3, kw=3, stride=1, pad_h=1, pad_w=1)
    return KernelCall(layer, B, "cuda", seed=0)


def _reference(call, kernel):
    import torch

    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False):
        if kernel == "forward":
            return torch.ops.aten.convolution(call.x, call.weight, None, *call.args)
        mask = [kernel == "backward_data", kernel == "backward_filter", False]
        res = torch.ops.aten.convolution_backward(call.grad_out, call.x, call.weight, None, *call.args, mask)
        return res[0] if kernel == "backward_data" else res[1]


@pytest.mark.cuda
def test_plans_enumerate_with_workspace_and_name():
    from hpcdl.studies.microbatch.cudnn.engines import graph_for, library_record

    rec = library_record()
    assert rec["same_cudnn"], rec  # the frontend drives the cuDNN torch loaded
    call = _small_call()
    for kernel in ("forward", "backward_data", "backward_filter"):
        g = graph_for(call, kernel, B)
        assert g.count >= 1 and g.plans, (kernel, g.refused)
        for name, ws in g.plans.values():
            assert isinstance(name, str) and name
            assert ws >= 0


@pytest.mark.cuda
def test_every_plan_run_by_id_is_exact_and_records_its_name():
    import torch

    from hpcdl.studies.microbatch.choice.exact import rel_err
    from hpcdl.studies.microbatch.cudnn.engines import graph_for, inputs_at

    call = _small_call()
    for kernel in ("forward", "backward_data", "backward_filter"):
        g = graph_for(call, kernel, B)
        want = _reference(call, kernel)
        for i, (name, _) in g.plans.items():
            out = call.output(kernel)
            ran = g.run(i, inputs_at(call, kernel, 0, B), out, g.workspace(i))
            torch.cuda.synchronize()
            assert ran == name == g.graph.get_plan_name_at_index(i)
            assert rel_err(out, want) < 1e-5, (kernel, name)


@pytest.mark.cuda
def test_micro_batched_engines_are_exact_and_plan_end_to_end():
    from hpcdl.studies.microbatch.choice.exact import rel_err
    from hpcdl.studies.microbatch.cudnn.bench import benchmark_layer
    from hpcdl.studies.microbatch.cudnn.engines import run_division

    call = _small_call()
    rows, graphs = benchmark_layer(call, [1, 2, 4], repeats=2, warmup=1, max_workspace_bytes=512 * MiB)
    table = pd.DataFrame(rows)
    ok = table[table["status"] == "ok"]
    assert set(ok["kernel"]) == {"forward", "backward_data", "backward_filter"}
    assert (ok["time_s"] > 0).all()
    # the workspace is allocated at the plan's size (the caching allocator rounds up)
    assert (ok["measured_workspace_bytes"] >= ok["workspace_bytes"]).all()
    assert (ok["ran"] == ok["engine"]).all()
    plan = limits.per_layer(ok, B, "powerOfTwo", 64 * MiB)
    for (layer, kernel), choice in plan.items():
        # the planned division, and a forced 2+2 division with an engine built at both sizes
        common = sorted(set(graphs[(kernel, 2)].by_name) & set(graphs[(kernel, 4)].by_name))
        for steps in (list(choice.division), [(common[0], 2), (common[0], 2)]):
            by_size = {b: graphs[(kernel, b)] for _, b in steps}
            got, ran = run_division(call, kernel, steps, by_size)
            assert ran == [e for e, _ in al.execution_order(steps)]
            assert rel_err(got, _reference(call, kernel)) < 1e-5, (layer, kernel, steps)


def _odd_call(layer=None, batch=B):
    """A 3-channel 7x7 input: 588-byte samples (12 mod 16), as AlexNet's conv1 at 227x227."""
    from hpcdl.studies.microbatch.choice.algorithms import KernelCall
    from hpcdl.studies.microbatch.common.workloads import ConvLayer

    layer = layer or ConvLayer("odd", cin=3, cout=16, height=7, width=7, kh=3, kw=3, stride=1, pad_h=1,
                               pad_w=1)
    return KernelCall(layer, batch, "cuda", seed=0)


def _declarable(call, sizes):
    """The (kernel, micro-batch) pairs a frontend without an alignment setter may build: every role
    at 16 bytes at every offset (alignment.undeclarable)."""
    from hpcdl.studies.microbatch.cudnn.engines import kernel_operands

    return {(k, b) for k in al.ROLES for b in sizes
            if not al.undeclarable(al.declared_alignment(kernel_operands(call, k), b, call.batch), b, "f")}


def _check_misaligned_table(call, table, sizes, declares):
    """Every (kernel, size) runs where the frontend declares alignment; where it cannot (1.32), exactly
    the pairs below 16 bytes are skipped, saying so, and the others run."""
    assert (table.loc[table["status"] != "ok", "reason"].str.len() > 0).all()
    ok = table[table["status"] == "ok"]
    ran = set(zip(ok["kernel"], ok["micro_batch"], strict=True))
    if declares:
        assert ran == {(k, b) for k in al.ROLES for b in sizes}
        return ok
    want = _declarable(call, sizes)
    assert ran == want and len(want) < len(al.ROLES) * len(sizes)
    refused = table[(table["plan_index"] == -1)]
    assert set(zip(refused["kernel"], refused["micro_batch"], strict=True)) == (
        {(k, b) for k in al.ROLES for b in sizes} - want)
    assert refused["reason"].str.contains("cannot declare a tensor's alignment").all()
    return ok


@pytest.mark.cuda
def test_graphs_declare_a_misaligned_inputs_real_alignment_and_run_at_every_offset():
    import torch

    from hpcdl.studies.microbatch.choice.exact import rel_err
    from hpcdl.studies.microbatch.cudnn.bench import benchmark_layer
    from hpcdl.studies.microbatch.cudnn.engines import (
        KernelGraph,
        frontend_declares_alignment,
        graph_for,
        inputs_at,
        run_division,
    )

    call = _odd_call()
    declares = frontend_declares_alignment()
    assert call.x[1:].data_ptr() % 16 == 12
    if declares:
        assert graph_for(call, "forward", 1).alignment == {"x": 4, "w": 16, "y": 16}
        assert graph_for(call, "backward_data", 2).alignment == {"dy": 16, "w": 16, "dx": 8}
    else:
        with pytest.raises(ValueError, match=r"at micro-batch 1, x is 4-byte aligned .* cannot declare"):
            graph_for(call, "forward", 1)
    assert graph_for(call, "backward_filter", B).alignment == {"x": 16, "dy": 16, "dw": 16}
    # the frontend's default declaration refuses the view at sample 1 instead of running it
    g16 = KernelGraph(call.layer, "forward", call.x[:1], call.weight, call.grad_out[:1])
    i = next(iter(g16.plans))
    out = call.output("forward")
    assert g16.problems(inputs_at(call, "forward", 0, 1), out[:1]) == []
    need = r"x at address 0x[0-9a-f]+ is 4-byte aligned; the graph declares 16"
    with pytest.raises(ValueError, match=need):
        g16.run(i, inputs_at(call, "forward", 1, 1), out[1:2], g16.workspace(i))
    rows, graphs = benchmark_layer(call, [1, 2, 4], repeats=1, warmup=0, max_workspace_bytes=512 * MiB)
    ok = _check_misaligned_table(call, pd.DataFrame(rows), [1, 2, 4], declares)
    if declares:
        fwd1 = ok[(ok["kernel"] == "forward") & (ok["micro_batch"] == 1)]
        assert set(fwd1["alignment"]) == {"x:4 w:16 y:16"}
    for kernel in al.ROLES:
        want = _reference(call, kernel)
        sizes = sorted(b for (k, b) in graphs if k == kernel)
        g = graphs[(kernel, sizes[0])]
        b0 = sizes[0]
        for name in ok.loc[(ok["kernel"] == kernel) & (ok["micro_batch"] == b0), "engine"]:
            got, ran = run_division(call, kernel, [(name, b0)] * (B // b0), {b0: g})
            torch.cuda.synchronize()
            assert ran == [name] * (B // b0) and rel_err(got, want) < 1e-5, (kernel, name)
        if declares and (1, 2) == tuple(sizes[:2]):
            both = sorted(set(g.by_name) & set(graphs[(kernel, 2)].by_name))
            if both:  # 1 + 2 + 1 runs as 2 + 1 + 1: the 2 at sample 0, the 1s at samples 2 and 3
                steps = [(both[0], 1), (both[0], 2), (both[0], 1)]
                got, ran = run_division(call, kernel, steps, {1: g, 2: graphs[(kernel, 2)]})
                assert rel_err(got, want) < 1e-5, (kernel, steps)


@pytest.mark.cuda
def test_alexnet_conv1_at_227_benchmarks_every_offset_without_raising():
    """The H200 run's crash (conv1 forward b=1 raised from the timing loop), at the same shape."""
    from hpcdl.studies.microbatch.cudnn.bench import benchmark_layer
    from hpcdl.studies.microbatch.cudnn.engines import frontend_declares_alignment

    call = _odd_call(alexnet(227)[0], batch=4)
    declares = frontend_declares_alignment()
    rows, _ = benchmark_layer(call, [1, 2, 4], repeats=1, warmup=0, max_workspace_bytes=512 * MiB)
    ok = _check_misaligned_table(call, pd.DataFrame(rows), [1, 2, 4], declares)
    if declares:
        fwd1 = ok[(ok["kernel"] == "forward") & (ok["micro_batch"] == 1)]
        assert set(fwd1["alignment"]) == {"x:4 w:16 y:16"} and (fwd1["time_s"] > 0).all()
    assert (ok["time_s"] > 0).all()
