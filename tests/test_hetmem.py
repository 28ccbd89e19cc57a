"""hetmem: real lackey traces of the kernels, the simulated reference, the differential estimator,
the placement environment and policies, and every bad-input / fault case of the issue."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.studies.hetmem import agent, reference
from hpcdl.studies.hetmem.compute import build_estimator, run_app
from hpcdl.studies.hetmem.estimator import DifferentialEstimator, sample_misses
from hpcdl.studies.hetmem.layout import PAGE, Layout, PlacementError
from hpcdl.studies.hetmem.trace import (
    KIND_LOAD,
    KIND_STORE,
    UNTRACED_RUNS,
    Obj,
    ToolMissing,
    Trace,
    TraceError,
    compact,
    compile_kernels,
    run_traced,
    trace_app,
)

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("cc") is None,
    reason="needs valgrind and a C compiler (make tools)",
)
N_STREAM = 512


@pytest.fixture(scope="module")
def block():
    return validate_config(yaml.safe_load((REPO / "configs" / "test.yaml").read_text()))["hetmem"]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """A real lackey trace of STREAM triad on 512 doubles, its raw text kept for the fault tests."""
    work = tmp_path_factory.mktemp("stream")
    trace, info = trace_app("stream", N_STREAM, 1, work, keep_raw=True)
    return trace, info, work


@pytest.fixture(scope="module")
def raw_stream(tmp_path_factory):
    """(raw lackey trace, objects, marker address) of one traced STREAM run."""
    work = tmp_path_factory.mktemp("raw")
    binary = compile_kernels(work / "bin")
    objs, marker, _ = run_traced(binary, "stream", N_STREAM, 1, work / "stream.lackey")
    return work / "stream.lackey", objs, marker


def test_lackey_trace_holds_exactly_the_triads_accesses(stream):
    trace, info, work = stream
    assert [o.name for o in trace.objects] == ["a", "b", "c"]
    # a[i] = b[i] + s*c[i], scalar code: per element one load of b, one of c, one store of a;
    # plus the load of a[n/2] the kernel reads for its checksum before the end marker
    assert len(trace.addr) == 3 * N_STREAM + 1 == info["accesses"]
    layout = Layout(trace.objects)
    obj = np.searchsorted(np.array([o.base for o in layout.objects]), trace.addr, side="right") - 1
    names = np.array(layout.names)[obj]
    assert (trace.kind[:-1][names[:-1] == "a"] == KIND_STORE).all() and (names == "a").sum() == N_STREAM + 1
    assert (trace.kind[names != "a"] == KIND_LOAD).all() and trace.kind[-1] == KIND_LOAD
    assert trace.addr[-1] == layout.objects[0].base + 8 * (N_STREAM // 2)
    a = trace.addr[:-1][names[:-1] == "a"]
    assert (np.diff(a) == 8).all()  # the store stream walks a in order
    assert np.all(np.diff(trace.icount) >= 0) and trace.instructions > 3 * N_STREAM
    assert info["traced_compute_s"] > info["untraced_compute_s"] > 0
    # the kernel's own compute phase, the median of its untraced runs, is a part of the process's time
    assert info["untraced_runs"] == UNTRACED_RUNS and info["untraced_wall_s"] > info["untraced_compute_s"]
    again = Trace.load(work / "stream.npz")
    assert np.array_equal(again.addr, trace.addr) and again.instructions == trace.instructions


def test_the_raw_trace_parses_to_the_same_accesses(stream, raw_stream, tmp_path):
    raw, objs, marker = raw_stream
    again = compact(raw, "stream", objs, marker, tmp_path / "s.npz")
    assert len(again.addr) == len(stream[0].addr) and again.instructions == stream[0].instructions


def test_truncated_trace_is_an_error_naming_file_and_offset_and_writes_nothing(raw_stream, tmp_path):
    raw, objs, marker = raw_stream
    text = raw.read_bytes()
    bad = tmp_path / "cut.lackey"
    out = tmp_path / "stream.npz"
    # cut in the middle of a line
    cut = len(text) // 2
    while text[cut - 1 : cut] == b"\n":
        cut += 1
    bad.write_bytes(text[:cut])
    line_start = text.rfind(b"\n", 0, cut) + 1
    with pytest.raises(TraceError) as err:
        compact(bad, "stream", objs, marker, out)
    assert err.value.path == str(bad) and err.value.offset == line_start
    assert str(bad) in str(err.value) and f"offset {line_start}" in str(err.value)
    assert not out.exists()
    # cut at a line boundary inside the compute phase: the end is missing
    cut = text.index(b"\n", len(text) // 2) + 1
    bad.write_bytes(text[:cut])
    with pytest.raises(TraceError, match="truncated") as err:
        compact(bad, "stream", objs, marker, out)
    assert err.value.offset == cut and "truncated" in str(err.value)
    assert not out.exists()


def test_corrupt_trace_line_is_an_error_at_its_offset(raw_stream, tmp_path):
    raw, objs, marker = raw_stream
    text = raw.read_bytes()
    at = text.index(b"\n", len(text) // 3) + 1
    bad = tmp_path / "corrupt.lackey"
    bad.write_bytes(text[:at] + b" L zz12,8\n" + text[at:])
    with pytest.raises(TraceError, match=f"corrupt.*offset {at}$"):
        compact(bad, "stream", objs, marker, tmp_path / "x.npz")
    bad.write_bytes(text[:at] + b"garbage\n" + text[at:])
    with pytest.raises(TraceError, match=f"offset {at}$"):
        compact(bad, "stream", objs, marker, tmp_path / "x.npz")
    assert not (tmp_path / "x.npz").exists()


def test_missing_tracer_says_how_to_get_it(tmp_path, monkeypatch):
    binary = compile_kernels(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ToolMissing, match=r"valgrind.*not found.*make tools.*apt-get install valgrind"):
        run_traced(binary, "stream", 64, 1, tmp_path / "t.lackey")
    assert not (tmp_path / "t.lackey").exists()


def test_missing_compiler_says_how_to_get_it(tmp_path):
    with pytest.raises(ToolMissing, match=r"C compiler 'no-such-cc' not found.*make tools"):
        compile_kernels(tmp_path, cc="no-such-cc")


# ------------------------------------------------------------------------------------ placements
OBJS = [Obj("x", 0x10000, 3 * PAGE), Obj("y", 0x20000, 2 * PAGE)]


def test_placement_by_object_and_by_address_range():
    lay = Layout(OBJS)
    assert lay.n_pages == 5
    assert lay.mask(fast_objects=["y"]).tolist() == [False, False, False, True, True]
    # a range covering the second page of x and the first bytes of y's first page
    m = lay.mask(fast_ranges=[(0x10000 + PAGE + 8, 0x10000 + 2 * PAGE)])
    assert m.tolist() == [False, True, False, False, False]
    assert [r.label for r in lay.ranges(2)] == ["x[0:2]", "x[2:3]", "y[0:2]"]


def test_unknown_object_and_range_outside_every_object_are_clear_errors():
    lay = Layout(OBJS)
    with pytest.raises(PlacementError, match=r"unknown object 'z'.*x, y"):
        lay.mask(fast_objects=["z"])
    with pytest.raises(PlacementError, match=r"outside every object.*x=\[0x10000"):
        lay.mask(fast_ranges=[(0x30000, 0x31000)])
    with pytest.raises(PlacementError, match="empty"):
        lay.mask(fast_ranges=[(0x10010, 0x10000)])


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_capacity_outside_zero_and_the_footprint_is_a_config_error(bad):
    cfg = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())
    cfg["hetmem"]["agent"]["capacities"] = [0.5, bad]
    with pytest.raises(ConfigError, match=r"hetmem\.agent\.capacities\[1\]"):
        validate_config(cfg)


def test_cache_size_that_gives_no_power_of_two_sets_is_a_config_error():
    cfg = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())
    cfg["hetmem"]["caches"][0]["size_kib"] = 3
    with pytest.raises(ConfigError, match=r"hetmem\.caches\[0\]\.size_kib"):
        validate_config(cfg)


# ------------------------------------------------------------------------- reference and estimator
def test_cache_simulation_misses_every_line_of_a_stream_larger_than_the_caches(stream, block):
    trace, _, _ = stream
    served = reference.simulate_caches(trace, block["caches"], 64)
    # 3 arrays x 512 doubles = 192 lines, each touched once in order; the 2 KiB LLC holds 32 lines
    assert int((served[:-1] == len(block["caches"])).sum()) == 3 * N_STREAM * 8 // 64
    assert int((served[:-1] == 0).sum()) == 3 * N_STREAM - 192  # the other 7 of 8 doubles per line hit L1


def test_estimator_formula_on_hand_made_samples():
    counts = np.array([[3.0, 1.0], [0.0, 0.0], [0.0, 2.0]])
    est = DifferentialEstimator(counts, t_fast=np.array([1.0, 1.0, 1.0]), t_slow=np.array([3.0, 2.0, 5.0]))
    mask = np.array([True, False])
    # window 0: 3/4 fast; window 1: no samples -> the whole run's share 3/6; window 2: 0 fast
    assert est.estimate_one(mask) == pytest.approx((0.75 + 0.25 * 3) + (0.5 + 0.5 * 2) + 5.0)
    assert est.estimate_one(np.array([True, True])) == pytest.approx(3.0)
    assert est.estimate_one(np.array([False, False])) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="covers 3 pages"):
        est.estimate(np.ones(3, bool))


def test_sampling_keeps_one_in_n_misses():
    rng = np.random.default_rng(0)
    win, page = np.repeat(np.arange(10), 100), np.tile(np.arange(4), 250)
    c = sample_misses(win, page, 10, 4, 10, rng)
    assert c.sum() == 100 and (c.sum(axis=1) == 10).all()


def test_estimate_matches_the_simulated_reference_on_a_real_cg_trace(tmp_path, block):
    trace, _ = trace_app("cg", 16, 2, tmp_path)
    lay = Layout(trace.objects)
    prof = reference.simulate(trace, lay, block)
    model = reference.TimingModel.from_config(block)
    masks = np.stack(
        [np.ones(lay.n_pages, bool), np.zeros(lay.n_pages, bool)]
        + [lay.mask(fast_objects=[n]) for n in lay.names]
    )
    win = reference.window_times(prof, model, masks[:2])
    ref, ref_s = reference.reference_runs(prof, model, masks)
    est = build_estimator(prof, win[0], win[1], 1, 0)
    got = est.estimate(masks)
    assert got[:2] == pytest.approx(ref[:2], rel=1e-12)  # the two measured runs, exactly
    assert ref[0] < ref[1]  # fast memory is faster
    err = np.abs(got / ref - 1)[2:]  # each object alone in fast memory
    assert err.mean() < 0.05 and err.max() < 0.2
    assert ref_s >= prof.cache_sim_s > 0


# ------------------------------------------------------------------------------ agent and policies
def _small_problem():
    lay = Layout([Obj("hot", 0x10000, 2 * PAGE), Obj("cold", 0x20000, 2 * PAGE)])
    counts = np.array([[10.0, 10.0, 1.0, 1.0], [10.0, 10.0, 1.0, 1.0]])
    est = DifferentialEstimator(counts, np.array([1.0, 1.0]), np.array([2.0, 2.0]))
    return lay, lay.ranges(1), est


def test_greedy_takes_the_densest_ranges_that_fit():
    lay, ranges, est = _small_problem()
    chosen = agent.greedy(lay, ranges, est, capacity_pages=2)
    assert [r.label for r, c in zip(ranges, chosen, strict=True) if c] == ["hot[0:1]", "hot[1:2]"]
    rnd = agent.random_policy(ranges, 3, np.random.default_rng(1))
    assert rnd.sum() == 3


def test_placement_env_rewards_runtime_saved_and_refuses_moves_over_capacity():
    from gymnasium.utils.env_checker import check_env

    lay, ranges, est = _small_problem()
    env = agent.make_env(
        lay, ranges, est, capacities=[0.25], bins=2, migration_cost=0.1, invalid_penalty=0.5, max_steps=10
    )
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    before = env.runtime
    _, reward, done, _, _ = env.step(0)  # hot[0:1] to fast: one page of four
    assert not done
    saved = (before - env.runtime) / (4.0 - 2.0)
    assert saved > 0 and reward == pytest.approx(saved - 0.1 * 0.25)
    _, reward, _, _, _ = env.step(1)  # a second page exceeds capacity 0.25: refused
    assert reward == -0.5 and env.chosen.tolist() == [True, False, False, False]
    _, reward, done, _, _ = env.step(len(ranges))
    assert done and reward == 0.0


def test_one_app_end_to_end_gives_rows_for_every_placement_and_policy(tmp_path, block):
    out = run_app("gups", 10, 1, block, str(tmp_path), 0)
    val, pol = out["validation"], out["policies"]
    n_place = 2 + 2 + len(block["validation"]["fractions"]) * block["validation"]["repeats"]  # table, ran
    assert len(val) == n_place * len({block["sample_every"], *block["sample_sweep"]})
    assert all(r["reference"] == "simulated" for r in val + pol)
    assert {r["policy"] for r in pol} == {"greedy", "random", "ppo"}
    for r in pol:
        assert r["fast_fraction"] <= r["capacity"] + 1e-12
        assert (
            r["all_fast_runtime_s"] <= r["ref_runtime_s"] * (1 + 1e-9) <= r["all_slow_runtime_s"] * (1 + 1e-9)
        )
    assert out["trace"]["objects"] == 2 and (tmp_path / "gups.npz").exists()


def test_speed_table_compares_one_estimate_with_the_apps_native_run():
    import pandas as pd

    from hpcdl.studies.hetmem.tables import SPEED_COLUMNS, speed_table

    val = pd.DataFrame([{"app": "stream", "sample_every": n, "estimate_s": e, "reference_s": 0.4}
                        for n, e in ((1, 9.0), (10, 1e-5))])
    traces = pd.DataFrame([
        {"app": "stream", "status": "ok", "untraced_wall_s": 2e-3, "untraced_compute_s": 5e-5},
        {"app": "gups", "status": "failed", "untraced_wall_s": np.nan, "untraced_compute_s": np.nan},
    ])
    row = speed_table(val, 10, traces).set_index("app").loc["stream"]
    assert row["native_run_s"] == 2e-3 and row["reference"] == "native run"
    assert row["speedup"] == pytest.approx(200) and row["speedup_compute"] == pytest.approx(5)
    assert row["startup_share"] == pytest.approx(0.975)  # the process is mostly start-up
    assert row["speedup_vs_simulated"] == pytest.approx(4e4)
    assert list(speed_table(val.iloc[0:0], 10, traces).columns) == SPEED_COLUMNS
