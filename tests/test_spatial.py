"""Spatial study, single process: partition plans, bad input, GRF cache, config checks, the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from hpcdl.common.layers import build_spec, layer_key, n_params, padding_for
from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.studies.spatial.calibration.compute_timings import compute_timings
from hpcdl.studies.spatial.data import SlabReader, ensure_dataset, grf
from hpcdl.studies.spatial.partition import plan_axis, split_sizes
from hpcdl.studies.spatial.perfmodel.fit import fit_layer, fit_line, fit_machine
from hpcdl.studies.spatial.perfmodel.machine import Machine
from hpcdl.studies.spatial.perfmodel.oracle import Strategy, fresh_bytes, predict, t_allreduce

# ---- partition plans ------------------------------------------------------------------------

@pytest.mark.parametrize("n,parts", [(16, 2), (13, 4), (7, 7), (30, 4)])
@pytest.mark.parametrize("kernel,stride,pad", [(1, 1, "same"), (3, 1, "same"), (5, 1, "same"), (3, 2, "same"),
                                               (3, 1, "valid"), (5, 2, "valid"), (2, 2, "valid")])
def test_plan_matches_brute_force(n, parts, kernel, stride, pad):
    p = padding_for(kernel, pad) if pad == "same" and kernel % 2 else 0
    try:
        plan = plan_axis(split_sizes(n, parts), kernel, stride, p)
    except ValueError as exc:
        assert "halo" in str(exc) or "thinner" in str(exc)
        return
    n_out = (n + 2 * p - kernel) // stride + 1
    assert sum(plan.out_sizes) == n_out
    first = 0
    for r, size in enumerate(plan.out_sizes):
        # rank r's window is exactly the union of its outputs' receptive fields
        assert plan.need_lo[r] == first * stride - p
        assert plan.need_hi[r] == (first + size - 1) * stride - p + kernel
        ex = plan.exchange(r)
        lo, hi = ex["keep"]
        assert ex["zeros_l"] + ex["recv_l"] + (hi - lo) + ex["recv_r"] + ex["zeros_r"] == \
            plan.need_hi[r] - plan.need_lo[r]
        first += size
    # what each rank sends is what its neighbour receives
    for r in range(parts - 1):
        assert plan.exchange(r)["send_r"] == plan.exchange(r + 1)["recv_l"]
        assert plan.exchange(r + 1)["send_l"] == plan.exchange(r)["recv_r"]


def test_uneven_split_sizes():
    assert split_sizes(13, 4) == (4, 3, 3, 3)
    assert split_sizes(8, 8) == (1,) * 8


def test_more_ranks_than_planes():
    with pytest.raises(ValueError, match="more ranks than depth planes"):
        split_sizes(4, 8)


def test_not_divisible_when_uneven_disabled():
    with pytest.raises(ValueError, match="not divisible by 4 ranks"):
        split_sizes(30, 4, allow_uneven=False)


def test_halo_larger_than_slab():
    # kernel 5 needs 2 planes from each neighbour; slabs of 1 plane cannot provide them
    with pytest.raises(ValueError, match="halo larger than slab"):
        plan_axis(split_sizes(4, 4), 5, 1, 2, "conv0 (depth)")


def test_split_thinner_than_halo_yields_no_output():
    with pytest.raises(ValueError, match="thinner than the halo"):
        plan_axis(split_sizes(8, 4), 5, 1, 0, "conv0 (depth)")


def test_model_construction_rejects_thin_split():
    from hpcdl.studies.spatial.model import CosmoFlow, SpatialCosmoFlow, make_layout

    net = CosmoFlow(build_spec((8, 8, 8), {"channels": [2, 2, 2], "kernel": 5, "dense": [4]}))
    layout = make_layout((8, 1), tuple(range(8)), None, 3)
    with pytest.raises(ValueError, match="halo"):
        SpatialCosmoFlow(net, layout)


def test_same_padding_needs_odd_kernel():
    with pytest.raises(ValueError, match="odd kernel"):
        padding_for(4, "same")


# ---- config checks ------------------------------------------------------------------------------

def _cfg(**spatial):
    return {"studies": ["spatial"], "spatial": spatial}


def test_config_not_divisible():
    with pytest.raises(ConfigError, match=r"spatial\.strong\.layouts.*dividing 30 planes"):
        validate_config(_cfg(allow_uneven=False, strong={"grid": 30, "layouts": [[1, 4, 1]]}))


def test_config_more_ranks_than_planes():
    with pytest.raises(ConfigError, match=r"spatial\.strong\.layouts.*more ranks than depth planes"):
        validate_config(_cfg(strong={"grid": 8, "layouts": [[1, 16, 1]]}))


def test_config_thin_layer():
    # 16^3 input: after three pools a layer sees 4 planes, too few for 8 depth ranks
    with pytest.raises(ConfigError, match="thinner than one slab per rank"):
        validate_config(_cfg(strong={"grid": 16, "layouts": [[1, 8, 1]]}))


def test_config_batch_not_divisible_by_data_groups():
    with pytest.raises(ConfigError, match="dividing the global batch"):
        validate_config(_cfg(batch_size=3, hybrid={"grid": 32, "layouts": [[2, 1, 1]]}))


def test_config_bad_enum_and_warmup():
    with pytest.raises(ConfigError, match=r"spatial\.model\.kernel"):
        validate_config(_cfg(model={"kernel": 4}))
    with pytest.raises(ConfigError, match=r"spatial\.warmup"):
        validate_config(_cfg(iterations=3, warmup=3))


# ---- data ---------------------------------------------------------------------------------------

def test_grf_spectrum_slope():
    rng = np.random.default_rng(0)
    shape = (32, 32, 32)
    slopes = {}
    for ns in (-3.0, -1.0):
        f = grf(shape, 1.0, ns, rng)
        p = np.abs(np.fft.rfftn(f)) ** 2
        ks = np.meshgrid(*(2 * np.pi * np.fft.fftfreq(32) for _ in range(2)), 2 * np.pi * np.fft.rfftfreq(32),
                         indexing="ij")
        k = np.sqrt(sum(c ** 2 for c in ks)).ravel()
        sel = (k > 0.3) & (k < 2.0)
        slopes[ns] = np.polyfit(np.log(k[sel]), np.log(p.ravel()[sel]), 1)[0]
    assert slopes[-3.0] == pytest.approx(-3.0, abs=0.3)
    assert slopes[-1.0] == pytest.approx(-1.0, abs=0.3)


def test_dataset_cached_once_and_slabs(tmp_path):
    d = ensure_dataset(tmp_path, (8, 6, 4), 5, 3, (0.5, 2.0), (-3.0, -1.0))
    mtime = (d / "fields.npy").stat().st_mtime_ns
    assert ensure_dataset(tmp_path, (8, 6, 4), 5, 3, (0.5, 2.0), (-3.0, -1.0)) == d
    assert (d / "fields.npy").stat().st_mtime_ns == mtime
    other = ensure_dataset(tmp_path, (8, 6, 4), 5, 4, (0.5, 2.0), (-3.0, -1.0))
    assert other != d
    r = SlabReader(d)
    full = np.load(d / "fields.npy")
    block, y = r.read(np.array([4, 1]), slice(2, 5), slice(1, 3))
    assert block.shape == (2, 1, 3, 2, 4)
    np.testing.assert_array_equal(block[:, 0], full[[4, 1], 2:5, 1:3])
    assert np.all(np.abs(y) <= 1)


def test_dataset_bad_range(tmp_path):
    with pytest.raises(ValueError, match="range ns"):
        ensure_dataset(tmp_path, (8, 8, 8), 2, 0, (0.5, 2.0), (-1.0, -3.0))


def test_missing_cache_names_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GRF cache"):
        SlabReader(tmp_path / "nope")


# ---- oracle -------------------------------------------------------------------------------------

def test_ring_allreduce_formula():
    assert t_allreduce(1e6, 1, 1e-5, 1e-9) == 0
    assert t_allreduce(1e6, 4, 1e-5, 1e-9) == pytest.approx(6e-5 + 1.5e6 * 1e-9)


def test_fit_line_recovers_alpha_beta():
    x = np.array([1e3, 1e4, 1e5, 1e6])
    c0, k = fit_line(x, 2e-5 + x * 1e-9)
    assert c0 == pytest.approx(2e-5, rel=1e-6) and k == pytest.approx(1e-9, rel=1e-6)


def test_a_layer_slower_than_linear_in_size_is_fitted_through_its_points():
    # half the slab in 96 ms, the whole in 256 ms (2.7x): the whole slab spills out of the caches
    x, y = np.array([1e9, 2e9, 1e9, 2e9]), np.array([0.096, 0.256, 0.098, 0.254])
    c0, k, floor = fit_layer(x, y)
    assert c0 < 0 and k > 0
    layer = {"kind": "conv", "in": (8, 48, 48, 48), "out": (16, 48, 48, 48), "cin": 8, "cout": 16,
             "kernel": 3, "stride": 1, "pad": 1, "name": "c"}
    m = Machine(conv=(0.0, 1e-10), pool=(0.0, 1e-10), dense=(0.0, 1e-10), optimizer=(0.0, 1e-9),
                io=(0.0, 0.0), alpha_intra=0.0, beta_intra=0.0, alpha_inter=0.0, beta_inter=0.0,
                ranks_per_node=1, layers={layer_key(layer): (c0, k, floor)})
    assert m.layer_time(layer, 2e9) == pytest.approx(0.255, rel=1e-9)  # the measured points
    assert m.layer_time(layer, 1e9) == pytest.approx(0.097, rel=1e-9)
    # below the smallest measured slab: proportional to it, never the line's negative values
    assert m.layer_time(layer, 1e8) == pytest.approx(0.0097, rel=1e-9)
    assert m.layer_time(layer, 0) == 0
    # a line with a positive intercept stays the plain (c0, k) fit
    assert fit_layer([1.0, 2.0], [3.0, 5.0]) == pytest.approx((1.0, 2.0))


def test_a_shape_never_timed_takes_its_familys_fit_before_its_kinds_line():
    # two conv families timed at one grid (80^2 planes): 1 -> 8 channels at 10 GFLOP/s, 16 -> 16 at
    # 30; the kind's line averages them. A held-out grid (48^2) must be priced at its own family's
    # rate: the mixed line mispriced the laptop's held-out 48^3 run by +10..+17 %
    def conv(cin, cout, hw):
        return {"kind": "conv", "in": (cin, hw, hw, hw), "out": (cout, hw, hw, hw), "cin": cin, "cout": cout,
                "kernel": 3, "stride": 1, "pad": 1, "name": "c"}
    timed = [conv(1, 8, 80), conv(16, 16, 80)]
    rates = {1: 10e9, 16: 30e9}
    rows = [{"kind": "conv", "key": layer_key(L), "units": u, "time_s": u / rates[L["cin"]]}
            for L in timed for u in (1e8, 2e8)]
    rows += [{"kind": k, "units": u, "time_s": 1e-4 + u * 1e-10}
             for k in ("pool", "dense") for u in (1e6, 1e8)]
    rows += [{"kind": "optimizer", "units": u, "time_s": u * 1e-8} for u in (1e3, 1e5)]
    rows += [{"kind": "io", "units": u, "batch": 4, "time_s": 1e-4 + u * 1e-9} for u in (1e5, 1e6)]
    m, consts = fit_machine(rows, cores=2)
    assert consts["family_fits"] == consts["layer_fits"] == 2
    held_out = conv(1, 8, 48)
    assert layer_key(held_out) not in m.layers
    assert m.layer_time(held_out, 5e7) == pytest.approx(5e7 / 10e9, rel=1e-6)
    assert m.layer_time(conv(16, 16, 24), 5e7) == pytest.approx(5e7 / 30e9, rel=1e-6)
    # a family never timed (8 -> 16) falls back to the line of every conv row
    line = m.conv[0] + 5e7 * m.conv[1]
    assert m.layer_time(conv(8, 16, 48), 5e7) == pytest.approx(line, rel=1e-9)
    assert 5e7 / 30e9 * 1.2 < line < 5e7 / 10e9 / 1.2  # the line sits between the families' rates
    # spatial.shape_fallback: kind, the oracle before #40: the mixed line for every untimed shape
    by_kind, consts = fit_machine(rows, cores=2, families=False)
    assert consts["family_fits"] == 0
    assert by_kind.layer_time(held_out, 5e7) == pytest.approx(line, rel=1e-9)
    # a shape's own fit wins over its family's
    m.layers[layer_key(held_out)] = (0.0, 1e-12)
    assert m.layer_time(held_out, 5e7) == pytest.approx(5e7 * 1e-12, rel=1e-9)


def test_a_size_below_the_smallest_timed_scales_that_sizes_fitted_time():
    # a conv family timed at two slab sizes with a 2 ms intercept, and the optimizer timed at 1 M and
    # 2 M parameters with a 1 ms one: below the smallest timed size the intercept is no longer added
    # (the laptop's 40^3 hybrid is 1/16 of the smallest timed slab: the intercept was most of its time)
    layer = {"kind": "conv", "in": (8, 80, 80, 80), "out": (16, 80, 80, 80), "cin": 8, "cout": 16,
             "kernel": 3, "stride": 1, "pad": 1, "name": "c"}
    rows = [{"kind": "conv", "key": layer_key(layer), "units": u, "time_s": 2e-3 + u * 1e-10, "concurrent": c}
            for u in (1e8, 2e8) for c in (1, 2)]
    rows += [{"kind": "optimizer", "units": u, "time_s": 1e-3 + u * 1e-9, "concurrent": c}
             for u in (1e6, 2e6) for c in (1, 2)]
    rows += [{"kind": "io", "units": u, "batch": 4, "time_s": 1e-4 + u * 1e-9} for u in (1e5, 1e6)]
    small = {**layer, "in": (8, 20, 20, 20), "out": (16, 20, 20, 20)}  # same family, never timed
    m, consts = fit_machine(rows, cores=2)
    assert consts["proportional_below_fits"] == 2  # the shape's own fit and its family's
    for busy in (False, True):
        # from the smallest timed size up: the fitted line
        assert m.layer_time(layer, 1.5e8, busy) == pytest.approx(2e-3 + 1.5e-2, rel=1e-6)
        # below it: the fitted time there (12 ms at 1e8), scaled down with the size
        assert m.layer_time(small, 1e8 / 16, busy) == pytest.approx(12e-3 / 16, rel=1e-6)
        assert m.optimizer_time(1.5e6, busy) == pytest.approx(2.5e-3, rel=1e-6)
        assert m.optimizer_time(1e5, busy) == pytest.approx(2e-3 / 10, rel=1e-6)
    # spatial.below_timed: line, the oracle before #40: the intercept at every size
    line, consts = fit_machine(rows, cores=2, proportional=False)
    assert consts["proportional_below_fits"] == 0
    assert line.layer_time(small, 1e8 / 16) == pytest.approx(2e-3 + 1e8 / 16 * 1e-10, rel=1e-6)
    assert line.optimizer_time(1e5) == pytest.approx(1e-3 + 1e-4, rel=1e-6)
    # a fit through the origin prices every size as before
    through_origin, _ = fit_machine([{**r, "time_s": r["units"] * 1e-10} for r in rows], cores=2)
    assert through_origin.layer_time(small, 1e8 / 16) == pytest.approx(1e8 / 16 * 1e-10, rel=1e-6)


def _laptop_machine():
    rows = [{"kind": "pingpong", "size_bytes": s, "time_s": 3e-5 + s * 1e-9} for s in (1e3, 1e5, 1e6)]
    rows += [{"kind": k, "units": u, "time_s": 1e-4 + u * 1e-10} for k in ("conv", "pool", "dense")
             for u in (1e6, 1e8)]
    rows += [{"kind": "optimizer", "units": u, "time_s": u * 1e-8} for u in (1e3, 1e5)]
    rows += [{"kind": "io", "units": u, "batch": 4, "time_s": 1e-4 + u * 1e-9} for u in (1e5, 1e6)]
    return fit_machine(rows, cores=2)


def test_spatial_split_halves_compute_and_adds_halo():
    m, consts = _laptop_machine()
    assert consts["alpha_s"] == pytest.approx(3e-5, rel=1e-6)
    spec = build_spec((32, 32, 32), {"channels": [8, 16], "dense": [16]})
    one = predict(spec, 4, Strategy(), m)
    two = predict(spec, 4, Strategy(depth=2), m)
    four = predict(spec, 4, Strategy(depth=4), m)
    assert one["halo_s"] == 0 and two["halo_s"] > 0
    assert two["compute_s"] < 0.6 * one["compute_s"]
    # 4 ranks on 2 cores: compute no faster than on 2
    assert four["compute_s"] >= 0.95 * two["compute_s"]
    assert two["memory_bytes"] < one["memory_bytes"]


def test_busy_fits_apply_to_runs_that_keep_several_cores_busy():
    rows = [{"kind": "pingpong", "size_bytes": s, "time_s": 3e-5 + s * 1e-9} for s in (1e3, 1e5, 1e6)]
    rows += [{"kind": "io", "units": u, "batch": 4, "time_s": 1e-4 + u * 1e-9} for u in (1e5, 1e6)]
    for conc, slow in ((1, 1.0), (2, 1.5)):
        rows += [{"kind": k, "units": u, "concurrent": conc, "time_s": slow * (1e-4 + u * 1e-10)}
                 for k in ("conv", "pool", "dense") for u in (1e6, 1e8)]
        rows += [{"kind": "optimizer", "units": u, "concurrent": conc, "time_s": slow * (1e-4 + u * 1e-8)}
                 for u in (1e3, 1e5)]
    m, consts = fit_machine(rows, cores=2)
    assert m.busy["ranks"] == 2 and consts["busy_conv_gflops"] == pytest.approx(consts["conv_gflops"] / 1.5)
    spec = build_spec((32, 32, 32), {"channels": [8, 16], "dense": [16]})
    one = predict(spec, 4, Strategy(), m)
    data2 = predict(spec, 4, Strategy(data=2), m)  # half the batch each, both cores busy at 1.5x
    assert data2["compute_s"] == pytest.approx(1.5 * predict(spec, 2, Strategy(), m)["compute_s"], rel=1e-9)
    assert one["optimizer_s"] == pytest.approx(1e-4 + sum(n_params(L) for L in spec) * 1e-8, rel=1e-6)


def test_compute_microbenchmarks_run_the_models_ops():
    spec = build_spec((8, 8, 8), {"channels": [2, 4], "dense": [8]})
    rows = compute_timings([(spec, 2)], [1.0, 0.5], repeats=1)
    kinds = {r["kind"] for r in rows}
    assert kinds == {"conv", "pool", "dense", "optimizer", "fault"}
    assert all(r["concurrent"] == 1 and r["time_s"] > 0 and r["units"] > 0 for r in rows)
    m, _ = fit_machine(rows + [{"kind": "io", "units": 1, "batch": 1, "time_s": 1e-6}], cores=1)
    assert m.busy is None and predict(spec, 2, Strategy(), m)["compute_s"] > 0
    faults = [r for r in rows if r["kind"] == "fault"]
    assert faults and min(r["units"] for r in faults) >= fresh_bytes(spec, 2)


def test_fresh_bytes_are_the_largest_feature_maps_and_their_gradients():
    spec = build_spec((32, 32, 32), {"channels": [8, 16], "dense": [16]})
    # conv0's pre- and post-activation and pool0's window: 8 x 32^3 each, and a gradient of each
    assert fresh_bytes(spec, 4) == 2 * 3 * 8 * 32 ** 3 * 4 * 4
    assert fresh_bytes(spec, 4, frac=0.5) == fresh_bytes(spec, 4) / 2
    gpu = Machine.from_description({"peak_tflops": 7.8, "memory_gb": 16, "memory_gbs": 900, "intra_gbs": 50,
                                    "inter_gbs": 12.5, "alpha_intra_s": 5e-6, "alpha_inter_s": 1e-5,
                                    "gpus_per_node": 4, "io_gbs": 2.0})
    assert gpu.fault_time(fresh_bytes(spec, 4)) == 0  # a caching allocator reuses device memory


def test_interquartile_mean_drops_both_tails():
    from hpcdl.studies.spatial.calibration.timing import interquartile_mean

    assert interquartile_mean([100, 1, 2, 200, 3, 4, 5, 6]) == pytest.approx(4.5)
    assert interquartile_mean([7.0]) == 7.0


# ---- the oracle out of sample (spatial.held_out) --------------------------------------------------

def _default_block():
    from hpcdl.platform.kit.config import load_config

    return load_config("configs/default.yaml")["spatial"]


def _conv_pool(point, block):
    from hpcdl.studies.spatial.sweep import layer_shapes

    return layer_shapes(point, block, ("conv", "pool"))


def test_held_out_runs_have_no_calibrated_layer_shape():
    """default.yaml: only the strong model is timed, and no conv/pool shape of a held-out run is fitted."""
    from hpcdl.studies.spatial.sweep import calibration_block, held_out_shapes, training_runs

    block = _default_block()
    runs, held = training_runs(block), held_out_shapes(block)
    assert calibration_block(block)["calibrated_kinds"] == ["strong"]  # the weak model's shapes: all held out
    assert set(block["held_out"]) < set(runs)
    for r in block["held_out"]:
        assert _conv_pool(runs[r], block) <= held, r
    timed = {layer_key(L) for L in build_spec((block["strong"]["grid"],) * 3, block["model"])} - held
    for r in set(runs) - set(block["held_out"]):  # the in-sample runs' convs are all timed
        assert {k for k in _conv_pool(runs[r], block) if k.startswith("conv")} <= timed, r
    assert "dense:64>2" not in held  # the same at every grid: stays calibrated


def test_fit_leaves_out_every_timing_of_a_held_out_shape():
    import pandas as pd

    from hpcdl.studies.spatial.tables import fit_rows

    block = _default_block()
    hybrid = "conv:1>8:k3s1:40x40"  # the 40^3 hybrid's first conv
    rows = [{"kind": "conv", "key": k, "units": u, "fraction": f, "concurrent": 1, "round": 0,
             "time_s": u * k_s, "other_cpu_s": 0.0, "section_s": 1.0}
            for k, k_s in (("conv:1>8:k3s1:80x80", 1e-10), (hybrid, 1e-7))
            for f, u in ((1.0, 2e9), (0.5, 1e9))]
    got, ev = fit_rows(pd.DataFrame(rows), block)
    assert {r["key"] for r in got} == {"conv:1>8:k3s1:80x80"} and ev["rows_held_out"] == 2
    assert hybrid in ev["held_out_shapes"].split(";")
    m, _ = fit_machine(got + [{"kind": "io", "units": 1, "batch": 1, "time_s": 1e-6}], cores=2)
    # the held-out conv has no fit of its own, and the per-kind line it falls back to is the timed
    # shape's (1e-10 s per unit), untouched by the held-out timings (1e-7 s per unit)
    assert hybrid not in m.layers and m.conv[1] == pytest.approx(1e-10)


def test_each_repeat_is_predicted_by_the_calibration_round_run_just_before_it():
    import pandas as pd

    from hpcdl.studies.spatial.tables import oracle_repeats

    reps = pd.DataFrame({"run": ["weak-d1x2x1"] * 3 + ["ceiling-d1x2x1"], "repeat": [0, 1, 2, 0],
                         "time_per_iter_s": [0.10, 0.11, 0.12, 0.05]})
    summary = pd.DataFrame({"run": ["weak-d1x2x1", "ceiling-d1x2x1"], "pred_time_per_iter_s": [0.105, None],
                            "oracle_sample": ["held_out", ""]})
    # round 0's oracle read this run faster than round 1's; repeat 2 ran after both rounds (none of its own)
    per_round = {0: pd.Series({"weak-d1x2x1": 0.09}), 1: pd.Series({"weak-d1x2x1": 0.121})}
    out = oracle_repeats(reps, summary, per_round)
    assert list(out["run"]) == ["weak-d1x2x1"] * 3  # the ceiling is not a training run
    assert list(out["pred_round"]) == [0, 1, -1]
    assert list(out["pred_time_per_iter_s"]) == pytest.approx([0.09, 0.121, 0.105])
    assert list(out["pred_all_rounds_s"]) == pytest.approx([0.105] * 3)  # the runs table's, beside it
    assert list(out["oracle_error"]) == pytest.approx([-0.1, 0.1, 0.105 / 0.12 - 1])
    # no round fitted (a table of one round that failed): every repeat keeps the oracle of all rounds
    assert list(oracle_repeats(reps, summary, {})["pred_round"]) == [-1, -1, -1]


@pytest.mark.parametrize("held_out, words", [
    (["weak-d1x4x1"], "a configured training run id"),
    (["strong-d1x1x1", "strong-d1x2x1", "weak-d1x1x1", "weak-d1x2x1", "hybrid-d2x1x1", "train-d1x2x1"],
     "leaving the strong or the weak model"),
    (["weak-d1x1x1", "weak-d1x2x1", "train-d1x2x1"], "hybrid-d2x1x1 has conv:"),
])
def test_config_held_out_must_be_exactly_the_unseen_runs(held_out, words):
    import yaml

    cfg = yaml.safe_load(open("configs/default.yaml"))
    cfg["spatial"]["held_out"] = held_out
    with pytest.raises(ConfigError, match=r"spatial\.held_out") as err:
        validate_config(cfg)
    assert words in str(err.value)


def test_oracle_parity_figure_splits_held_out_from_in_sample(tmp_path):
    import pandas as pd

    from hpcdl.platform.kit.stages import pyplot
    from hpcdl.studies.spatial.figures import _plot_oracle

    df = pd.DataFrame({"run": ["strong-d1x1x1", "weak-d1x1x1", "ceiling-d1x2x1"],
                       "kind": ["strong", "weak", "ceiling"], "time_per_iter_s": [0.3, 0.1, 0.2],
                       "pred_time_per_iter_s": [0.31, 0.2, float("nan")],
                       "oracle_error": [0.03, 1.0, float("nan")],
                       "oracle_sample": ["in_sample", "held_out", ""]})
    _plot_oracle(pyplot(), df, {"claims": {"max_oracle_error": 0.1}}, tmp_path)
    assert (tmp_path / "oracle_parity.png").stat().st_size > 1000


# ---- where the study runs (docs/architecture.md, "Devices") -----------------------------------

def test_spatial_hands_nccl_only_gpu_tensors_and_gloo_only_host_tensors(monkeypatch):
    """Every placement a rank can get: the device spatial moves its halos, gathers and gradient
    all-reduces on (devices.comm_device) is a GPU exactly when the group runs NCCL, the rank's own."""
    import torch

    from hpcdl.platform.kit.device import LayoutError, rank_placement
    from hpcdl.studies.spatial.devices import comm_device

    monkeypatch.delenv("HPCDL_GPU_PER_RANK_BOUND", raising=False)
    seen = set()
    for device, gpus in (("cpu", 0), ("cuda", 1), ("cuda", 2), ("cuda", 4)):
        for world in (1, 2, 3, 4, 8):
            for sharing in (False, True):
                for local in range(world):
                    try:
                        place = rank_placement(device, local, world, gpus, sharing)
                    except LayoutError:
                        continue
                    compute = torch.device(place.compute)
                    moved = comm_device(compute, place)
                    assert (moved.type == "cuda") == (place.backend == "nccl"), place
                    if place.backend == "nccl":
                        assert moved == compute, place  # its own GPU, never another rank's
                    seen.add((compute.type, place.backend, moved.type))
    # CPU ranks; one GPU per rank; ranks sharing a GPU, staged through host memory
    assert seen == {("cpu", "gloo", "cpu"), ("cuda", "nccl", "cuda"), ("cuda", "gloo", "cpu")}


def test_each_unit_block_carries_the_resolved_device(test_config):
    """The task app adds the resolved device (and, on CUDA, gpu_sharing) to each unit's block
    (sweep.placement), so it keys the stored results; the end-to-end app test (test_spatial_app)
    checks on real ranks that the rows say where they ran."""
    from hpcdl.studies.spatial import sweep

    block = validate_config(test_config)["spatial"]
    # on a CPU gpu_sharing changes nothing, so it keys no stored result
    assert sweep.placement({**block, "gpu_sharing": True}, "cpu") == {"device": "cpu"}
    assert sweep.placement({**block, "gpu_sharing": True}, "cuda") == {"device": "cuda", "gpu_sharing": True}
