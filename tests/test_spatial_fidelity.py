"""Spatial study fidelity: load from /proc and disturbed phases, robust calibration across rounds,
communication hiding (exact training, modelled overlap), the 3D U-Net and the papers' settings."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from hpcdl.common.layers import n_params, unet3d_spec
from hpcdl.platform.kit.rank_runtime.launch import run_ranks
from hpcdl.studies.spatial.data import ensure_dataset
from hpcdl.studies.spatial.load import PhaseLoad, other_load_cores
from hpcdl.studies.spatial.paper_scale.predictions import paper_predictions
from hpcdl.studies.spatial.perfmodel.fit import fit_machine
from hpcdl.studies.spatial.perfmodel.machine import Machine
from hpcdl.studies.spatial.perfmodel.oracle import Strategy, predict
from hpcdl.studies.spatial.tables import _summaries, calibration_rows, phase_loads, repeat_times


def test_other_load_of_a_busy_process_outside_the_run_is_seen_in_proc_stat():
    # a real process spinning on one core while this one (the "run") sleeps
    code = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"
    spin = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.2)
        probe = PhaseLoad()
        probe.start()
        time.sleep(1.0)
        got = probe.stop()
    finally:
        spin.wait()
    load = other_load_cores(got["machine_busy_s"], got["steal_s"], got["own_cpu_s"], got["wall_s"])
    assert got["own_cpu_s"] < 0.05 and load >= 0.7  # at least the spinner's core (others may add)


def _iters(run, repeat, total_s, busy_s, ranks=2):
    return [{"run": run, "repeat": repeat, "rank": r, "iteration": i, "loss": 1.0, "io_s": 0.0, "halo_s": 0.0,
             "gather_s": 0.0, "allreduce_s": 0.0, "compute_s": total_s, "total_s": total_s,
             "cpu_s": total_s, "machine_busy_s": busy_s if r == 0 else 0.0, "steal_s": 0.0}
            for i in range(6) for r in range(ranks)]


def test_disturbed_phase_is_left_out_and_reported():
    # repeat 0: 1 core of other load on top of the run's 2 ranks; repeat 1: a quarter core, under the bar
    iters = pd.DataFrame(_iters("strong-d1x2x1", 0, 0.03, 0.09) + _iters("strong-d1x2x1", 1, 0.02, 0.045))
    ph = phase_loads(iters, threshold=0.3).set_index("repeat")
    assert ph.loc[0, "other_load_cores"] == pytest.approx(1.0) and ph.loc[0, "disturbed"]
    assert ph.loc[1, "other_load_cores"] == pytest.approx(0.25) and not ph.loc[1, "disturbed"]
    runs = pd.DataFrame([{"run": "strong-d1x2x1", "kind": "strong", "status": "ok", "batch_size": 4,
                          "repeat": r, "launch_wall_s": 1.0} for r in (0, 1)])
    ranks = pd.DataFrame([{"run": "strong-d1x2x1", "peak_delta_mb": 1.0, "peak_rss_mb": 2.0}])
    row = _summaries(runs, iters, ranks, warmup=1, statistic="median", threshold=0.3).iloc[0]
    assert row["time_per_iter_s"] == pytest.approx(0.02)  # only the clean repeat
    assert row["phases"] == 2 and row["phases_disturbed"] == 1 and not row["disturbed"]
    # every phase disturbed: the least loaded one is kept, and the run is flagged
    all_bad = _summaries(runs, iters, ranks, warmup=1, statistic="median", threshold=0.01).iloc[0]
    assert all_bad["disturbed"] and all_bad["time_per_iter_s"] == pytest.approx(0.02)


def test_repeat_times_give_each_kept_repeat_its_own_time():
    """The oracle claim's run-to-run spread: one time per undisturbed repeat, by the run's own statistic."""
    iters = pd.DataFrame(_iters("weak-d1x2x1", 0, 0.03, 0.09) + _iters("weak-d1x2x1", 1, 0.02, 0.045)
                         + _iters("weak-d1x2x1", 2, 0.025, 0.05))
    slow = iters["iteration"] == 5
    iters.loc[slow, "total_s"] *= 3  # one slow iteration per repeat: the fastest quarter leaves it out
    runs = pd.DataFrame([{"run": "weak-d1x2x1", "status": "ok", "repeat": r} for r in range(3)])
    got = repeat_times(runs, iters, warmup=1, statistic="best_quartile", threshold=0.3).set_index("repeat")
    assert list(got.index) == [1, 2]  # repeat 0 ran under a core of other load: left out
    assert got["time_per_iter_s"].tolist() == pytest.approx([0.02, 0.025])
    assert (got["iterations_timed"] == 5).all()
    assert (got["other_load_cores"] < 0.3).all()  # the kept phases are under the bar
    med = repeat_times(runs, iters, warmup=1, statistic="median", threshold=0.3)
    assert med["time_per_iter_s"].tolist() == pytest.approx([0.02, 0.025])
    mean_of_5 = repeat_times(runs[runs["repeat"] == 1], iters[iters["repeat"] == 1], warmup=1,
                             statistic="min", threshold=0.3)
    assert mean_of_5["time_per_iter_s"].tolist() == pytest.approx([0.02])


def test_every_run_the_train_run_included_is_repeated_round_robin():
    """The train run is a held-out run of the oracle claim: it is repeated with the others (each round
    runs every run once), so its error has an interval like theirs."""
    import yaml

    from hpcdl.platform.kit.config import validate_config
    from hpcdl.studies.spatial.sweep import expand

    block = validate_config(yaml.safe_load(open("configs/default.yaml")))["spatial"]
    points = expand({**block, "repeats": 3, "held_out_repeats": None, "efficiency_repeats": None})
    names = list(dict.fromkeys(p["run"] for p in points))
    assert "train-d1x2x1" in names
    assert [(p["run"], p["repeat"]) for p in points] == [(n, r) for r in range(3) for n in names]


def test_held_out_runs_alone_get_the_extra_repeats_after_the_whole_rounds():
    import yaml

    from hpcdl.platform.kit.config import validate_config
    from hpcdl.studies.spatial.sweep import expand

    block = validate_config(yaml.safe_load(open("configs/default.yaml")))["spatial"]
    held = ["weak-d1x1x1", "train-d1x2x1"]
    points = expand({**block, "repeats": 2, "held_out_repeats": 4, "efficiency_repeats": None,
                     "held_out": held})
    names = list(dict.fromkeys(p["run"] for p in points))
    assert [(p["run"], p["repeat"]) for p in points] == (
        [(n, r) for r in range(2) for n in names] + [(n, r) for r in (2, 3) for n in names if n in held])
    # no more than `repeats` where held_out_repeats is smaller: it only ever adds
    fewer = expand({**block, "repeats": 2, "held_out_repeats": 1, "efficiency_repeats": None,
                    "held_out": held})
    assert [(p["run"], p["repeat"]) for p in fewer] == [(n, r) for r in range(2) for n in names]


def test_efficiency_pairs_alone_get_their_extra_repeats_in_the_same_rounds_as_the_held_out_runs():
    import yaml

    from hpcdl.platform.kit.config import validate_config
    from hpcdl.studies.spatial.sweep import expand, launches

    block = validate_config(yaml.safe_load(open("configs/default.yaml")))["spatial"]
    held = ["weak-d1x1x1"]
    points = expand({**block, "repeats": 2, "held_out_repeats": 3, "efficiency_repeats": 4, "held_out": held})
    names = list(dict.fromkeys(p["run"] for p in points))
    pair = ["strong-d1x2x1", "ceiling-d1x2x1"]
    assert [(p["run"], p["repeat"]) for p in points] == (
        [(n, r) for r in range(2) for n in names]
        + [(n, 2) for n in names if n in held or n in pair]
        + [(n, 3) for n in names if n in pair])
    # the 1-rank strong run is not part of a pair (its time cancels in ceiling time / 2-rank time)
    assert max(p["repeat"] for p in points if p["run"] == "strong-d1x1x1") == 1
    # #59: each ceiling is measured inside its strong run's launch, in every round, so the pair shares
    # the host's state of the moment step by step; its own point is not launched
    order = [(p["run"], p["repeat"]) for p in points]
    for r in range(4):
        assert order.index(("ceiling-d1x2x1", r)) == order.index(("strong-d1x2x1", r)) + 1
    launched = launches(points)
    assert not [p for p in launched if p["kind"] == "ceiling"]
    assert {(p["run"], p["repeat"], p.get("paired_ceiling")) for p in launched if p["ranks"] == 2
            and p["kind"] == "strong"} == {("strong-d1x2x1", r, "ceiling-d1x2x1") for r in range(4)}
    assert all(p["paired_with"] == "strong-d1x2x1" for p in points if p["kind"] == "ceiling")
    assert "paired_ceiling" not in next(p for p in points if p["run"] == "strong-d1x1x1")


def test_calibration_rounds_combine_by_their_mean_unless_the_fastest_is_asked():
    cal = pd.DataFrame([
        {"kind": "conv", "key": "c", "units": 1e6, "fraction": 1.0, "concurrent": 1, "round": 0,
         "time_s": 1.0e-3, "other_cpu_s": 1.2, "section_s": 1.0},  # fastest, but under load: not trusted
        {"kind": "conv", "key": "c", "units": 1e6, "fraction": 1.0, "concurrent": 1, "round": 1,
         "time_s": 2.0e-3, "other_cpu_s": 0.0, "section_s": 1.0},
        {"kind": "conv", "key": "c", "units": 1e6, "fraction": 1.0, "concurrent": 1, "round": 2,
         "time_s": 1.5e-3, "other_cpu_s": 0.1, "section_s": 1.0},
        {"kind": "pingpong", "size_bytes": 1024, "round": 0, "time_s": 5e-5, "other_cpu_s": 0.9,
         "section_s": 1.0},
        {"kind": "pingpong", "size_bytes": 1024, "round": 1, "time_s": 9e-5, "other_cpu_s": 0.8,
         "section_s": 1.0},
    ])
    rows, ev = calibration_rows(cal, threshold=0.3)  # the default: the mean of the clean rounds
    by = {r["kind"]: r for r in rows}
    assert len(rows) == 2 and by["conv"]["time_s"] == pytest.approx(1.75e-3, rel=1e-12)
    assert by["pingpong"]["time_s"] == pytest.approx(7e-5, rel=1e-12)  # every round disturbed: all of them
    assert ev["rounds"] == 3 and ev["sections_disturbed"] == 3
    rows, _ = calibration_rows(cal, threshold=0.3, statistic="fastest")  # the oracle before #40
    by = {r["kind"]: r for r in rows}
    assert by["conv"]["time_s"] == 1.5e-3 and by["pingpong"]["time_s"] == 5e-5
    with pytest.raises(ValueError, match="round_statistic must be mean or fastest, got 'median'"):
        calibration_rows(cal, threshold=0.3, statistic="median")


def test_unet3d_matches_cicek_2016():
    spec = unet3d_spec((3, 64, 64, 64), [64, 128, 256, 512], outputs=3)
    convs = [L for L in spec if L["kind"] == "conv"]
    assert [L["cout"] for L in convs] == [32, 64, 64, 128, 128, 256, 256, 512, 256, 256, 128, 128, 64, 64, 3]
    assert [L["in"][0] for L in spec if L["kind"] == "conv" and L["name"].endswith("a") and
            L["name"].startswith("dec")] == [768, 384, 192]  # up-conv output + skip connection
    assert [L["kind"] for L in spec].count("deconv") == 3 and spec[-1]["out"] == (3, 64, 64, 64)
    # the paper's 19,069,955 parameters within 0.01 % (batch norm is left out of the spec)
    assert sum(n_params(L) for L in spec) == pytest.approx(19_069_955, rel=1e-4)


def _machine(overlap):
    rows = [{"kind": "pingpong", "size_bytes": s, "time_s": 3e-5 + s * 1e-9} for s in (1e3, 1e5, 1e6)]
    rows += [{"kind": k, "units": u, "time_s": 1e-4 + u * 1e-10} for k in ("conv", "pool", "dense")
             for u in (1e6, 1e8)]
    rows += [{"kind": "optimizer", "units": u, "time_s": u * 1e-8} for u in (1e3, 1e5)]
    rows += [{"kind": "io", "units": u, "batch": 4, "time_s": 1e-4 + u * 1e-9} for u in (1e5, 1e6)]
    return fit_machine(rows, cores=2, overlap=overlap)[0]


def test_overlap_hides_halo_behind_interior_and_allreduce_behind_backward():
    from hpcdl.common.layers import build_spec

    spec = build_spec((64, 64, 64), {"channels": [8, 16], "dense": [16]})
    blocking = predict(spec, 4, Strategy(depth=2), _machine(False))
    hidden = predict(spec, 4, Strategy(depth=2), _machine(True))
    assert hidden["compute_s"] == pytest.approx(blocking["compute_s"])
    assert 0 <= hidden["halo_s"] < 0.5 * blocking["halo_s"]
    assert 0 < hidden["allreduce_s"] <= blocking["allreduce_s"]
    assert hidden["total_s"] < blocking["total_s"]


def test_fat_tree_taper_beyond_a_rack():
    m = Machine.from_description({"peak_tflops": 15.7, "memory_gb": 16, "memory_gbs": 900, "intra_gbs": 50,
                                  "inter_gbs": 25, "alpha_intra_s": 5e-6, "alpha_inter_s": 1e-6,
                                  "gpus_per_node": 4, "io_gbs": 0.8, "rack_nodes": 34,
                                  "rack_oversubscription": 3.0})
    assert m.link(4)[1] == pytest.approx(1 / 50e9)                 # inside a node: NVLink
    # 4 GPUs of a node share its 2 x EDR (25 GB/s); one rack (34 nodes) has full bisection
    assert m.link(32 * 4)[1] == pytest.approx(4 / 25e9)
    assert m.link(32, stride=4)[1] == pytest.approx(1 / 25e9)     # one GPU per node: the node's whole NIC
    assert m.link(64 * 4)[1] == pytest.approx(12 / 25e9)           # 64 nodes span racks: 1:3 uplinks


def test_paper_predictions_at_exactly_the_papers_settings(test_config):
    from hpcdl.platform.kit.config import validate_config

    block = validate_config(test_config)["spatial"]
    rows = pd.DataFrame(paper_predictions(block))
    got = list(zip(rows["network"], rows["gpus"], rows["batch_size"], rows["spatial_split"], strict=True))
    assert got == [
        ("cosmoflow", 512, 64, 8), ("cosmoflow", 1024, 64, 16), ("cosmoflow", 2048, 64, 32),
        ("unet3d", 256, 16, 16), ("unet3d", 512, 16, 32)]
    assert (rows["data"] == rows["batch_size"]).all()
    assert (rows["depth"] * rows["height"] == rows["spatial_split"]).all()
    assert rows["time_per_iter_s"].gt(0).all() and rows["fits_in_memory"].all()
    for _, g in rows.groupby("network"):
        # the input read from storage every step (the pipeline's file bound) shrinks with the depth split
        s = g["speedup_vs_first_io_file"].to_numpy()
        assert s[0] == 1 and np.all(np.diff(s) > 0) and np.all(s <= g["ideal_speedup_vs_first"].to_numpy())
        assert np.all(g["speedup_vs_first"].to_numpy() <= g["ideal_speedup_vs_first"].to_numpy())
    assert rows["chosen_strategy"].str.len().gt(0).all()
    # the compute term: measured per-layer times where a GPU calibration is committed, else the assumption
    assert set(rows["compute_basis"]) <= {"assumed", "mapped"}
    assumed = rows["compute_basis"] == "assumed"
    assert (rows.loc[assumed, "basis"] == "model (oracle), not measured").all()


def test_hidden_communication_trains_exactly_like_blocking(tmp_path):
    # overlapped halo + bucketed all-reduce during the backward vs every exchange blocking: float64, 2 ranks
    data = ensure_dataset(tmp_path, (16, 8, 8), 8, 0, (0.5, 2.0), (-3.0, -1.0))
    kw = dict(data_dir=str(data), n_data=1, grid=(2, 1), model={"channels": [3, 4], "dense": [8]},
              batch_size=2, iterations=3, lr=1e-2, seed=0, dtype="float64", bucket_kb=0.5)
    hidden = run_ranks("hpcdl.studies.spatial.train:train_run", 2, {**kw, "overlap": True}, timeout_s=180)
    blocking = run_ranks("hpcdl.studies.spatial.train:train_run", 2, {**kw, "overlap": False}, timeout_s=180)
    for h, b in zip(hidden, blocking, strict=True):
        np.testing.assert_allclose([r["loss"] for r in h["records"]], [r["loss"] for r in b["records"]],
                                   rtol=1e-12)


def test_a_paired_ceiling_trains_each_model_as_its_own_launch_would(tmp_path):
    # #59: the ceiling measured inside the 2-rank launch, step by step, computes what it computes alone,
    # and so does the spatial run beside it: float64 losses equal those of two separate launches
    data = ensure_dataset(tmp_path, (16, 8, 8), 8, 0, (0.5, 2.0), (-3.0, -1.0))
    kw = dict(data_dir=str(data), n_data=1, grid=(2, 1), model={"channels": [3, 4], "dense": [8]},
              batch_size=2, iterations=5, lr=1e-2, seed=0, dtype="float64")
    paired = run_ranks("hpcdl.studies.spatial.train:train_run", 2,
                       {**kw, "paired_ceiling": True, "alone_steps": 2}, timeout_s=180)
    strong = run_ranks("hpcdl.studies.spatial.train:train_run", 2, kw, timeout_s=180)
    ceiling = run_ranks("hpcdl.studies.spatial.train:train_run", 2, {**kw, "communicate": False},
                        timeout_s=180)
    for p, s, c in zip(paired, strong, ceiling, strict=True):
        assert [r["iteration"] for r in p["ceiling_records"]] == list(range(5))
        np.testing.assert_allclose([r["loss"] for r in p["records"]], [r["loss"] for r in s["records"]],
                                   rtol=1e-12)
        np.testing.assert_allclose([r["loss"] for r in p["ceiling_records"]],
                                   [r["loss"] for r in c["records"]], rtol=1e-12)
        assert all(r["halo_s"] == 0 and r["allreduce_s"] == 0 for r in p["ceiling_records"])
        assert "ceiling_records" not in s
        assert p["ceiling_peak_rss_mb"] >= p["peak_rss_mb"]


def test_a_ceiling_point_is_not_launched_on_its_own(tmp_path):
    from hpcdl.studies.spatial.compute import run_point

    point = {"run": "ceiling-d1x2x1", "kind": "ceiling", "paired_with": "strong-d1x2x1", "repeat": 0}
    with pytest.raises(ValueError, match="ceiling-d1x2x1 is measured in strong-d1x2x1's launch"):
        run_point(point, {}, str(tmp_path))


def test_a_paired_ceiling_needs_a_communicating_spatial_run(tmp_path):
    data = ensure_dataset(tmp_path, (16, 8, 8), 8, 0, (0.5, 2.0), (-3.0, -1.0))
    kw = dict(data_dir=str(data), n_data=1, grid=(2, 1), model={"channels": [3, 4], "dense": [8]},
              batch_size=2, iterations=2, lr=1e-2, seed=0, communicate=False, paired_ceiling=True)
    with pytest.raises(Exception, match="a paired ceiling belongs to a communicating spatial-only run"):
        run_ranks("hpcdl.studies.spatial.train:train_run", 2, kw, timeout_s=120)
