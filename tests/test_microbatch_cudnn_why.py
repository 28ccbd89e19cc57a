"""Why micro-batching does or does not pay (issue #58 items 2 and 5): tables/cudnn_why.csv on the
committed H200 engine table (tests/data/microbatch_cudnn_h200.csv: MEASURED on 2026-11-27, batch 64,
cuDNN 9.19), the figures in the papers' form on the committed H200 record
(resources/gpu-records/h200/microbatch/), each plan's mode and budget label, the screen that times a
dominated engine once, and the cuDNN claims over μ-cuDNN's own networks. Hand-made tables
(tests/microbatch_cudnn_tables.py) are INVENTED numbers. `cuda` tests run the screen and a tiny DeepBench
on a GPU.

What needs the GPU: the table holds batch-64 sizes only, so planning and the why table at N = 256, and
DeepBench's 3x3 and 5x5 layers, are tested here on the logic and wait for the engine table the next
H200 run measures.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import microbatch_cudnn_tables as hand
import pandas as pd
import pytest

from hpcdl.studies.microbatch import tables
from hpcdl.studies.microbatch.cudnn import claims as cudnn_claims
from hpcdl.studies.microbatch.cudnn import figures as cudnn_figures
from hpcdl.studies.microbatch.cudnn import limits
from hpcdl.studies.microbatch.cudnn import plan as cudnn_plan
from hpcdl.studies.microbatch.cudnn import why as cudnn_why

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tests" / "data" / "microbatch_cudnn_h200.csv"
RECORD = ROOT / "resources" / "gpu-records" / "h200" / "microbatch"
MiB = 2**20


@pytest.fixture(scope="module")
def engines() -> pd.DataFrame:
    return pd.read_csv(TABLE, keep_default_na=False, na_values=[""])


@pytest.fixture(scope="module")
def why(engines) -> pd.DataFrame:
    return cudnn_why.why_table(engines, [8, 64, 512], ["undivided", "powerOfTwo"])


def _kernel(why, net, layer, kernel, limit) -> pd.DataFrame:
    return why[(why["network"] == net) & (why["layer"] == layer) & (why["kernel"] == kernel)
               & (why["limit_mib"] == limit)].set_index("micro_batch")


# ------------------------------------------------------------------ the why table on the H200 table


def test_every_kernel_limit_and_size_has_a_row_and_a_cause(why):
    assert list(why.columns) == cudnn_why.COLUMNS
    assert len(why) == (15 + 33) * 3 * 7  # kernels x (8, default 64, 512 MiB) x micro-batches 1..64
    assert set(why["cause"]) <= set(cudnn_why.CAUSES) and why["why"].str.len().gt(20).all()
    assert "planner_missed" not in set(why["cause"])  # the DP finds every even division that gains
    assert (why.loc[why["micro_batch"] == 64, "call_over_share"] == 1).all()


def test_the_causes_per_network_and_limit_on_the_h200(why):
    got = {(r.network, r.limit_label, r.cause): r.kernels for r in cudnn_why.causes(why).itertuples()}
    assert got == {
        # 8 MiB (Caffe's and Chainer's default): nothing divides. Where the limit binds, the faster engines
        # need more than 8 MiB at every micro-batch, or fit only where B/b calls cost more than the baseline
        ("alexnet", "8 MiB", "not_binding"): 5, ("alexnet", "8 MiB", "workspace"): 8,
        ("alexnet", "8 MiB", "overhead"): 2,
        ("resnet18", "8 MiB", "not_binding"): 23, ("resnet18", "8 MiB", "workspace"): 7,
        ("resnet18", "8 MiB", "overhead"): 3,
        # 64 MiB: the backward-filter kernels divide (32 + 32)
        ("alexnet", "default (64 MiB)", "not_binding"): 5, ("alexnet", "default (64 MiB)", "workspace"): 4,
        ("alexnet", "default (64 MiB)", "overhead"): 2, ("alexnet", "default (64 MiB)", "divides"): 4,
        ("resnet18", "default (64 MiB)", "not_binding"): 24, ("resnet18", "default (64 MiB)", "workspace"): 4,
        ("resnet18", "default (64 MiB)", "overhead"): 1, ("resnet18", "default (64 MiB)", "divides"): 4,
        # 512 MiB: every kernel's fastest engine fits undivided
        ("alexnet", "512 MiB", "not_binding"): 15, ("resnet18", "512 MiB", "not_binding"): 33,
    }


def test_the_causes_agree_with_the_studys_own_plans_on_the_same_table(engines, why):
    """`divides` is exactly the kernels the study's DP divides with a gain under the same limit."""
    for net in ("alexnet", "resnet18"):
        ok = engines[(engines["network"] == net) & (engines["status"] == "ok")]
        counts = {(r.layer, r.kernel): int(r.count) for r in ok.itertuples()}
        rows, _ = cudnn_plan.plan_network(ok, net, 64, ["powerOfTwo"], [8, 64, 512], counts)
        planned = {(r["layer"], r["kernel"], r["limit_mib"]) for r in rows
                   if r["planner"] == "dp" and r["divided"] and r["planned_speedup"] > 1}
        k = why[why["network"] == net].drop_duplicates(["layer", "kernel", "limit_mib"])
        assert planned == {(r.layer, r.kernel, r.limit_mib) for r in k.itertuples() if r.cause == "divides"}
        for r in rows:  # and the baseline is the study's
            if r["planner"] == "dp":
                w = k[(k["layer"] == r["layer"]) & (k["kernel"] == r["kernel"])
                      & (k["limit_mib"] == r["limit_mib"])].iloc[0]
                assert w["baseline_engine"] == r["baseline_engine"]
                assert w["baseline_time_s"] == r["baseline_time_s"]


