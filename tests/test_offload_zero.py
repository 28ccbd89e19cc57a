"""The zero_offload strategy (ZeRO-Offload's design) and the training precision (`offload.precision`),
on CPU tensors: where the master weights, moments and gradients live, per bucket; the weights against
`none` at the same precision within the stated tolerance; the fast tier's bytes per parameter; the
capacity search; bad input; and the claims in the papers' terms. One test needs a GPU (marked cuda)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml

from hpcdl.platform.kit.claims import write_claims
from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.studies.offload import claims as offload_claims
from hpcdl.studies.offload import tables, tolerance
from hpcdl.studies.offload.accounting import FastTier
from hpcdl.studies.offload.capacity import largest_depth
from hpcdl.studies.offload.model import build_mlp, make_batch, n_params
from hpcdl.studies.offload.slowtier import FileTier
from hpcdl.studies.offload.timeline import Timeline
from hpcdl.studies.offload.train import RunSpec, train
from hpcdl.studies.offload.zero import ZeroOffloadAdam

W, B = 32, 48
LAYER = W * W + W  # one Linear's parameters
ONE_LAYER_MB = 4 * LAYER / 2**20  # optimizer.bucket_mb for a bucket per layer (fp32 bytes; exact in binary)


def _spec(tmp_path, strategy, depth=3, **kw) -> RunSpec:
    base = dict(width=W, depth=depth, batch=B, steps=3, slow_dir=str(tmp_path), bucket_mb=ONE_LAYER_MB,
                warmup_steps=1, trim_heap=False, rss_interval_s=0.01)
    return RunSpec(strategy, **{**base, **kw})


def _flat(weights) -> torch.Tensor:
    return torch.cat([w.detach().double().reshape(-1) for w in weights])


def _zero(tmp_path, depth: int, dtype=torch.bfloat16, window: int = 2, track: bool = False):
    """A bf16 MLP with ZeroOffloadAdam over it, on a FileTier; with `track`, its parameters and
    gradients charged in a registry as train.py charges them (before the optimizer's hooks)."""
    model = build_mlp(W, depth, 0).to(dtype)
    params = list(model.parameters())
    fast, tl = FastTier(None), Timeline()
    if track:
        def charge_grad(p):
            fast.track(p.grad, "gradients")

        for p in params:
            fast.track(p, "parameters")
            p.register_post_accumulate_grad_hook(charge_grad)
    tier = FileTier(tmp_path, tl)
    opt = ZeroOffloadAdam(params, tier, fast, tl, int(ONE_LAYER_MB * 2**20), 1e-3, host_adam="fused",
                          grad_window=window)
    return model, params, fast, tl, tier, opt


def _mapping_of(path: Path) -> tuple[int, int]:
    """The address range this process maps `path` at (/proc/self/maps)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(path)):
            lo, hi = line.split()[0].split("-")
            return int(lo, 16), int(hi, 16)
    raise AssertionError(f"{path} is not mapped")


def test_master_weights_and_moments_are_fp32_on_the_host_and_the_parameters_stay_low_precision(tmp_path):
    model, params, fast, tl, tier, opt = _zero(tmp_path, depth=4)
    n = n_params(W, 4)
    try:
        assert {p.dtype for p in params} == {torch.bfloat16}
        f32 = torch.float32
        for name, flat, dtype in (("master", opt.master, f32), ("exp_avg", opt.exp_avg, f32),
                                  ("exp_avg_sq", opt.exp_avg_sq, f32), ("grad32", opt.grad32, f32),
                                  ("grads", opt.grad_low, torch.bfloat16)):
            assert flat.dtype == dtype and flat.device.type == "cpu" and flat.numel() == n, name
            # the host on CPU is a shared mapping of a file in the slow tier's run directory: page-cache
            # memory, which the measured peak (anonymous RSS) leaves out
            path = tier.dir / f"host-{name}.bin"
            assert path.stat().st_size == n * flat.element_size(), name
            lo, hi = _mapping_of(path)
            assert lo <= flat.data_ptr() < hi, name
        # the masters start as the bf16 weights, exactly; the moments at zero
        assert torch.equal(opt.master, _flat(params).float())
        assert not opt.exp_avg.any() and not opt.exp_avg_sq.any()
        assert all(p.untyped_storage().data_ptr() != opt.master.untyped_storage().data_ptr() for p in params)
        # torch's own Adam runs the host's step on the host's buffers: its state is theirs
        (adam, masters), = opt.opts[:1]
        st = adam.state[masters[0]]
        assert adam.defaults["fused"] and st["exp_avg"].data_ptr() >= opt.exp_avg.data_ptr()
        assert opt.param_low is None  # CPU: the copy thread casts as it copies (CUDA casts on the host)
    finally:
        opt.close()
        tier.close()
    assert not list(tmp_path.iterdir())


def test_gradients_land_on_the_host_per_bucket_during_backward_and_leave_the_fast_tier(tmp_path):
    depth, window = 6, 2
    model, params, fast, tl, tier, opt = _zero(tmp_path, depth=depth, window=window, track=True)
    reference = copy.deepcopy(model)  # the same weights, plain backward
    x, y = make_batch(W, B, 0, 0)
    F.mse_loss(reference(x.bfloat16()).float(), y).backward()
    expected = [p.grad.clone() for p in reference.parameters()]
    try:
        assert len(opt.buckets) == depth and all(len(b) == 2 for b in opt.buckets)  # a bucket per layer
        log = tl.start()
        F.mse_loss(model(x.bfloat16()).float(), y).backward()
        # every bucket's copy was issued by the hooks inside backward, none by the step
        assert opt._issued == depth and set(opt._out) == set(range(depth))
        confirmed = range(depth - window)  # each freed when the bucket `window` later was issued
        for k, b in enumerate(opt.buckets):
            for i in b:
                if k in confirmed:
                    assert params[i].grad is None, (k, i)
                    assert torch.equal(opt._view(opt.grad_low, i), expected[i].reshape(-1)), (k, i)
                else:
                    assert params[i].grad is not None, (k, i)
        # the registry holds exactly the unconfirmed buckets' bf16 gradients (a fixed program point)
        assert fast.by_kind["gradients"] == window * LAYER * 2
        opt.step()
        tl.stop()
        log.resolve()
        assert all(p.grad is None for p in params) and fast.by_kind["gradients"] == 0
        assert torch.equal(opt.grad_low, _flat(expected).bfloat16().float().bfloat16())
        assert torch.equal(opt.grad32, _flat(expected).float())  # cast up on the host (bf16: no scaling)
        # the step ran on the host and its masters, cast to bf16, are the parameters now
        assert opt.master.ne(_flat(reference.parameters()).float()).any()
        assert torch.equal(_flat(params).bfloat16(), opt.master.bfloat16())
        spans = pd.DataFrame(log.rows())
        for lane, kind in (("to_slow", "gradients"), ("from_slow", "parameters")):
            d = spans[(spans["lane"] == lane) & (spans["kind"] == kind)]
            assert len(d) == depth and (d["span_bytes"] == LAYER * 2).all(), (lane, d)
        assert (spans[spans["lane"] == "compute"]["kind"] == "optimizer_update").sum() == depth
    finally:
        opt.close()
        tier.close()


def test_weights_equal_none_at_the_same_precision_within_the_stated_tolerance(tmp_path):
    """The tolerance (hpcdl/studies/offload/tolerance.py): zero_offload's final weights are within
    sqrt(steps) / 2 units in the last place (ulp) of the training format of none's, in the root mean
    square over the weights, same seed and steps.

    Why: zero_offload's host step runs torch's CPU `fused` Adam where none runs `foreach` (on a GPU,
    the GPU's kernels): the same fp32 expression in another order of correctly rounded operations, so
    a step's updated weight differs by at most half an ulp of fp32, or not at all. Below fp32 the
    cast of the master to bf16 / fp16 hides it unless the master lies that close to a rounding
    midpoint, and then the parameters land one ulp of the training format apart. Either way a step
    adds at most half an ulp, of either sign, to each weight's difference, and the later steps,
    fed weights that differ in their last bits, add more of that size: independent half ulps, one a
    step, give sqrt(steps) / 2 in the root mean square. Tested here on CPU tensors, fused against
    foreach, where fp32 shows a real difference; the same bound covers a GPU's Adam against the CPU's.
    """
    steps = 13
    dev = {}
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        kw = dict(steps=steps, precision=precision)
        none, _, wn = train(_spec(tmp_path, "none", **kw), keep_weights=True)
        fused, _, wz = train(_spec(tmp_path, "zero_offload", host_adam="fused", **kw), keep_weights=True)
        foreach, _, wf = train(_spec(tmp_path, "zero_offload", host_adam="foreach", **kw), keep_weights=True)
        assert {w.dtype for w in wn + wz + wf} == {dtype}
        # the same kernels on the host: bit for bit
        assert foreach["weights_sha256"] == none["weights_sha256"], precision
        assert all(torch.equal(a, b) for a, b in zip(wf, wn, strict=True))
        # other kernels: within the tolerance, on every weight and on the record's sample alike
        dev[precision] = tolerance.deviation(_flat(wz).numpy(), _flat(wn).numpy(), precision)
        assert dev[precision] <= tolerance.tolerance(steps) == pytest.approx(math.sqrt(13) / 2), precision
        sampled = tolerance.deviation(tolerance.parse_sample(fused["weights_sample"]),
                                      tolerance.parse_sample(none["weights_sample"]), precision)
        assert sampled <= tolerance.tolerance(steps)
        assert len(tolerance.parse_sample(none["weights_sample"])) == 256
        # and the tolerance tells another computation apart: no training at all, or (fp32) one step short.
        # bf16 cannot tell one step of lr 1e-3 in 13 apart (about 1 ulp): that is the format's resolution
        untrained = list(build_mlp(W, 3, 0).to(dtype).parameters())
        others = [untrained]
        if precision == "fp32":
            others.append(train(_spec(tmp_path, "none", **{**kw, "steps": steps - 1}), keep_weights=True)[2])
        for other in others:
            far = tolerance.deviation(_flat(other).numpy(), _flat(wn).numpy(), precision)
            assert far > 4 * tolerance.tolerance(steps), (precision, far)
    # fp32 shows the kernels' difference (the weights are not bit-identical), well inside the bound
    assert 0 < dev["fp32"] < tolerance.tolerance(steps)
    assert not list(tmp_path.iterdir()), "offload files left behind"


def test_the_ulp_is_the_gap_to_the_next_value_of_each_format():
    gen = torch.Generator().manual_seed(0)
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        x = (torch.randn(2000, generator=gen) * 4).to(dtype)
        x = x[x.float().abs() > 1e-3]  # normal numbers of every format
        gap = (torch.nextafter(x.abs(), torch.tensor(math.inf, dtype=dtype)) - x.abs()).double().numpy()
        assert np.array_equal(tolerance.ulp(x.double().numpy(), precision), gap), precision
        # every weight one ulp away reads exactly 1 ulp in the root mean square
        ref = x.double().numpy()
        assert tolerance.deviation(ref + tolerance.ulp(ref, precision), ref, precision) == pytest.approx(1.0)
    assert tolerance.tolerance(1) == 0.5 and tolerance.tolerance(0) == 0.5
    with pytest.raises(ValueError, match="equal, non-empty"):
        tolerance.deviation([1.0], [1.0, 2.0], "bf16")


def test_fast_tier_bytes_per_parameter(tmp_path):
    """The registry's peak of the model's state (no activations) per parameter, each exactly: none 16 at
    fp32; zero_offload its parameters and the gradients of window + 1 buckets in flight."""
    depth, window = 6, 2
    n = n_params(W, depth)
    rec = {(s, p): train(_spec(tmp_path, s, depth=depth, precision=p, grad_window=window))[0]
           for s in ("none", "zero_offload", "both") for p in ("fp32", "bf16")}
    bpp = {k: r["fast_bytes_per_param"] for k, r in rec.items()}
    assert bpp["none", "fp32"] == 16.0  # parameters, gradients, two moments
    # bf16 parameters, fp32 masters and moments, and the fp32 gradients of the step (each bf16 one freed
    # once cast up: at the last weight's, it, its fp32 copy and the last bias's bf16 gradient)
    assert bpp["none", "bf16"] == pytest.approx(18 + (2 * W * W - 2 * W) / n)
    for p, size in (("fp32", 4), ("bf16", 2)):
        assert bpp["zero_offload", p] == pytest.approx(size + size * (window + 1) / depth), p
        assert rec["zero_offload", p]["fast_state_peak_bytes"] == size * n + size * (window + 1) * LAYER
        assert "peak_optimizer_state_bytes" not in rec["zero_offload", p]
        assert bpp["zero_offload", p] < bpp["both", p] < bpp["none", p]
        # zero_offload moves each step's gradients down and its parameters up, in the training precision
        moved = rec["zero_offload", p]
        assert moved["bytes_to_slow"] == moved["bytes_from_slow"] == size * n
    assert {r["precision"] for r in rec.values()} == {"fp32", "bf16"}


def test_capacity_search_reports_zero_offload_and_none_at_the_same_precision(tmp_path):
    """Real trials under a 4 MiB budget at bf16, width 128, batch 256: a layer of none's state and
    activations (~0.4 MiB) is well above the RSS sampling noise; zero_offload's (~0.2 MiB) fits every
    depth up to the search's cap of 8 (its capacity a lower bound there), none's a few."""
    spec = _spec(tmp_path, "none", depth=1, width=128, batch=256, steps=2, warmup_steps=0, budget_mb=4,
                 trim_heap=True, precision="bf16", bucket_mb=4 * (128 * 128 + 128) / 2**20)
    found = {s: largest_depth(RunSpec(**{**spec.__dict__, "strategy": s}), 8)
             for s in ("none", "zero_offload")}
    assert {r["precision"] for r in found.values()} == {"bf16"}
    assert 1 <= found["none"]["max_depth"] < 8 and not found["none"]["capped_at_max_depth"]
    assert found["zero_offload"]["max_depth"] == 8 and found["zero_offload"]["capped_at_max_depth"]
    assert found["zero_offload"]["max_params"] > 2 * found["none"]["max_params"]
    assert found["zero_offload"]["peak_measured_by"] == "anonymous RSS high-water mark"


def test_dontneed_writes_the_host_mapping_back_and_trains_the_same_weights(tmp_path):
    ref = train(_spec(tmp_path, "zero_offload", precision="bf16"))[0]
    rec = train(_spec(tmp_path, "zero_offload", precision="bf16", io_mode="dontneed"))[0]
    assert rec["io_mode"] == "dontneed" and rec["weights_sha256"] == ref["weights_sha256"]
    assert not list(tmp_path.iterdir())


def test_fp16_trains_under_a_static_loss_scale_and_an_overflow_names_the_key(tmp_path):
    kw = dict(precision="fp16", loss_scale=2.0**16)
    none, _, wn = train(_spec(tmp_path, "none", **kw), keep_weights=True)
    zero = train(_spec(tmp_path, "zero_offload", host_adam="foreach", **kw))[0]
    both = train(_spec(tmp_path, "both", **kw))[0]
    assert wn[0].dtype == torch.float16 and none["loss_scale"] == 65536.0
    assert zero["weights_sha256"] == both["weights_sha256"] == none["weights_sha256"]
    assert train(_spec(tmp_path, "none", precision="bf16", loss_scale=2.0**16))[0]["loss_scale"] == 1.0
    # 2^24 times these gradients is past fp16's largest value (65504): the weights go non-finite
    with pytest.raises(FloatingPointError, match=r"offload\.loss_scale = 1\.67772e\+07 overflowed fp16"):
        train(_spec(tmp_path, "none", precision="fp16", loss_scale=2.0**24))
    with pytest.raises(ValueError, match="'offload.loss_scale'.*power of two"):
        train(_spec(tmp_path, "none", precision="fp16", loss_scale=1000.0))


@pytest.mark.parametrize(("key", "value", "words"), [
    ("precision", "fp8", "offload.precision"),
    ("loss_scale", 1000, "offload.loss_scale"),
    ("zero_offload", {"host_adam": "adamw"}, "offload.zero_offload.host_adam"),
    ("strategies", ["none", "zero"], "offload.strategies"),
])
def test_precision_and_zero_offload_keys_are_validated_naming_the_key(test_config, key, value, words):
    cfg = {**test_config, "studies": ["offload"], "offload": {**test_config["offload"], key: value}}
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    assert words in str(err.value)


def test_unknown_precision_in_a_run_names_the_key(tmp_path):
    with pytest.raises(ValueError, match="'offload.precision': 'fp8' is not allowed; allowed: fp32, bf16, "):
        train(_spec(tmp_path, "none", precision="fp8"))
    with pytest.raises(ValueError, match="offload.zero_offload.host_adam"):
        train(_spec(tmp_path, "zero_offload", host_adam="adamw"))
    assert not list(tmp_path.iterdir())


def test_the_repo_configs_run_zero_offload_against_none_at_their_precision(repo):
    from hpcdl.platform.kit.config import load_config

    want = {"default": "fp32", "test": "fp32", "gpu": "bf16", "paper": "fp16"}
    for name, precision in want.items():
        b = load_config(repo / "configs" / f"{name}.yaml")["offload"]
        assert {"none", "both", "zero_offload"} <= set(b["strategies"]) and b["precision"] == precision, name
        assert b["claims"]["zero_capacity_min_ratio"] == 7.5 and b["claims"]["zero_memory_max_ratio"] == 0.3


# ------------------------------------------------------------------------------- the claims (HAND-MADE)
RSS = "anonymous RSS high-water mark"


def _tables(precision: str = "bf16") -> tuple[dict, dict]:
    """HAND-MADE tables: none, both and zero_offload at two depths, a slow tier 5x / 3.3x slower."""
    n_sample = [0.5 + i / 64 for i in range(8)]  # one binade: every value's ulp is the same
    rows = []
    for d in (4, 8):
        for s, mem, bpp in (("none", 100, 18.0), ("both", 25, 8.0), ("zero_offload", 28, 2.5)):
            sample = n_sample if s != "zero_offload" else [v + float(tolerance.ulp(v, precision)) * (i % 2)
                                                           for i, v in enumerate(n_sample)]
            rows.append({"strategy": s, "precision": precision, "depth": d, "steps": 13, "tier": "ram>file",
                         "peak_fast_bytes": mem * d, "peak_measured_by": RSS,
                         "peak_accounted_bytes": mem * d * 4 // 5, "fast_bytes_per_param": bpp,
                         "peak_extra_rss_bytes": mem * d, "step_s": 0.1,
                         "hidden_frac": np.nan if s == "none" else 0.8,
                         "hidden_frac_steps": "" if s == "none" else "0.78 0.80 0.82 0.80",
                         # zero_offload's weights differ from none's by one ulp in half the sample
                         "weights_sha256": f"sha-{d}" + ("-host" if s == "zero_offload" else ""),
                         "weights_sample": " ".join(f"{v:.9g}" for v in sample), "status": "ok", "error": ""})
    caps = pd.DataFrame({"strategy": ["none", "both", "zero_offload"], "precision": precision,
                         "max_depth": [4, 16, 40], "max_params": [4, 16, 40], "budget_mb": 24,
                         "capped_at_max_depth": False, "peak_fast_bytes_at_max": 24 << 20,
                         "peak_accounted_bytes_at_max": 20 << 20, "peak_measured_by": RSS, "status": "ok"})
    tiers = pd.DataFrame([{"device": "cpu", "tier_pair": "ram>file", "io_mode": "dontneed", "tier": t,
                           "medium": "RAM" if t == "fast" else "files", "direction": d,
                           "probe_bytes": 64 << 20,
                           "points": 6, "bandwidth_bytes_per_s": bw, "bandwidth_min_bytes_per_s": bw,
                           "bandwidth_max_bytes_per_s": bw, "slowdown": 10e9 / bw if t == "slow" else np.nan}
                          for t, d, bw in (("fast", "write", 10e9), ("fast", "read", 10e9),
                                           ("slow", "write", 2e9), ("slow", "read", 3e9))])
    cfg = {"offload": {"strategies": ["none", "both", "zero_offload"], "device": "cpu",
                       "precision": precision, "steps": 13, "model": {"depths": [4, 8]},
                       "capacity": {"budget_mb": 24},
                       "claims": {"memory_max_ratio": 0.3, "hidden_min": 0.7, "capacity_min_ratio": 3.0,
                                  "zero_memory_max_ratio": 0.3, "zero_capacity_min_ratio": 7.5,
                                  "cross_check_factor": 1.5, "slow_tier_min_slowdown": 1.5}}}
    return cfg, {"tradeoff": pd.DataFrame(rows), "capacity": caps, "tiers": tiers,
                 "failures": pd.DataFrame(columns=["kind", "point", "error"])}


def _judge(tmp_path, cfg, t) -> dict:
    (tmp_path / "tables").mkdir(parents=True, exist_ok=True)
    for name, df in t.items():
        df.to_csv(tmp_path / "tables" / f"{name}.csv", index=False)
    found = offload_claims.judge(cfg, tmp_path)
    write_claims(tmp_path, "offload", found, offload_claims.CLAIMS)  # every id declared, every field sound
    return {c["id"]: c for c in found}


def _set(t, strategy, column, value, table="tradeoff"):
    d = t[table]
    d.loc[d["strategy"] == strategy, column] = value


def test_zero_offload_claims_pass_on_the_papers_lines(tmp_path):
    cfg, t = _tables()
    c = _judge(tmp_path, cfg, t)
    assert set(c) == set(offload_claims.CLAIMS)
    mem, cap, w = c["zero_memory_ratio"], c["zero_capacity_ratio"], c["weights_equal"]
    assert mem["status"] == cap["status"] == w["status"] == "passed", (mem, cap, w)
    assert mem["measured"]["memory_ratio"] == 0.28 and mem["measured"]["precision"] == "bf16"
    assert mem["measured"]["zero_offload_fast_bytes_per_param"] == 2.5
    assert mem["measured"]["none_fast_bytes_per_param"] == 18.0
    assert mem["measured"]["paper_line"] == "Myelin is able to reduce GPU memory consumption by four times"
    assert "both at bf16" in mem["statement"] and "<= 0.3 of 'none'" in mem["statement"]
    assert cap["measured"]["capacity_ratio"] == 10.0 and cap["measured"]["threshold"] == 7.5
    assert "a 10x increase in size" in cap["measured"]["paper_line"]
    assert cap["measured"]["paper_source"] == "Ren et al., ZeRO-Offload (arXiv 2101.06840), abstract"
    # the weights: one ulp in half the sample is 0.71 ulp rms, inside sqrt(13)/2
    assert w["measured"]["deviation_ulps"] == {"zero_offload/4L": 0.7071, "zero_offload/8L": 0.7071}
    assert w["measured"]["tolerance_ulps"] == round(math.sqrt(13) / 2, 4)
    assert w["statement"].startswith("both each train to bit-identical weights")
    assert "zero_offload trains to the weights of 'none' at the same precision (bf16)" in w["statement"]


def test_zero_offload_claims_fail(tmp_path):
    cfg, t = _tables()
    _set(t, "zero_offload", "peak_fast_bytes", 40 * 8)  # 0.4 of none
    _set(t, "zero_offload", "max_params", 20, "capacity")  # 5x, under 7.5x
    ref = tolerance.parse_sample(t["tradeoff"]["weights_sample"].iloc[0])
    far = [v + 3 * float(tolerance.ulp(v, "bf16")) for v in ref]  # 3 ulps everywhere, over sqrt(13)/2
    _set(t, "zero_offload", "weights_sample", " ".join(f"{v:.9g}" for v in far))
    c = _judge(tmp_path, cfg, t)
    assert c["zero_memory_ratio"]["status"] == "failed"
    assert c["zero_memory_ratio"]["measured"]["memory_ratio"] == 0.4
    assert c["zero_capacity_ratio"]["status"] == "failed"
    assert c["weights_equal"]["status"] == "failed"
    assert c["weights_equal"]["measured"]["deviation_ulps"]["zero_offload/8L"] == 3.0
    # Myelin's claims are not theirs to fail
    assert c["memory_ratio"]["status"] == c["capacity_ratio"]["status"] == "passed"


def test_zero_offload_claims_not_measured(tmp_path):
    cfg, t = _tables()
    t["capacity"] = t["capacity"][t["capacity"]["strategy"] != "zero_offload"]
    t["failures"] = pd.DataFrame([{"kind": "capacity",
                                   "point": "strategy=zero_offload, width=256, budget_mb=24",
                                   "error": "SlowTierError: slow-tier directory /x is full"}])
    _set(t, "zero_offload", "weights_sample", np.nan)
    c = _judge(tmp_path, cfg, t)
    assert c["zero_capacity_ratio"]["status"] == "not_measured"
    why = c["zero_capacity_ratio"]["reason"]
    assert "strategy=zero_offload" in why and "is full" in why
    assert c["weights_equal"]["status"] == "not_measured" and "weights_sample" in c["weights_equal"]["reason"]
    # files through the page cache are RAM: the memory claims are not measured on such a host
    cfg, t = _tables()
    sel = (t["tiers"]["tier"] == "slow") & (t["tiers"]["direction"] == "read")
    t["tiers"].loc[sel, ["bandwidth_bytes_per_s", "slowdown"]] = [9.5e9, 10e9 / 9.5e9]
    c = _judge(tmp_path / "fast", cfg, t)
    for cid in ("zero_memory_ratio", "zero_capacity_ratio"):
        assert c[cid]["status"] == "not_measured", cid
        assert "is not slower than the fast tier" in c[cid]["reason"], cid
    # a config without zero_offload: its claims say so
    cfg, t = _tables()
    cfg["offload"]["strategies"] = ["none", "both"]
    del cfg["offload"]["claims"]["zero_memory_max_ratio"]
    c = _judge(tmp_path / "without", cfg, t)
    assert "offload.strategies lacks ['zero_offload']" in c["zero_memory_ratio"]["reason"]
    assert c["weights_equal"]["status"] == "passed" and "zero_offload" not in c["weights_equal"]["statement"]


def test_tradeoff_table_reads_each_strategy_against_none_at_its_precision():
    _, t = _tables()
    raw = t["tradeoff"].drop(columns=["fast_bytes_per_param"])
    out = tables.tradeoff(raw)
    z = out[(out["strategy"] == "zero_offload") & (out["depth"] == 8)].iloc[0]
    assert z["memory_ratio"] == pytest.approx(0.28) and not z["bit_identical"]
    assert z["weights_deviation_ulps"] == pytest.approx(math.sqrt(0.5))
    assert list(out["strategy"].iloc[:3]) == ["none", "both", "zero_offload"]
    old = tables.tradeoff(raw.drop(columns=["precision", "weights_sample"]))  # tables from before the key
    assert old["memory_ratio"].notna().all() and old["weights_deviation_ulps"].isna().all()


def test_the_claims_quote_resources_papers_yaml(repo):
    papers = {p["id"]: p for p in yaml.safe_load((repo / "resources" / "papers.yaml").read_text())["offload"]}
    assert offload_claims.PAPER_LINES["zero_capacity_ratio"] == {
        "source": papers["zero_offload_10x"]["source"], "line": papers["zero_offload_10x"]["verbatim"]}
    for cid in ("memory_ratio", "zero_memory_ratio"):
        assert offload_claims.PAPER_LINES[cid] == {"source": papers["memory_4x"]["source"],
                                                  "line": papers["memory_4x"]["verbatim"]}
    assert offload_claims.PAPER_LINES["capacity_ratio"]["line"] == papers["throughput_13pct"]["verbatim"]


@pytest.mark.cuda
def test_on_cuda_zero_offload_holds_bf16_parameters_on_the_gpu_and_its_state_on_the_host(tmp_path):
    """The GPU tiers: bf16 parameters and gradients in GPU memory, the fp32 state in host memory with
    the copy buffers pinned; the weights within the stated tolerance of none's at bf16 (the host's
    fused CPU Adam against the GPU's foreach); the allocator's peak far below none's."""
    kw = dict(depth=4, device="cuda", batch=256, width=256, precision="bf16", steps=4,
              bucket_mb=4 * (256 * 256 + 256) / 2**20)
    none, _, wn = train(_spec(tmp_path, "none", **kw), keep_weights=True)
    zero, timeline, wz = train(_spec(tmp_path, "zero_offload", **kw), keep_weights=True)
    n = n_params(256, 4)
    assert zero["tier"] == "gpu>pinned_host" and {w.dtype for w in wz} == {torch.bfloat16}
    assert tolerance.deviation(_flat(wz).numpy(), _flat(wn).numpy(), "bf16") <= tolerance.tolerance(4)
    assert zero["bytes_to_slow"] == zero["bytes_from_slow"] == 2 * n  # bf16 gradients down, parameters up
    assert zero["peak_fast_bytes"] < none["peak_fast_bytes"]
    assert zero["fast_bytes_per_param"] <= 4.0 and none["fast_bytes_per_param"] >= 18.0
    assert {r["lane"] for r in timeline} >= {"to_slow", "from_slow", "compute"}
    # the optimizer's host buffers: fp32 state in host memory, the copy buffers pinned
    model = build_mlp(256, 2, 0, "cuda").bfloat16()
    from hpcdl.studies.offload.slowtier import PinnedTier

    tl = Timeline()
    opt = ZeroOffloadAdam(list(model.parameters()), PinnedTier(tl, torch.device("cuda")), FastTier(None), tl,
                          1 << 20, 1e-3)
    assert opt.master.device.type == "cpu" and opt.master.dtype == torch.float32
    assert opt.grad_low.is_pinned() and opt.param_low.is_pinned() and opt.grad_low.dtype == torch.bfloat16
    opt.close()


def test_sweep_passes_the_precision_and_zero_offload_keys_to_every_point(test_config):
    from hpcdl.studies.offload.sweep import capacity_points, sweep_points

    cfg = validate_config({**test_config, "studies": ["offload"],
                           "offload": {**test_config["offload"], "precision": "bf16",
                                       "zero_offload": {"host_adam": "foreach", "grad_window": 3}}})
    for p in sweep_points(cfg) + [c["spec"] for c in capacity_points(cfg)]:
        keys = (p["precision"], p["host_adam"], p["grad_window"], p["loss_scale"])
        assert keys == ("bf16", "foreach", 3, 65536)
        RunSpec(**{k: v for k, v in p.items() if k != "tier_probe"})  # every key is a RunSpec field
    assert "zero_offload" in {p["strategy"] for p in sweep_points(cfg)}
    assert json.dumps(sweep_points(cfg))  # points travel as plain data