def test_alexnet_conv2_backward_data_read_off_the_table(engines, why):
    """Recomputed here from the engine table's rows: the fastest engine's workspace per micro-batch,
    the per-call overhead and the undivided engines that fit."""
    t = engines[(engines["network"] == "alexnet") & (engines["layer"] == "conv2")
                & (engines["kernel"] == "backward_data") & (engines["status"] == "ok")]
    full = t[t["micro_batch"] == 64]
    fastest64 = full.loc[full["time_s"].idxmin()]
    assert fastest64["engine"] == "eng50" and fastest64["workspace_bytes"] == 124_780_544  # 119 MiB
    for limit, cause, fitting in ((8, "workspace", 7), (64, "overhead", 7), (512, "not_binding", 8)):
        k = _kernel(why, "alexnet", "conv2", "backward_data", limit)
        assert set(k["cause"]) == {cause} and set(k["undivided_fitting"]) == {fitting}
        assert set(k["undivided_engines"]) == {len(full)} == {8}
        assert set(k["undivided_fitting"]) == {int((full["workspace_bytes"] <= limit * MiB).sum())}
        for b, r in k.iterrows():
            at = t[t["micro_batch"] == b]
            best = at.loc[at["time_s"].idxmin()]
            assert r["fastest_engine"] == best["engine"]
            assert r["fastest_workspace_bytes"] == best["workspace_bytes"]
            assert r["call_over_share"] == pytest.approx(best["time_s"] / (fastest64["time_s"] * b / 64))
    k = _kernel(why, "alexnet", "conv2", "backward_data", 64)
    # at 8 samples the fast engine (eng50) needs 59.5 MiB and fits 64 MiB, but a call of 8 takes 5.2x its
    # share of eng50's undivided call, and 8 of them 1.31x the baseline (eng25, no workspace)
    assert k.loc[8, "fastest_engine"] == "eng50" and k.loc[8, "fastest_workspace_bytes"] == 62_390_272
    assert k.loc[8, "call_over_share"] == pytest.approx(5.176, abs=1e-3)
    assert k.loc[8, "divided_over_baseline"] == pytest.approx(1.311, abs=1e-3)
    assert k.loc[8, "faster_fit_at_micro_batch"]
    assert k.loc[8, "baseline_engine"] == "eng25_k2=2_k3=0" and k.loc[8, "dp_micro_batches"] == "64"
    assert (k["divided_over_baseline"].drop(64) >= 1).all()
    assert "8 calls of the fastest fitting engine take 1.31x the baseline" in k.loc[8, "why"]
    k8 = _kernel(why, "alexnet", "conv2", "backward_data", 8)
    assert not k8["faster_fit_at_micro_batch"].any() and "at least 52.1 MiB > 8 MiB" in k8.loc[8, "why"]


def test_each_cause_means_what_it_says(why):
    k = why.drop_duplicates(["network", "layer", "kernel", "limit_mib"])
    for r in k.itertuples():
        g = why[(why["network"] == r.network) & (why["layer"] == r.layer) & (why["kernel"] == r.kernel)
                & (why["limit_mib"] == r.limit_mib)]
        small = g[g["micro_batch"] < g["batch_size"]]
        if r.cause == "not_binding":
            assert r.baseline_time_s == r.fastest_undivided_time_s and r.faster_engines == 0
        else:
            assert r.baseline_time_s > r.fastest_undivided_time_s and r.faster_engines > 0
        if r.cause == "workspace":
            assert not small["faster_fit_at_micro_batch"].any() and not r.dp_divided
        if r.cause == "overhead":
            assert small["faster_fit_at_micro_batch"].any() and (small["divided_over_baseline"] >= 1).all()
        if r.cause == "divides":
            assert r.dp_divided and r.dp_speedup > 1 and "+" in r.dp_micro_batches
    # a larger limit lets more undivided engines fit, never fewer
    u = k.pivot_table(index=["network", "layer", "kernel"], columns="limit_mib", values="undivided_fitting")
    assert (u[8.0] <= u[64.0]).all() and (u[64.0] <= u[512.0]).all()


def test_hand_made_causes_no_baseline_and_limits_per_network():
    t = hand.engine_table()
    w = cudnn_why.why_table(t, {"alexnet": cudnn_plan.limit_settings([8, 512])}, ["powerOfTwo"])
    c1 = w[(w["layer"] == "c1") & (w["kernel"] == "forward")].drop_duplicates("limit_mib")
    c1 = c1.set_index("limit_mib")
    # 8 MiB: "fast" fits only one sample at a time, 4 calls of it (4 x 5 s) beat "slow" (40 s)
    assert c1.loc[8.0, "cause"] == "divides" and c1.loc[8.0, "dp_micro_batches"] == "1+1+1+1"
    assert c1.loc[8.0, "best_even_micro_batch"] == 1 and c1.loc[8.0, "best_even_over_baseline"] == 0.5
    assert c1.loc[64.0, "cause"] == "not_binding" and c1.loc[64.0, "baseline_engine"] == "fast"
    over = w[(w["layer"] == "c1") & (w["kernel"] == "forward") & (w["micro_batch"] == 4)]
    assert set(over["engines_over_limit"]) == {1}  # "huge" is counted, never timed
    tight = cudnn_why.why_table(t, [0.5], ["powerOfTwo"])
    c2 = tight[(tight["layer"] == "c2")].drop_duplicates("limit_mib").set_index("limit_mib")
    # "h" (4.5 s at b = 4) beats "g" (8 s) but needs 40 MiB a sample: over 0.5 MiB at every micro-batch
    assert c2.loc[0.5, "cause"] == "workspace" and c2.loc[0.5, "baseline_engine"] == "g"
    assert "at least 40 MiB > 0.5 MiB" in c2.loc[0.5, "why"]
    assert c2.loc[64.0, "cause"] == "divides"  # "h" 1+1+1+1 (40 MiB) = 6 s
    c2 = w[(w["layer"] == "c2")].drop_duplicates("limit_mib").set_index("limit_mib")
    assert c2.loc[512.0, "cause"] == "not_binding" and c2.loc[512.0, "baseline_engine"] == "h"
    none = cudnn_why.why_table(t.assign(workspace_bytes=t["workspace_bytes"] + MiB), [0.5], ["powerOfTwo"])
    assert set(none.loc[none["limit_mib"] == 0.5, "cause"]) == {"no_baseline"}
    assert "no engine fits 0.5 MiB at the full mini-batch 4" in none["why"].iloc[0]
    assert cudnn_why.why_table(pd.DataFrame(), [8]).empty
    assert cudnn_why.why_table(t, {"resnet18": [(8.0, "8 MiB")]}).empty  # no limits for this network


def test_the_tables_stage_writes_the_engine_table_and_the_why_table(engines):
    raw = engines.assign(device="cuda", clock="wall (synchronised)", error="")
    failed = pd.DataFrame([{"network": "deepbench", "status": "failed", "error": "RuntimeError"}])
    raw = pd.concat([raw, failed])
    kept = tables.engine_rows(raw)
    assert set(kept["status"]) == {"ok", "over_limit"} and len(kept) == 2517 + 34
    assert list(kept.columns) == [c for c in tables.FIELDS if c in raw.columns]
    block = {"policies": ["undivided", "powerOfTwo"], "networks": ["alexnet", "resnet18"],
             "cudnn": {"limits_mib": [8, 512], "deepbench_limits_mib": [128]}}
    why = tables.cudnn_why_table(block, kept)
    assert sorted(set(why["limit_label"])) == ["512 MiB", "8 MiB", "default (64 MiB)"]
    db = kept[kept["network"] == "alexnet"].assign(network="deepbench")
    why_db = tables.cudnn_why_table(block, db)  # DeepBench under its own limits (and the default)
    assert sorted(set(why_db["limit_mib"])) == [64.0, 128.0]
    assert tables.cudnn_why_table(block, tables.engine_rows(pd.DataFrame())).empty


# -------------------------------------------------------------- the figures, on the H200 record


def test_kernel_bars_report_each_plans_speedup_and_divided_kernels_as_the_rollup():
    lim = pd.read_csv(RECORD / "cudnn_limits.csv")
    nets = pd.read_csv(RECORD / "cudnn_networks.csv")
    for net in ("alexnet", "resnet18"):
        bars = cudnn_figures.kernel_bars(lim, net)
        assert set(bars["bar"]) == {"baseline", cudnn_plan.MODE_LABEL["dp"], cudnn_plan.MODE_LABEL["ilp"]}
        assert set(bars["how"]) == {"measured"}
        for r in nets[nets["network"] == net].itertuples():
            b = bars[(bars["limit_mib"] == r.limit_mib) & (bars["bar"] == cudnn_plan.MODE_LABEL[r.planner])]
            assert b["speedup"].iloc[0] == pytest.approx(r.measured_speedup)
            assert (b["divided"].iloc[0], b["kernels"].iloc[0]) == (r.divided_kernels, r.kernels)
            assert b["time_ms"].sum() == pytest.approx(r.measured_time_s * 1e3)
            base = bars[(bars["limit_mib"] == r.limit_mib) & (bars["bar"] == "baseline")]
            assert base["time_ms"].sum() == pytest.approx(r.baseline_measured_time_s * 1e3)
    a = cudnn_figures.kernel_bars(lim, "alexnet")
    got = a[a["bar"] != "baseline"].drop_duplicates(["limit_mib", "bar"]).set_index(["limit_mib", "bar"])
    assert got.loc[(64.0, "DP per kernel (WR)"), "divided"] == 4  # the record's 1.23x, 4 of 15 divided
    assert got.loc[(64.0, "DP per kernel (WR)"), "speedup"] == pytest.approx(1.2337, abs=1e-4)


def test_deepbench_bars_per_layer_and_limit():
    lim = pd.read_csv(RECORD / "cudnn_limits.csv")
    assert cudnn_figures.deepbench_bars(lim).empty  # the batch-64 record ran no DeepBench
    db = lim[lim["network"] == "alexnet"].assign(network="deepbench")
    db["layer"] = db["layer"].map({"conv1": "vision_224x224_c3_k64_3x3", "conv2": "vision_54x54",
                                   "conv3": "speaker_700x161_c1_k64_5x5_s2", "conv4": "x4", "conv5": "x5"})
    bars = cudnn_figures.deepbench_bars(db)
    assert set(bars["filter"]) == {"3x3", "5x5", "other"} and set(bars["how"]) == {"measured"}
    assert bars.drop_duplicates("layer").set_index("layer")["filter"].to_dict() == {
        "vision_224x224_c3_k64_3x3": "3x3", "vision_54x54": "other", "speaker_700x161_c1_k64_5x5_s2": "5x5",
        "x4": "other", "x5": "other"}
    g = db[(db["planner"] == "dp") & (db["layer"] == "x4") & (db["limit_mib"] == 64)]
    r = bars[(bars["layer"] == "x4") & (bars["limit_mib"] == 64)].iloc[0]
    assert r["speedup"] == pytest.approx(g["baseline_measured_time_s"].sum() / g["measured_time_s"].sum())
    assert r["divided"] == int(g["divided"].sum())


def test_the_figures_draw_on_the_record_and_say_why_they_are_empty(tmp_path, why):
    from hpcdl.platform import pyplot

    plt = pyplot()
    lim = pd.read_csv(RECORD / "cudnn_limits.csv")
    cudnn_figures.draw_kernels(plt, lim, tmp_path / "kernels.png")
    cudnn_figures.draw_why(plt, why[why["network"] == "alexnet"], tmp_path / "why.png")
    empty = pd.DataFrame()
    cudnn_figures.draw_kernels(plt, empty, tmp_path / "kernels_empty.png")
    cudnn_figures.draw_deepbench(plt, lim, tmp_path / "deepbench_none.png")
    cudnn_figures.draw_why(plt, empty, tmp_path / "why_empty.png")
    for name in ("kernels", "why", "kernels_empty", "deepbench_none", "why_empty"):
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name


# ------------------------------------------------------------------------ modes, screen, claims


def test_every_row_and_rollup_names_its_mode_and_bound():
    rows, configs = hand.planned("alexnet")
    assert {(r["planner"], r["mode"]) for r in rows} == {("dp", "WR"), ("ilp", "WD")}
    r = next(r for r in rows if r["planner"] == "ilp" and r["limit_mib"] == 8)
    assert r["budget_label"] == "32 MiB pooled over 4 kernel calls (WD)"  # 8 MiB x 4 kernel calls
    r = next(r for r in rows if r["planner"] == "dp" and r["limit_mib"] == 8)
    assert r["budget_label"] == "8 MiB per kernel (WR)"
    net = cudnn_plan.rollup(pd.DataFrame(hand.executed(rows, configs)))
    assert set(zip(net["planner"], net["mode"], strict=True)) == {("dp", "WR"), ("ilp", "WD")}
    assert "32 MiB pooled over 4 kernel calls (WD)" in set(net["budget_label"])
    old = pd.read_csv(RECORD / "cudnn_limits.csv")  # a record from before the column: derived
    labels = cudnn_plan.rollup(old).set_index(["network", "limit_mib", "planner"])["budget_label"]
    assert labels[("alexnet", 8.0, "ilp")] == "120 MiB pooled over 15 kernel calls (WD)"
    assert labels[("resnet18", 8.0, "ilp")] == "480 MiB pooled over 60 kernel calls (WD)"
    assert labels[("resnet18", 512.0, "dp")] == "512 MiB per kernel (WR)"


def test_an_engine_another_beats_at_no_more_workspace_is_dominated():
    cells = [("k1", 0, 1.0), ("k1", 0, 1.4), ("k1", 0, 1.6), ("k1", 10, 2.0), ("k1", 10, 0.5),
             ("k2", 0, 9.0), ("k1", 5, math.nan)]
    # 1.4 is within 1.5x of 1.0 (noise); 1.6 and 2.0 are not; 0.5 needs more workspace than 1.0's engine;
    # k2 is another kernel or micro-batch; a NaN time (a plan that failed) neither dominates nor is
    assert limits.dominated(cells, 1.5) == {2, 3}
    assert limits.dominated(cells, 3.0) == {3}  # 2.0 at 10 MiB vs 0.5 at 10 MiB
    assert limits.dominated(cells, 5.0) == set()
    with pytest.raises(ValueError, match="screen ratio must be > 1"):
        limits.dominated(cells, 1.0)


def test_the_screen_times_a_dominated_engine_once_and_the_others_every_round():
    from hpcdl.studies.microbatch.cudnn.bench import timed_rounds

    calls = {0: [], 1: [], 2: []}

    def sleeper(j, s):
        def fn(n):
            calls[j].append(n)
            time.sleep(s)
        return fn

    fns = [sleeper(0, 0.001), sleeper(1, 0.05), sleeper(2, 0.02)]
    groups = [("forward", 4), ("forward", 4), ("forward", 2)]  # plan 2 has no rival at its size
    times, walls = timed_rounds(fns, groups, [0, 0, 0], {}, 3, warmup=2, screen_ratio=1.5, device="cpu")
    assert [len(t) for t in times] == [3, 1, 3] and all(w > 0 for w in walls)
    assert calls[0] == [0, 1, 2, 3] and calls[1] == [0, 1]  # one warm-up (the probe was the first), rounds
    times, _ = timed_rounds(fns, groups, [0, 0, 0], {}, repeats=3, warmup=1, screen_ratio=None, device="cpu")
    assert [len(t) for t in times] == [3, 3, 3]
    failed = {0: "during timing: RuntimeError"}  # a failed plan dominates nothing
    times, _ = timed_rounds(fns, groups, [0, 0, 0], failed, 2, warmup=1, screen_ratio=1.5, device="cpu")
    assert [len(t) for t in times] == [1, 2, 2]


class FakeGraph:
    """A HAND-MADE stand-in for one cuDNN graph (cudnn.engines.KernelGraph) on the CPU: two plans,
    "fast" (no workspace) and "slow" (1 KiB), sleeping instead of convolving; "bad" at micro-batch 1
    raises on its first call. Only benchmark_layer's control flow is under test, no timing of cuDNN."""

    SLEEP = {"fast": 0.001, "slow": 0.03, "bad": 0.001}

    def __init__(self, kernel, size, calls):
        from hpcdl.studies.microbatch.cudnn.alignment import CUDNN_ALIGN, ROLES

        names = ["fast", "slow"] + (["bad"] if size == 1 else [])
        self.plans = {i: (n, 1024 * i) for i, n in enumerate(names)}
        self.refused, self.count = {}, len(names)
        self.alignment = {r: CUDNN_ALIGN for r in ROLES[kernel]}
        self.by_name = {n: i for i, (n, _) in self.plans.items()}
        self.kernel, self.size, self.calls = kernel, size, calls

    def workspace(self, index):
        import torch

        return torch.empty(max(self.plans[index][1], 1), dtype=torch.uint8)

    def run(self, index, inputs, out, workspace):
        name = self.plans[index][0]
        self.calls.append((self.kernel, self.size, name, workspace.numel()))
        if name == "bad":
            raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED")
        time.sleep(self.SLEEP[name])
        return name


def test_benchmark_layer_probes_once_measures_the_workspace_there_and_screens(monkeypatch):
    """benchmark_layer on the CPU with the graph faked: each plan's first call (at sample 0, with a
    workspace of its own) measures its workspace and is its warm-up; with the screen a dominated plan
    ("slow": 30x "fast" at more workspace) is timed in one round, the others in every round."""
    from hpcdl.studies.microbatch.choice import bench
    from hpcdl.studies.microbatch.choice.algorithms import KernelCall
    from hpcdl.studies.microbatch.common.workloads import ConvLayer
    from hpcdl.studies.microbatch.cudnn import bench as cudnn_bench

    calls = []
    monkeypatch.setattr(cudnn_bench, "graph_for", lambda call, kernel, b, tf32: FakeGraph(kernel, b, calls))
    monkeypatch.setattr(cudnn_bench, "cuda_peak_extra_bytes", lambda fn: (fn(), 4096)[1])
    monkeypatch.setattr(bench, "_sync", lambda device: None)
    call = KernelCall(ConvLayer("tiny", 4, 8, 6, 6, 3, 3, 1, 1, 1), 2, "cpu", seed=0)
    call.device = "cuda"  # what benchmark_layer asks of its call; the tensors stay on the CPU
    rows, graphs = cudnn_bench.benchmark_layer(call, [1, 2], repeats=3, warmup=1, max_workspace_bytes=2048,
                                               kernels=("forward",), screen_ratio=1.5)
    got = {(r["micro_batch"], r["engine"]): r for r in rows}
    assert set(graphs) == {("forward", 1), ("forward", 2)}
    for b in (1, 2):
        fast, slow = got[(b, "fast")], got[(b, "slow")]
        assert (fast["status"], fast["repeats"], slow["status"], slow["repeats"]) == ("ok", 3, "ok", 1)
        assert fast["measured_workspace_bytes"] == 4096 and fast["time_s"] <= fast["time_median_s"]
        # one probe call with its own workspace (both offsets of b = 1 share an address class), no
        # further warm-up (warmup 1 is that call), then the timed rounds at the shared workspace
        mine = [c for c in calls if c[1] == b and c[2] == "fast"]
        assert len(mine) == 1 + 3 and mine[0][3] == 1
    assert got[(1, "bad")]["status"] == "skipped"
    assert got[(1, "bad")]["reason"] == "at sample 0: RuntimeError: CUDNN_STATUS_EXECUTION_FAILED"
    calls.clear()
    rows, _ = cudnn_bench.benchmark_layer(call, [2], repeats=2, warmup=3, max_workspace_bytes=512,
                                          kernels=("forward",))
    got = {r["engine"]: r for r in rows}
    assert got["slow"]["status"] == "over_limit"  # 1 KiB > 512 bytes: never run
    assert not [c for c in calls if c[2] == "slow"]
    # warmup 3: the probe and 2 more untimed calls, then 2 rounds
    assert got["fast"]["repeats"] == 2 and len([c for c in calls if c[2] == "fast"]) == 1 + 2 + 2


def test_the_cudnn_claims_judge_mu_cudnns_own_networks(tmp_path):
    """DeepBench runs in μ-cuDNN's experiment alone (microbatch.cudnn.networks): its plans are judged,
    its failure is named, and the tight-limit claim stays AlexNet's and ResNet-18's."""
    d = tmp_path / "tables"
    d.mkdir()
    rows, configs = hand.planned("deepbench")
    lim = pd.DataFrame(hand.executed(rows, configs)).assign(device="cuda")
    lim.to_csv(d / "cudnn_limits.csv", index=False)
    cudnn_plan.rollup(lim).to_csv(d / "cudnn_networks.csv", index=False)
    pd.DataFrame([{"network": "alexnet", "table": "cudnn_limits", "error": "RuntimeError: out of memory"}]
                 ).to_csv(d / "failures.csv", index=False)
    block = {"networks": ["resnet18"], "device": "cuda",
             "cudnn": {"engines": True, "networks": ["alexnet", "deepbench"], "limits_mib": [8, 512]}}
    slower, tight = cudnn_claims.judge({"microbatch": block}, tmp_path)
    assert slower["measured"]["holds"]["deepbench dp 8 MiB [powerOfTwo]"] is True
    assert "alexnet's cuDNN run failed: RuntimeError: out of memory" in slower["reason"]
    assert "resnet18" not in str(slower["measured"])  # not in μ-cuDNN's experiment
    assert tight["status"] == "not_measured" and "alexnet" in tight["reason"]


# ------------------------------------------------------------------------------------------ CUDA


@pytest.mark.cuda
def test_the_screen_on_a_gpu_keeps_every_choosable_engine_fully_timed():
    from hpcdl.studies.microbatch.choice.algorithms import KernelCall
    from hpcdl.studies.microbatch.common.workloads import ConvLayer
    from hpcdl.studies.microbatch.cudnn.bench import benchmark_layer

    layer = ConvLayer("tiny", cin=16, cout=32, height=24, width=24, kh=3, kw=3, stride=1, pad_h=1, pad_w=1)
    call = KernelCall(layer, 8, "cuda", seed=0)
    rows, _ = benchmark_layer(call, [1, 2, 4, 8], repeats=3, warmup=1, max_workspace_bytes=512 * MiB,
                              screen_ratio=1.5)
    ok = pd.DataFrame([r for r in rows if r["status"] == "ok"])
    assert set(ok["repeats"]) <= {1, 3} and (ok["measured_workspace_bytes"] >= 0).all()
    for _, g in ok.groupby(["kernel", "micro_batch"]):
        front = g.sort_values(["workspace_bytes", "time_s"])
        best = front["time_s"].cummin()
        # an engine on the (workspace, time) front is never screened out
        on_front = front[front["time_s"] <= best]
        assert (on_front["repeats"] == 3).all(), on_front[["engine", "workspace_bytes", "time_s", "repeats"]]
    eng = cudnn_why.why_table(ok.assign(network="tiny", batch_size=8), [8, 512])
    assert set(eng["micro_batch"]) == {1, 2, 4, 8} and eng["cause"].notna().all()


@pytest.mark.cuda
def test_a_tiny_deepbench_of_training_layers_runs_end_to_end_on_cuda():
    from hpcdl.studies.microbatch.cudnn.study import run_network

    out = run_network("deepbench", batch_size=4, image_size=64, deepbench_scale=0.05,
                      policies=["undivided", "powerOfTwo"], repeats=2, warmup=1, exec_repeats=2,
                      limits_mib=[128, 256, 512], tf32=False, seed=0, deepbench_layers="training_3x3_5x5",
                      screen_ratio=1.5)
    lim = pd.DataFrame(out["cudnn_limits"])
    assert set(lim["limit_label"]) == {"default (64 MiB)", "128 MiB", "256 MiB", "512 MiB"}
    assert len(set(lim["layer"])) == 29 and set(lim["mode"]) == {"WR", "WD"}
    eng = tables.engine_rows(pd.DataFrame(out["cudnn_engines"]))
    why = cudnn_why.why_table(eng, {"deepbench": cudnn_plan.limit_settings([128, 256, 512])})
    assert set(why["layer"]) == set(lim["layer"]) and why["cause"].notna().all()
