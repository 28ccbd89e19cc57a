"""Every claim of every study, fed small synthetic tables that pass it, fail it and lack its input.

Each study's baseline tables below pass all its claims; a case mutates them and names the
status the claim must then have (and, for a missing input, words the reason must contain).
`test_every_declared_claim_has_a_pass_fail_and_missing_case` fails when a study declares a
claim (its claims stage's CLAIMS) that has no case of each kind here.
"""

from __future__ import annotations

import copy
import importlib
import json
from pathlib import Path

import microbatch_cudnn_tables
import numpy as np
import pandas as pd
import pytest
import yaml

from hpcdl.platform.kit.claims import claim, declared, every, not_measured, write_claims
from hpcdl.platform.kit.config import studies, validate_config
from hpcdl.studies.shuffle.compute import SAMPLE_BYTES

REPO = Path(__file__).resolve().parents[1]
OUTCOMES = ("passed", "failed", "not_measured")


def _write(study_dir: Path, tables: dict[str, pd.DataFrame]) -> Path:
    for name, df in tables.items():
        path = study_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(path, index=False)
    return study_dir


# ------------------------------------------------------------------------------------ checkpoint
CKPT_CFG = {
    "checkpoint": {
        "formats": ["torch", "npz"],
        "modes": ["sync", "async"],
        "dcp_ranks": [2],
        "sizes": {"min_params": 1024, "max_params": 1024, "points": 1},
        "claims": {"async_max_ratio": 0.10, "bandwidth_min_ratio": 0.90},
    }
}


def _checkpoint(formats=("torch", "npz")) -> tuple[dict, dict]:
    rows = [
        {
            "format": f,
            "mode": m,
            "process_group": False,
            "ranks": 1,
            "n_params": 1024,
            "blocking_s": 1.0 if m == "sync" else 0.05,
            "bw_over_ceiling": 0.95,
            "ceiling_spread": 0.04 if m == "sync" else np.nan,  # async points probe no ceiling
            "roundtrip_ok": True,
        }
        for f in formats
        for m in ("sync", "async")
    ]
    rows.append(
        {
            "format": "dcp",
            "mode": "sync",
            "process_group": True,
            "ranks": 2,
            "n_params": 1024,
            "blocking_s": 1.0,
            "bw_over_ceiling": 0.5,
            "roundtrip_ok": True,
        }
    )
    tables = {
        "tables/io_cost.csv": pd.DataFrame(rows),
        "tables/resume.csv": pd.DataFrame(
            {
                "format": ["torch", "npz"],
                "status": ["ok", "ok"],
                "bit_identical": [True, True],
                "error": ["", ""],
            }
        ),
        "tables/failures.csv": pd.DataFrame(columns=["kind", "point", "error"]),
    }
    return copy.deepcopy(CKPT_CFG), tables


def _io_row(t, fmt, mode, ranks=1):
    io = t["tables/io_cost.csv"]
    return (io["format"] == fmt) & (io["mode"] == mode) & (io["ranks"] == ranks)


def _io_failed(t, fmt, mode, error, ranks=1):
    t["tables/io_cost.csv"] = t["tables/io_cost.csv"][~_io_row(t, fmt, mode, ranks)]
    t["tables/failures.csv"] = pd.DataFrame(
        [{"kind": "io", "error": error, "point": f"format={fmt}, mode={mode}, ranks={ranks}, n_params=1024"}]
    )


def _set(t, table, mask_fn, col, value):
    df = t[table]
    df.loc[mask_fn(df), col] = value


def _async_repeats(npz: list[float], torch=(0.05, 0.06, 0.055)):
    """Per format, the async / sync blocking ratio of each repeat at the largest size
    (tables/async_repeats.csv); torch's repeats pass unless given."""
    ratios = {"torch": torch, "npz": npz}
    rows = [{"device": "cpu", "format": f, "n_params": 1024, "repeat": i, "async_blocking_s": r,
             "sync_blocking_s": 1.0, "blocking_over_sync": r}
            for f, rs in ratios.items() for i, r in enumerate(rs)]
    return lambda c, t: t.__setitem__("tables/async_repeats.csv", pd.DataFrame(rows))


def _bw_repeats(torch: list[float], npz=(0.50, 0.52, 0.51)):
    """Per format, each sync repeat's bandwidth over its ceiling at the largest size
    (tables/bandwidth_repeats.csv); npz's repeats fail unless given."""
    ratios = {"torch": torch, "npz": npz}
    rows = [{"device": "cpu", "format": f, "n_params": 1024, "repeat": i, "bw_over_ceiling": r,
             "ceiling_spread": 0.04} for f, rs in ratios.items() for i, r in enumerate(rs)]
    return lambda c, t: t.__setitem__("tables/bandwidth_repeats.csv", pd.DataFrame(rows))


def _ckpt_sync(fmt):
    return lambda d: (d["format"] == fmt) & (d["mode"] == "sync") & (d["ranks"] == 1)


def test_checkpoint_async_interval_pairs_each_repeats_saves(tmp_path):
    from hpcdl.studies.checkpoint.tables import async_repeats

    raw = pd.DataFrame([{"format": f, "mode": m, "process_group": False, "ranks": 1, "n_params": 1024,
                         "repeat": r, "status": "ok", "device": "cpu",
                         "blocking_s": (1.0 + r) if m == "sync" else 0.1 * (r + 1)}
                        for f in ("torch", "npz") for m in ("sync", "async") for r in range(3)])
    pairs = async_repeats(raw)
    torch_ratios = pairs[pairs["format"] == "torch"].sort_values("repeat")["blocking_over_sync"]
    assert torch_ratios.tolist() == pytest.approx([0.1, 0.1, 0.1])  # repeat r's async over repeat r's sync
    c = _find(_run("checkpoint", lambda c, t: t.__setitem__("tables/async_repeats.csv", pairs), tmp_path),
              "async_blocking")
    ev = c["measured"]["async_over_sync_per_repeat"]["npz"]
    assert ev["n"] == 3 and set(ev["per_pair"]) == {"repeat 0", "repeat 1", "repeat 2"}
    assert c["status"] == "straddles"  # every ratio at the 0.10 line: the interval crosses it


def test_checkpoint_async_ratio_is_the_saves_own_snapshot_copy_the_later_ones_context(tmp_path):
    from hpcdl.studies.checkpoint.tables import async_repeats

    # repeat 4's own snapshot copy stalled (0.25 s where the others take 0.05 s), its two further copies
    # did not: training waited for the stalled one, so the claim judges it (#59); the median is context
    raw = pd.DataFrame([{"format": "torch", "mode": m, "process_group": False, "ranks": 1, "n_params": 1024,
                         "repeat": r, "status": "ok", "device": "cpu",
                         "blocking_s": 1.0 if m == "sync" else (0.25 if r == 4 else 0.05),
                         "blocking_typical_s": 1.0 if m == "sync" else 0.05}
                        for m in ("sync", "async") for r in range(5)])
    pairs = async_repeats(raw)
    assert pairs.sort_values("repeat")["blocking_over_sync"].tolist() == pytest.approx([0.05] * 4 + [0.25])
    assert pairs["typical_blocking_over_sync"].tolist() == pytest.approx([0.05] * 5)
    c = _find(_run("checkpoint", lambda c, t: t.__setitem__("tables/async_repeats.csv", pairs), tmp_path),
              "async_blocking")
    assert c["measured"]["async_over_sync_per_repeat"]["torch"]["mean"] == pytest.approx(0.09)
    assert c["status"] == "straddles"


# async / sync ratios per format and repeat at 256 MiB, run 1 of three fresh-clone runs at 0101a14:
# hdf5's repeat 3 copy stalled (83 ms where the other 24 took 12-25 ms)
RUN1_ASYNC = {"dcp": [0.042, 0.045, 0.050, 0.058, 0.058], "hdf5": [0.056, 0.057, 0.051, 0.276, 0.058],
              "npz": [0.044, 0.023, 0.048, 0.044, 0.061], "safetensors": [0.068, 0.074, 0.041, 0.056, 0.079],
              "torch": [0.047, 0.052, 0.053, 0.058, 0.055]}


def _five_formats(ratios):
    """The laptop's five formats in the io table (sync 1 s, async 0.05 s) and `ratios` as the async
    repeats table."""
    def mutate(c, t):
        c["checkpoint"]["formats"] = list(ratios)
        t["tables/io_cost.csv"] = _checkpoint(tuple(ratios))[1]["tables/io_cost.csv"]
        t["tables/async_repeats.csv"] = pd.DataFrame(
            [{"device": "cpu", "format": f, "n_params": 1024, "repeat": i, "async_blocking_s": r,
              "sync_blocking_s": 1.0, "blocking_over_sync": r}
             for f, rs in ratios.items() for i, r in enumerate(rs)])
    return mutate


def test_checkpoint_async_one_stalled_copy_is_judged_with_every_formats_saves(tmp_path):
    c = _find(_run("checkpoint", _five_formats(RUN1_ASYNC), tmp_path), "async_blocking")
    every_save = c["measured"]["async_over_sync_every_save"]
    assert every_save["n"] == 25 and every_save["per_pair"]["hdf5 repeat 3"] == pytest.approx(0.276)
    assert every_save["mean"] == pytest.approx(0.0622, abs=1e-4)
    assert every_save["ci95"][1] == pytest.approx(0.0812, abs=1e-3)  # the stall is in the mean, under 0.10
    # hdf5's own interval, shown, would have straddled on its 5 (t = 2.78): [-0.023, 0.222]
    assert c["measured"]["async_over_sync_per_repeat"]["hdf5"]["ci95"][1] > 0.10
    assert c["status"] == "passed"
    # a stall a training loop would feel on average: 3 of the 25 saves blocked as long as a sync save
    stalled = {**RUN1_ASYNC, "torch": [1.0, 1.0, 1.0, 0.055, 0.05]}
    c = _find(_run("checkpoint", _five_formats(stalled), tmp_path / "stalled"), "async_blocking")
    assert c["status"] == "failed"  # torch's typical save blocks as long as its sync save
    stalled = {**RUN1_ASYNC, "torch": [1.0, 0.047, 0.052, 0.055, 0.05]}
    c = _find(_run("checkpoint", _five_formats(stalled), tmp_path / "one"), "async_blocking")
    assert c["status"] == "straddles" and c["measured"]["holds"]["torch"] is True


def test_offload_hidden_fraction_on_the_trimmed_mean_leaves_two_stalled_steps_of_twelve_out(tmp_path):
    # the laptop's optimizer strategy: 10 steps near 0.8, two stalled by the host (0.19, 0.35)
    steps = "0.80 0.78 0.19 0.81 0.79 0.80 0.77 0.82 0.78 0.80 0.35 0.79"

    def judged(statistic, values=steps):
        def mutate(c, t):
            c["offload"]["claims"]["hidden_statistic"] = statistic
            _offload_steps(t, "optimizer", 0.72, values)
        return _find(_run("offload", mutate, tmp_path), "hidden_fraction")

    c = judged("trimmed_mean")
    ev = c["measured"]["hidden_frac_steps"]["optimizer"]
    assert c["status"] == "passed" and ev["method"].startswith("20 % trimmed mean (2 left out at each end)")
    assert ev["mean"] == pytest.approx(6.31 / 8, abs=1e-4)  # 8 kept: 0.77, 0.78 x2, 0.79 x2, 0.80 x3
    assert "trimmed mean" in c["statement"]
    # the mean of the same steps: the two stalls widen its interval across the line
    assert judged("mean")["status"] == "straddles"
    # four stalled steps of twelve: more than the trimming leaves out, so it straddles again
    assert judged("trimmed_mean", "0.80 0.78 0.19 0.81 0.30 0.80 0.77 0.42 0.78 0.80 0.35 0.79")["status"] \
        == "straddles"


def test_microbatch_timing_claims_on_the_trimmed_mean_leave_a_few_stalled_rounds_out(tmp_path):
    # 20 rounds of one plan: prediction errors near 0.04, two rounds stalled by the host (0.80, 0.77)
    errors = [0.03, 0.05, 0.04, 0.02, 0.06, 0.04, 0.80, 0.03, 0.05, 0.04,
              0.04, 0.05, 0.03, 0.77, 0.04, 0.06, 0.02, 0.05, 0.04, 0.03]

    def judged(statistic):
        def mutate(c, t):
            c["microbatch"]["round_statistic"] = statistic
            d = t["tables/network_rounds.csv"]
            keep = d[~((d["network"] == "resnet18") & (d["plan_id"] == "all/ilp"))]
            rows = pd.DataFrame([{"network": "resnet18", "plan_id": "all/ilp", "variants": "...", "round": r,
                                  "plan_time_s": 1.0, "default_time_s": 1.1, "speedup": 1.1,
                                  "predicted_speedup": 1.08, "prediction_error_scaled_frac": e}
                                 for r, e in enumerate(errors)])
            t["tables/network_rounds.csv"] = pd.concat([keep, rows], ignore_index=True)
        return _find(_run("microbatch", mutate, tmp_path), "algorithm_choice_prediction_within_tolerance")

    c = judged("trimmed_mean")
    ev = c["measured"]["scaled_error_per_round"]["resnet18 [all]"]
    assert c["status"] == "passed" and ev["n"] == 20 and ev["method"].startswith("20 % trimmed mean (4 left")
    assert "trimmed mean" in c["statement"]
    # the mean of the same rounds: the two stalls carry its interval past the 10 % tolerance
    mean = judged("mean")
    assert mean["status"] == "straddles" and mean["measured"]["scaled_error_per_round"]["resnet18 [all]"][
        "ci95"][1] > 0.10


def test_checkpoint_bandwidth_interval_is_over_each_sync_repeats_paired_ratio(tmp_path):
    from hpcdl.studies.checkpoint.tables import bandwidth_repeats

    raw = pd.DataFrame([{"format": f, "mode": m, "process_group": pg, "ranks": 1, "n_params": 1024,
                         "repeat": r, "status": "ok", "device": "cpu", "ceiling_spread": 0.02,
                         "bw_over_ceiling": (0.9 + 0.02 * r) if m == "sync" else float("nan")}
                        for f in ("torch", "npz") for m in ("sync", "async") for r in range(3)
                        for pg in (False, True)])
    pairs = bandwidth_repeats(raw)
    # sync rows from one process only: async points probe no ceiling, DCP ranks points are not compared
    assert len(pairs) == 6 and set(pairs["format"]) == {"torch", "npz"}
    torch_rows = pairs[pairs["format"] == "torch"]
    assert torch_rows["bw_over_ceiling"].tolist() == pytest.approx([0.90, 0.92, 0.94])
    c = _find(_run("checkpoint", lambda c, t: t.__setitem__("tables/bandwidth_repeats.csv", pairs),
                   tmp_path), "bandwidth_vs_ceiling")
    ev = c["measured"]["bw_over_ceiling_per_repeat"]["torch"]
    assert ev["n"] == 3 and ev["mean"] == pytest.approx(0.92)
    assert c["status"] == "straddles"  # 0.90-0.94 over 3 repeats: the interval reaches below 0.90


def test_checkpoint_bandwidth_is_judged_against_the_runs_fastest_fio_moment(tmp_path):
    """#59: fio's per-point ceilings moved 2256-3016 MB/s in one run while the saves held; each repeat
    is judged against the fastest storage moment of any format's sync point at its size in the run."""
    from hpcdl.studies.checkpoint.tables import bandwidth_repeats

    mib = 2**20
    storage_s = {"torch": 0.10, "npz": 0.125}  # the faster of each point's two fio moments
    raw = pd.DataFrame([{"format": f, "mode": "sync", "process_group": False, "ranks": 1, "n_params": n,
                         "repeat": r, "status": "ok", "device": "cpu", "ceiling_spread": 0.02,
                         "state_bytes": 256 * mib, "write_bw_bytes_per_s": 2000 * mib,
                         "storage_ceiling_s": storage_s[f] * (1 if n == 1024 else 0.5),
                         "ceiling_bw_bytes_per_s": 256 * mib / storage_s[f],
                         "bw_over_ceiling": 2000 * storage_s[f] / 256}
                        for f in storage_s for r in range(2) for n in (1024, 2048)])
    pairs = bandwidth_repeats(raw)
    small = pairs[pairs["n_params"] == 1024].set_index(["format", "repeat"])
    # the run's ceiling at this size is torch's 2560 MB/s: npz's point probe (2048 MB/s) is context
    assert small["ceiling_bw_bytes_per_s"].tolist() == pytest.approx([2560 * mib] * 4)
    assert small["bw_over_ceiling"].tolist() == pytest.approx([2000 / 2560] * 4)
    assert small.loc[("npz", 0), "point_bw_over_ceiling"] == pytest.approx(2000 / 2048)
    # each size has its own ceiling: the larger size's probes were twice as fast
    large = pairs[pairs["n_params"] == 2048]
    assert large["bw_over_ceiling"].tolist() == pytest.approx([2000 / 5120] * 4)
    c = _find(_run("checkpoint", lambda c, t: t.__setitem__("tables/bandwidth_repeats.csv", pairs),
                   tmp_path), "bandwidth_vs_ceiling")
    assert c["status"] == "failed"  # 0.78 against the 0.90 line; npz's own point would have read 0.98


def test_checkpoint_defective_ceiling_names_the_bandwidths(tmp_path):
    def faster(c, t):  # safetensors-like: a save at 3 GB/s beside a 2 GB/s ceiling (the faster probe)
        for col, v in (("bw_over_ceiling", 1.5), ("write_bw_bytes_per_s", 3e9),
                       ("ceiling_bw_bytes_per_s", 2e9)):
            _set(t, "tables/io_cost.csv", lambda d: d["mode"] == "sync", col, v)
    c = _find(_run("checkpoint", faster, tmp_path), "bandwidth_vs_ceiling")
    assert c["status"] == "not_measured" and not c["passed"]
    assert "npz writes at 1.50x of it (write 3000 MB/s, ceiling 2000 MB/s)" in c["reason"]
    m = c["measured"]
    assert m["median_mb_per_s"]["npz"] == {"write": 3000.0, "ceiling": 2000.0}
    assert set(m["defective_ceiling_repeats"]) == {"torch its median", "npz its median"}
    assert "fastest of these probes at this size in this run" in c["statement"]


# ------------------------------------------------------------------------------------------- hpo
HPO_CFG = {
    "hpo": {
        "grid": {"workers": [1, 2], "optimizer": ["adam", "sgd"], "batch_size": [32], "epochs": [1]},
        "pruner": "median",
        "sampler": "random",
        "claims": {"min_speedup_efficiency": 0.8, "min_best_test_acc": 0.85, "min_pruning_saving": 0.30,
                   "max_pruning_loss_pts": 1.0},
    }
}


def _hpo() -> tuple[dict, dict]:
    tables = {
        "tables/grid_scaling.csv": pd.DataFrame(
            {
                "workers": [1, 2],
                "n_trials": [2, 2],
                "elapsed_s": [10.0, 5.5],
                "busy_workers": [1.0, 1.8],
                "mean_trial_train_s": [5.0, 5.0],
            }
        ),
        "tables/best_config.csv": pd.DataFrame(
            {
                "study": ["random", "grid-2w"],
                "val_acc": [0.9, 0.8],
                "test_acc": [0.88, np.nan],
                "test_n": [10000, np.nan],
                "overall_best": [True, False],
            }
        ),
        "tables/pruning.csv": pd.DataFrame(
            [
                {
                    "baseline": "random",
                    "pruned": "random-median",
                    "baseline_trial_epochs": 100,
                    "pruned_trial_epochs": 50,
                    "saving_fraction": 0.5,
                    "loss_pts": 0.5,
                }
            ]
        ),
    }
    return copy.deepcopy(HPO_CFG), tables


def _grid_repeats(speedups: list[float], drop=(), short=()):
    """hpo.grid.repeats = len(speedups): per repeat, a 10 s grid on 1 worker and one on 2 workers this
    many times faster (tables/grid_scaling.csv); `drop`: (workers, repeat) rows left out, `short`: ones
    that finished one trial of two."""
    def mutate(c, t):
        c["hpo"]["grid"]["repeats"] = len(speedups)
        rows = [{"workers": w, "repeat": r, "n_trials": 1 if (w, r) in short else 2,
                 "elapsed_s": 10.0 if w == 1 else 10.0 / s, "busy_workers": float(w),
                 "mean_trial_train_s": 5.0}
                for r, s in enumerate(speedups) for w in (1, 2) if (w, r) not in drop]
        t["tables/grid_scaling.csv"] = pd.DataFrame(rows)
    return mutate


# --------------------------------------------------------------------------------------- shuffle
N, M = 400, 2
SHUFFLE_CFG = {
    "shuffle": {
        "n_train": N,
        "epochs": 2,
        "tolerance_pt": 1.0,
        "alpha": 0.1,
        "seeds": [0, 1, 2],
        "claim_q": 0.1,
        "grids": [{"world_sizes": [M], "qs": [0, 0.1, 1], "partitionings": ["random", "skewed"]}],
        "kakurenbo": {"fractions": [0, 0.2], "world_size": M, "min_net_saving": 0.05},
    }
}
SEEDS = (0, 1, 2)
GLOBAL_ACC = (0.80, 0.81, 0.79)
KK = f"kakurenbo-M{M}"


def _point(strategy, q, part):
    return f"{strategy}-q{q:g}-{part}-M{M}"


def _final_row(strategy, q, part, acc, seed=0, f=0.0, time_s=10.0, shown_as=None, point=None, rnd=None,
               slot=0):
    label = strategy if strategy != "partial" else f"partial-{q:g}"
    held = int(np.ceil(N / M) + q * N / M) if strategy == "partial" else N // M
    return {
        "point": point or _point(strategy, q, part),
        "strategy": strategy,
        "q": q,
        "label": label,
        "partitioning": shown_as or part,
        "world_size": M,
        "seed": seed,
        "kakurenbo_fraction": f,
        "round": SEEDS.index(seed) if rnd is None else rnd,
        "slot": slot,
        "final_val_acc": acc,
        "train_time_s": time_s,
        "train_compute_total_s": 0.9 * time_s,
        "overhead_total_s": 0.03 * time_s if f > 0 else 0.0,
        "skipped_fraction": f * 0.9,
        "samples_held_max": held,
        "held_rows_max": held + (int(q * N / M) if strategy == "partial" else 0),
    }


def _sweep_rows(strategy, q, part, gaps_pt):
    """One row per seed, `gaps_pt[i]` percentage points from global's accuracy of that seed."""
    return [_final_row(strategy, q, part, g + d / 100, seed=s) for s, g, d in zip(SEEDS, GLOBAL_ACC, gaps_pt,
                                                                                   strict=True)]


def _kk_rows(f, times, acc_change_pt=(0.0, 0.0, 0.0), compute_s=None, slot=1):
    """KAKURENBO runs of fraction f; `compute_s` (per round) when the compute saved is not what the wall
    time says (a cost outside the method's account)."""
    rows = []
    computes = compute_s or [None] * len(SEEDS)
    for s, g, t, d, c in zip(SEEDS, GLOBAL_ACC, times, acc_change_pt, computes, strict=True):
        for p in ("random", "skewed"):
            row = _final_row("global", 1.0, "shared", g + d / 100, seed=s, f=f, time_s=t, shown_as=p,
                             point=KK, slot=slot)
            if c is not None:
                row["train_compute_total_s"] = c
            rows.append(row)
    return rows


def _shuffle() -> tuple[dict, dict]:
    final = (_sweep_rows("local", 0.0, "random", (0.1, -0.1, 0.0))
             + _sweep_rows("partial", 0.1, "random", (0.0, 0.2, -0.1))
             + _sweep_rows("local", 0.0, "skewed", (-20, -19, -21))
             + _sweep_rows("partial", 0.1, "skewed", (-0.1, 0.1, -0.2)))
    for part in ("random", "skewed"):  # the global baseline is shown in both partitionings
        final += [_final_row("global", 1.0, "shared", g, seed=s, shown_as=part)
                  for s, g in zip(SEEDS, GLOBAL_ACC, strict=True)]
    final += [_final_row("global", 1.0, "shared", 0.5, seed=0, shown_as=p, point=KK, rnd=-1)  # warm-up
              for p in ("random", "skewed")]
    # each round: F=0, F>0 ..., F=0 (slot 9: after any F a case adds)
    final += (_kk_rows(0.0, (10.0, 10.2, 9.9), slot=0) + _kk_rows(0.0, (10.1, 10.0, 10.0), slot=9)
              + _kk_rows(0.2, (8.0, 8.3, 7.9), (-0.1, -0.2, 0.0)))
    epochs = [
        {
            "point": _point("partial", 0.1, part),
            "q": 0.1,
            "seed": s,
            "epoch": e,
            "samples_sent": 0.1 * N,
            "bytes_sent": 0.1 * N * SAMPLE_BYTES,
            "bytes_recv": 0.1 * N * SAMPLE_BYTES,
        }
        for part in ("random", "skewed")
        for s in SEEDS
        for e in range(2)
    ]
    points = sorted({r["point"] for r in final})
    tables = {
        "tables/final.csv": pd.DataFrame(final),
        "tables/epochs.csv": pd.DataFrame(epochs),
        "raw/points.csv": pd.DataFrame({"point": points, "status": "ok", "error": ""}),
    }
    return copy.deepcopy(SHUFFLE_CFG), tables


def _shuffle_failed(t, point, error="RankFailure: ... on 2 ranks failed (exit 1)"):
    t["tables/final.csv"] = t["tables/final.csv"][t["tables/final.csv"]["point"] != point]
    t["tables/epochs.csv"] = t["tables/epochs.csv"][t["tables/epochs.csv"]["point"] != point]
    pts = t["raw/points.csv"]
    pts.loc[pts["point"] == point, ["status", "error"]] = [
        "failed",
        f"Traceback (most recent call last):\n{error}",
    ]


def _final_set(t, point, col, value, part=None):
    df = t["tables/final.csv"]
    df.loc[(df["point"] == point) & ((df["partitioning"] == part) if part else True), col] = value


def _shuffle_gaps(strategy, q, part, gaps_pt):
    """Replace a sweep point's per-seed accuracies by global's plus `gaps_pt`."""
    def mutate(c, t):
        final = t["tables/final.csv"]
        final = final[final["point"] != _point(strategy, q, part)]
        t["tables/final.csv"] = pd.concat([final, pd.DataFrame(_sweep_rows(strategy, q, part, gaps_pt))],
                                          ignore_index=True)
    return mutate


def _kk_times(f, times, acc_change_pt=(0.0, 0.0, 0.0), compute_s=None):
    """Replace the KAKURENBO runs of fraction f (adding f to the config if new)."""
    def mutate(c, t):
        fractions = c["shuffle"]["kakurenbo"]["fractions"]
        c["shuffle"]["kakurenbo"]["fractions"] = sorted({*fractions, f})
        final = t["tables/final.csv"]
        final = final[~((final["point"] == KK) & np.isclose(final["kakurenbo_fraction"], f))]
        slot = 2 if f != 0.2 else 1
        rows = _kk_rows(f, times, acc_change_pt, compute_s, slot=slot)
        t["tables/final.csv"] = pd.concat([final, pd.DataFrame(rows)], ignore_index=True)
    return mutate


def _two_fractions(cfg, t):
    """F=0.1 saves time, F=0.2 clearly loses it: a claim over 'any F' would pass, over every F must not.
    F=0.2 skips 16 % of the work for 3 % overhead, so it is in the regime: a cost outside the method's
    account (here the timed compute: 7.2 s, not 8.1 s) ate it."""
    _kk_times(0.1, (9.2, 9.4, 9.1))(cfg, t)
    _kk_times(0.2, (10.3, 10.5, 10.2), compute_s=(7.2, 7.35, 7.1))(cfg, t)


# --------------------------------------------------------------------------------------- spatial
SPATIAL_CFG = {
    "spatial": {
        "batch_size": 2,
        "iterations": 3,
        "repeats": 1,
        "strong": {"grid": 16, "layouts": [[1, 1, 1], [1, 2, 1]]},
        "weak": {"grid": 8, "layouts": []},
        "hybrid": {"grid": 16, "layouts": []},
        "train": {"grid": 12, "layout": [1, 1, 1], "iterations": 6, "batch_size": 2},
        "held_out": ["train-d1x1x1"],  # off the strong grid: the oracle's out-of-sample run
        "exactness": {"tolerance": 1e-10, "layouts": [[1, 2, 1]]},
        "claims": {"min_efficiency": 0.85, "max_oracle_error": 0.15, "loss_drop": 0.8},
        "extrapolate": {"grid": 512, "batch_size": 16, "gpus": [4, 16]},
        "machine": {"peak_tflops": 7.8, "memory_gb": 16},
        "gpu_calibration": {"tolerance": 0.10},
    }
}
RUNS = ["strong-d1x1x1", "strong-d1x2x1", "ceiling-d1x2x1", "train-d1x1x1"]


def _spatial() -> tuple[dict, dict]:
    # a contested pick: filter also fits, slower (a pick no other family contests is not measured)
    ext = [
        {"gpus": g, "family": fam, "strategy": strat, "chosen": chosen, "feasible": feas, "total_s": t}
        for g in (4, 16)
        for fam, strat, chosen, feas, t in (
            ("data", "data", False, False, 1.0),
            ("data x spatial", f"data x spatial {g // 4}x4", True, True, 1.0),
            ("filter", "filter", False, True, 2.0),
        )
    ]
    tables = {
        "tables/runs.csv": pd.DataFrame(
            {
                "run": RUNS,
                "ranks": [1, 2, 2, 1],
                # speedup 1.82 against a ceiling of 2.0: efficiency 0.91
                "time_per_iter_s": [1.0, 0.55, 0.5, 1.0],
                "oracle_error": [0.05, -0.10, float("nan"), 0.05],
            }
        ),
        "tables/calibration_fit.csv": pd.DataFrame({"cores": [2]}),
        "tables/exactness.csv": pd.DataFrame(
            {
                "layout": ["1x2x1"] * 2,
                "err_loss": [1e-15, 2e-15],
                "err_grad_input": [1e-14, 1e-14],
                "err_grad_params": [3e-14, 1e-14],
            }
        ),
        "tables/loss.csv": pd.DataFrame(
            {"run": "train-d1x1x1", "iteration": range(6), "loss": [1.0, 0.9, 0.7, 0.5, 0.4, 0.3]}
        ),
        "tables/extrapolation.csv": pd.DataFrame(ext),
        "raw/runs.csv": pd.DataFrame({"run": RUNS, "status": "ok", "error": ""}),
        # whole one-GPU steps of a calibration run against the oracle's compute sum (#26)
        "tables/compute_check.csv": pd.DataFrame(
            {"network": ["cosmoflow", "unet3d"], "depth": [4, 32], "height": [2, 1],
             "measured_step_s": [0.40, 0.20], "oracle_compute_s": [0.37, 0.21], "error": [-0.075, 0.05],
             "gpu": "NVIDIA H100 80GB HBM3"}),
    }
    return copy.deepcopy(SPATIAL_CFG), tables


def _spatial_failed(t, run, error="HaloExchangeError: rank 0: halo exchange (recv from rank 1) failed"):
    runs = t["tables/runs.csv"]
    t["tables/runs.csv"] = runs[runs["run"] != run]
    raw = t["raw/runs.csv"]
    raw.loc[raw["run"] == run, ["status", "error"]] = [
        "failed",
        f"Traceback (most recent call last):\n{error}",
    ]


def _spatial_disturbed(t, run):
    """Every timed phase of `run` ran under 1.2 cores of other load; the other runs' phases were quiet."""
    runs = t["tables/runs.csv"]
    hit = runs["run"] == run
    runs["phases"] = 2
    runs["phases_disturbed"] = np.where(hit, 2, 0)
    runs["other_load_cores"] = np.where(hit, 1.2, 0.05)
    runs["disturbed"] = hit


def _spatial_pick(t, strategy):
    ext = t["tables/extrapolation.csv"]
    top = ext["gpus"] == 16
    ext.loc[top, "chosen"] = ext.loc[top, "strategy"] == strategy


def _oracle_repeats(per_run: dict[str, list[float]]):
    """Kept repeats of each run with these oracle errors (tables/oracle_repeats.csv)."""
    rows = [{"run": r, "repeat": i, "oracle_error": e}
            for r, errs in per_run.items() for i, e in enumerate(errs)]
    return lambda c, t: t.__setitem__("tables/oracle_repeats.csv", pd.DataFrame(rows))


def _efficiency_repeats(efficiencies: list[float]):
    """Kept repeats of the 2-rank strong run and its ceiling whose ceiling/2-rank time ratios (the
    per-repeat efficiencies) are these (tables/repeat_times.csv)."""
    rows = [row for i, e in enumerate(efficiencies)
            for row in ({"run": "strong-d1x1x1", "repeat": i, "time_per_iter_s": 1.0},
                        {"run": "ceiling-d1x2x1", "repeat": i, "time_per_iter_s": 0.5},
                        {"run": "strong-d1x2x1", "repeat": i, "time_per_iter_s": 0.5 / e})]
    return lambda c, t: t.__setitem__("tables/repeat_times.csv", pd.DataFrame(rows))


def _all_held_out(errors: dict[str, float], bound: float = 0.10):
    """Every training run held out, with these errors: the mean can pass while one run misses."""
    def mutate(c, t):
        c["spatial"]["held_out"] = list(errors)
        c["spatial"]["claims"]["max_oracle_error"] = bound
        for run, e in errors.items():
            _set(t, "tables/runs.csv", lambda d, run=run: d["run"] == run, "oracle_error", e)
    return mutate


def _real_extrapolation(**extrapolate):
    """configs/default.yaml's spatial block with these spatial.extrapolate keys, through validate_config,
    and the oracle's extrapolation table it produces (tables.extrapolation)."""
    from hpcdl.studies.spatial.tables import extrapolation

    raw = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    raw["spatial"]["extrapolate"].update(extrapolate)
    block = validate_config(raw)["spatial"]

    def mutate(c, t):
        c["spatial"].update(extrapolate=block["extrapolate"], machine=block["machine"])
        t["tables/extrapolation.csv"] = extrapolation(block)
    return mutate


# ---------------------------------------------------------------------------------------- hetmem
HETMEM_CFG = {"hetmem": {"apps": [{"name": "stream", "size": 64, "iters": 1},
                                  {"name": "cg", "size": 8, "iters": 1}],
                         "sample_every": 10, "agent": {"capacities": [0.25, 0.75]}, "error_ceiling": 0.05,
                         "speedup_floor": 100, "bound_tolerance": 0.05}}


def _hetmem() -> tuple[dict, dict]:
    apps = ("stream", "cg")
    val = pd.DataFrame([{"app": a, "placement": p, "sample_every": n, "error": e, "reference": "simulated",
                         "estimate_s": 1e-5, "reference_s": 0.5}
                        for a in apps for n in (1, 10) for p, e in (("all_fast", 0.0), ("object:x", 0.03))])
    # one estimate 10 us; the kernel's compute phase 3 ms (300x), its whole process 0.15 s (98 %
    # start-up); one simulated reference run 0.5 s (50000x)
    speed = pd.DataFrame([{"app": a, "estimate_s": 1e-5, "native_run_s": 0.15, "native_compute_s": 3e-3,
                           "simulated_reference_s": 0.5, "reference": "native run"} for a in apps])
    pol = pd.DataFrame([{"app": a, "capacity": c, "policy": p, "gap_to_all_fast": 0.02 if c == 0.75 else 0.3}
                        for a in apps for c in (0.25, 0.75) for p in ("greedy", "random", "ppo")])
    tracing = pd.DataFrame([{"app": a, "status": "ok", "error": ""} for a in apps])
    return copy.deepcopy(HETMEM_CFG), {"tables/validation.csv": val, "tables/speed.csv": speed,
                                       "tables/policies.csv": pol, "tables/tracing.csv": tracing}


def _hetmem_failed(t, app, error="TraceError: /r/cg.lackey: truncated trace at byte offset 12"):
    t["tables/tracing.csv"] = t["tables/tracing.csv"].assign(
        status=lambda d: np.where(d["app"] == app, "failed", "ok"),
        error=lambda d: np.where(d["app"] == app, "Traceback\n" + error, ""))
    for name in ("tables/validation.csv", "tables/speed.csv", "tables/policies.csv"):
        t[name] = t[name][t[name]["app"] != app]


def test_hetmem_error_is_judged_per_app_and_names_the_worst_app(tmp_path):
    def stream_off(c, t):
        _set(t, "tables/validation.csv", lambda d: (d["placement"] == "object:x") & (d["app"] == "stream"),
             "error", -0.16)

    c = _find(_run("hetmem", stream_off, tmp_path), "estimate_error_le_5pct")
    m = c["measured"]
    assert c["status"] == "failed" and m["holds"] == {"stream": False, "cg": True}
    assert m["worst_app"] == {"app": "stream", "mean_abs_error": 0.08, "max_abs_error": 0.16}
    assert m["per_app_mean_abs_error"]["cg"] == pytest.approx(0.015)


def test_hetmem_speed_compares_an_estimate_with_the_kernel_and_the_simulator_not_process_start_up(tmp_path):
    c = _find(_run("hetmem", None, tmp_path), "estimate_100x_faster")
    m = c["measured"]
    assert c["status"] == "passed" and "process start-up excluded" in c["statement"]
    assert "against full-system simulators only" in c["statement"]
    assert m["speedup_vs_kernel"] == {"stream": 300.0, "cg": 300.0}  # 3 ms compute phase / 10 us estimate
    assert m["speedup_vs_simulator"] == {"stream": 50000.0, "cg": 50000.0}
    assert m["process_startup_share"] == {"stream": 0.98, "cg": 0.98}
    assert m["holds"] == {"stream vs kernel": True, "stream vs simulator": True, "cg vs kernel": True,
                          "cg vs simulator": True}

    def startup_bound(c, t):  # the kernel computes for 0.5 ms of a 0.15 s process: 15000x the process
        _set(t, "tables/speed.csv", lambda d: d["app"] == "cg", "native_compute_s", 5e-4)
    c = _find(_run("hetmem", startup_bound, tmp_path / "startup"), "estimate_100x_faster")
    m = c["measured"]
    assert c["status"] == "failed" and m["holds"]["cg vs kernel"] is False and m["holds"]["cg vs simulator"]
    assert m["speedup_vs_kernel"]["cg"] == 50.0 and m["speedup_vs_process_run"]["cg"] == 15000.0


# ------------------------------------------------------------------------------------ microbatch
MB_CFG = {"microbatch": {"networks": ["alexnet", "resnet18"], "policies": ["undivided", "all"],
                         "prediction_tolerance": 0.10, "exact_tolerance": 1e-5, "device": "cuda",
                         "cudnn": {"engines": True, "limits_mib": [8, 512]}}}
# distinct plans: alexnet's policies and planners all give one plan; resnet18's two policies two
MB_PLANS = {("alexnet", "undivided"): "undivided/dp", ("alexnet", "all"): "undivided/dp",
            ("resnet18", "undivided"): "undivided/dp", ("resnet18", "all"): "all/ilp"}


def _mb_exact(t: dict, cfg: dict | None = None, reference: str | None = None, **row0) -> None:
    """The first exactness row's errors set (its excess over the default recomputed), and the config's
    exact_reference where given."""
    d = t["tables/exactness.csv"]
    for col, v in row0.items():
        d.loc[0, col] = v
    d.loc[0, "excess_fp64"] = d.loc[0, "err_fp64"] - d.loc[0, "default_err_fp64"]
    if reference:
        cfg["microbatch"]["exact_reference"] = reference


def _microbatch() -> tuple[dict, dict]:
    rows = [{"network": n, "policy": p, "planner": pl, "device": "cuda", "plan_id": MB_PLANS[(n, p)],
             "shared_by": "...", "keeps_default": False, "layers_changed": 2, "divided_kernels": 0,
             "kernels": 12, "rounds": 3, "measured_plan_s": 1.0, "measured_default_s": 1.1,
             "predicted_plan_s": 1.02, "predicted_default_s": 1.1, "measured_speedup": 1.1,
             "predicted_speedup": 1.08, "prediction_error_frac": 0.02, "prediction_error_scaled_frac": 0.0,
             "max_rel_err": 1e-6, "seed_speedup_v100": 1.6}
            for n in ("alexnet", "resnet18") for p in ("undivided", "all") for pl in ("dp", "ilp")]
    rounds = [{"network": n, "plan_id": pid, "variants": "...", "round": r, "plan_time_s": 1.0,
               "default_time_s": s, "speedup": s, "predicted_speedup": 1.08,
               "prediction_error_scaled_frac": 1.08 / s - 1}
              for n, pid in dict.fromkeys((n, pid) for (n, _), pid in MB_PLANS.items())
              for r, s in enumerate((1.10, 1.12, 1.08))]
    exact = [{"network": n, "what": "candidate onednn-nchw", "kernel": k, "max_rel_err": 2e-6,
              "err_fp64": 3e-7, "default_err_fp64": 2e-7, "excess_fp64": 1e-7, "layers": 5}
             for n in ("alexnet", "resnet18") for k in ("forward", "backward_data", "backward_filter")]
    tables = {"tables/network_speedup.csv": pd.DataFrame(rows),
              "tables/network_rounds.csv": pd.DataFrame(rounds), "tables/exactness.csv": pd.DataFrame(exact),
              "tables/failures.csv": pd.DataFrame(columns=["network", "table", "error"]),
              # μ-cuDNN's own experiment: HAND-MADE engine tables run at their benchmarked times
              **microbatch_cudnn_tables.study_tables()}
    return copy.deepcopy(MB_CFG), tables


def _mb_rounds(t, col, values, network="resnet18", plan_id="all/ilp"):
    """Give one distinct plan's rounds these per-round values of `col`."""
    d = t["tables/network_rounds.csv"]
    d.loc[(d["network"] == network) & (d["plan_id"] == plan_id), col] = list(values)


def _mb_cudnn(t, table, planner, col, value, label="8 MiB", kernel=None):
    """Set `col` of alexnet's cuDNN rows at `label` by `planner` (one kernel's, or the network's)."""
    d = t[f"tables/cudnn_{table}.csv"]
    sel = (d["network"] == "alexnet") & (d["planner"] == planner) & (d["limit_label"] == label)
    if kernel is not None:
        sel &= (d["layer"] + "/" + d["kernel"]) == kernel
    d.loc[sel, col] = value


def _mb_cudnn_failed(t, network="resnet18", error="Traceback\nRuntimeError: resnet18: no cuDNN plan ran"):
    for name in ("tables/cudnn_limits.csv", "tables/cudnn_networks.csv"):
        t[name] = t[name][t[name]["network"] != network]
    row = pd.DataFrame([{"network": network, "table": "cudnn_limits", "error": error}])
    t["tables/failures.csv"] = pd.concat([row, t["tables/failures.csv"]], ignore_index=True)  # listed first


def _mb_failed(t, network="resnet18", error="Traceback\nWorkspaceError: layer conv1 (forward): too small"):
    for name in ("tables/network_speedup.csv", "tables/network_rounds.csv", "tables/exactness.csv"):
        t[name] = t[name][t[name]["network"] != network]
    t["tables/failures.csv"] = pd.DataFrame([{"network": network, "table": "execution", "error": error}])


# ------------------------------------------------------------------------------------- malleable
MALLEABLE_CFG = {
    "malleable": {
        "cores": 2,
        "repeats": 3,
        "claims": {"keep_over_follow_min": 1.0, "over_rigid_max": 1.0},
        "response": {"methods": ["api", "signal", "quota"]},
        "oversub": {"modes": ["keep", "follow"], "quotas": [2, 1, 0.5], "phase_iterations": 8},
        "cosched": {"policies": ["rigid", "equal", "proportional"]},
    }
}
MALLEABLE_DRIFT = (1.0, 1.03, 0.98)  # each repeat's machine speed: it lands on every variant of the repeat


def _malleable() -> tuple[dict, dict]:
    points = [{"experiment": e, "variant": v, "repeat": r, "status": "ok", "error": "", "reason": ""}
              for e, vs, reps in (("response", ("api", "signal", "quota"), (0,)),
                                  ("oversub", ("keep", "follow"), (0, 1, 2)),
                                  ("cosched", ("rigid", "equal", "proportional"), (0, 1, 2)))
              for v in vs for r in reps]
    response = [{"variant": m, "outcome": "applied", "lag_iters": 0, "latency_over_iter": 0.9}
                for m in ("api", "signal", "quota") for _ in range(2)]
    # keep is 1 % slower in the uncut phase (noise), well slower under a cut quota
    oversub = [{"repeat": r, "mode": m, "phase": i, "quota_cores": q,
                "threads": 2 if m == "keep" else max(1, round(q)),
                "iter_s": t * drift * (1 + 0.01 * (m == "keep"))}
               for r, drift in enumerate(MALLEABLE_DRIFT)
               for m, ts in (("keep", (0.045, 0.09, 0.2)), ("follow", (0.045, 0.068, 0.14)))
               for i, (q, t) in enumerate(zip((2.0, 1.0, 0.5), ts, strict=True))]
    runs = (("rigid", 8.0, 3.0), ("equal", 7.0, 2.4), ("proportional", 7.2, 2.8))
    policies = pd.DataFrame([{"policy": p, "repeat": r, "status": "ok", "makespan_s": ms * drift,
                              "mean_turnaround_s": ta * drift * (1 + 0.02 * r * (p != "rigid")),
                              "jobs_failed": 0}
                             for r, drift in enumerate(MALLEABLE_DRIFT) for p, ms, ta in runs])
    tables = {"raw/points.csv": pd.DataFrame(points), "tables/response.csv": pd.DataFrame(response),
              "tables/oversub.csv": pd.DataFrame(oversub), "tables/policies.csv": policies}
    return copy.deepcopy(MALLEABLE_CFG), tables


def _malleable_ratios(table, sel, col, values):
    """Set `col` of the rows `sel` picks, one value per repeat 0, 1, 2."""
    def mutate(c, t):
        d = t[table]
        for r, v in enumerate(values):
            d.loc[sel(d) & (d["repeat"] == r), col] = v
    return mutate


def _malleable_point(t, experiment, variant, status="failed",
                     error="RuntimeError: driver exited with code 1"):
    pts = t["raw/points.csv"]
    sel = (pts["experiment"] == experiment) & (pts["variant"] == variant)
    pts.loc[sel, "status"] = status
    pts.loc[sel, "reason" if status == "skipped" else "error"] = error


# ------------------------------------------------------------------------------------------ offload
OFFLOAD_CFG = {"offload": {"strategies": ["none", "optimizer", "activations", "both", "zero_offload"],
                           "device": "cpu", "model": {"depths": [4, 8]}, "capacity": {"budget_mb": 24},
                           "claims": {"memory_max_ratio": 0.3, "hidden_min": 0.7, "capacity_min_ratio": 3.0,
                                      "zero_memory_max_ratio": 0.3, "zero_capacity_min_ratio": 7.5,
                                      "cross_check_factor": 1.5, "slow_tier_min_slowdown": 1.5}}}
OFFLOAD_RSS = "anonymous RSS high-water mark"
# each measured step's hidden fraction around the point's: 95 % intervals 0.80 +- 0.026, 0.90 +- 0.026,
# 0.75 +- 0.013
OFFLOAD_STEPS = {0.8: "0.78 0.80 0.82 0.80", 0.9: "0.88 0.90 0.92 0.90", 0.75: "0.74 0.75 0.76 0.75"}


def _offload() -> tuple[dict, dict]:
    rows = []
    for d in (4, 8):
        for s, mem, hidden in (("none", 100, np.nan), ("optimizer", 60, 0.8), ("activations", 50, 0.9),
                               ("both", 25, 0.75), ("zero_offload", 28, 0.8)):
            # measured peak (RSS on CPU) and the registry's, a little below it
            rows.append({"strategy": s, "depth": d, "tier": "ram>file", "peak_fast_bytes": mem * d,
                         "peak_measured_by": OFFLOAD_RSS, "peak_accounted_bytes": mem * d * 4 // 5,
                         "peak_extra_rss_bytes": mem * d, "step_s": 0.1, "hidden_frac": hidden,
                         "hidden_frac_steps": OFFLOAD_STEPS.get(hidden, ""),
                         "weights_sha256": f"sha-{d}", "status": "ok", "error": ""})
    caps = pd.DataFrame({"strategy": ["none", "optimizer", "activations", "both", "zero_offload"],
                         "max_depth": [7, 8, 19, 29, 60],
                         "max_params": [7, 8, 19, 29, 60], "budget_mb": 24, "capped_at_max_depth": False,
                         "peak_fast_bytes_at_max": 24 << 20, "peak_accounted_bytes_at_max": 20 << 20,
                         "peak_measured_by": OFFLOAD_RSS, "status": "ok"})
    # the slow tier 5x (write) and 3.3x (read) slower than the fast one, as a device would be
    tiers = pd.DataFrame([{"device": "cpu", "tier_pair": "ram>file", "io_mode": "dontneed", "tier": t,
                           "medium": "RAM" if t == "fast" else "files", "direction": d,
                           "probe_bytes": 64 << 20, "points": 8, "bandwidth_bytes_per_s": bw,
                           "bandwidth_min_bytes_per_s": bw, "bandwidth_max_bytes_per_s": bw,
                           "slowdown": 10e9 / bw if t == "slow" else np.nan}
                          for t, d, bw in (("fast", "write", 10e9), ("fast", "read", 10e9),
                                           ("slow", "write", 2e9), ("slow", "read", 3e9))])
    tables = {"tables/tradeoff.csv": pd.DataFrame(rows), "tables/capacity.csv": caps,
              "tables/tiers.csv": tiers,
              "tables/failures.csv": pd.DataFrame(columns=["kind", "point", "error"])}
    return copy.deepcopy(OFFLOAD_CFG), tables


def _offload_slow_tier(t, direction, bw):
    """The slow tier's `direction` measured at `bw` bytes/s (the fast tier's is 10 GB/s)."""
    sel = lambda d: (d["tier"] == "slow") & (d["direction"] == direction)  # noqa: E731
    _set(t, "tables/tiers.csv", sel, "bandwidth_bytes_per_s", bw)
    _set(t, "tables/tiers.csv", sel, "slowdown", 10e9 / bw)


def _offload_steps(t, strategy, hidden, steps, depth=8):
    sel = lambda d: (d["strategy"] == strategy) & (d["depth"] == depth)  # noqa: E731
    _set(t, "tables/tradeoff.csv", sel, "hidden_frac", hidden)
    _set(t, "tables/tradeoff.csv", sel, "hidden_frac_steps", steps)


def _offload_failed(t, strategy, depth, error="BudgetExceeded: fast tier over budget"):
    tr = t["tables/tradeoff.csv"]
    t["tables/tradeoff.csv"] = tr[~((tr["strategy"] == strategy) & (tr["depth"] == depth))]
    t["tables/failures.csv"] = pd.DataFrame(
        [{"kind": "steps", "point": f"strategy={strategy}, depth={depth}, width=256", "error": error}])


def _offload_failed_also(t):
    """The largest depth both ran is then 4: fail it too, so no depth has both."""
    tr = t["tables/tradeoff.csv"]
    t["tables/tradeoff.csv"] = tr[~((tr["strategy"] == "both") & (tr["depth"] == 4))]


def _offload_capacity_failed(t, strategy, error="SlowTierError: slow-tier directory /x is full"):
    caps = t["tables/capacity.csv"]
    t["tables/capacity.csv"] = caps[caps["strategy"] != strategy]
    t["tables/failures.csv"] = pd.DataFrame(
        [{"kind": "capacity", "point": f"strategy={strategy}, width=256, budget_mb=24", "error": error}])


BUILDERS = {"checkpoint": _checkpoint, "hpo": _hpo, "shuffle": _shuffle, "spatial": _spatial,
            "hetmem": _hetmem, "microbatch": _microbatch, "malleable": _malleable, "offload": _offload}

# (study, declared claim id, outcome, mutate(cfg, tables), words the reason must contain)
CASES = [
    # checkpoint
    ("checkpoint", "async_blocking", "passed", None, None),
    # per format on the interval of its per-repeat ratios where it has 2 or more repeats
    ("checkpoint", "async_blocking", "passed", _async_repeats(npz=[0.04, 0.05, 0.045]), None),
    ("checkpoint", "async_blocking", "straddles", _async_repeats(npz=[0.06, 0.23, 0.05]), None),
    ("checkpoint", "async_blocking", "failed", _async_repeats(npz=[0.30, 0.32, 0.31]), None),
    ("checkpoint", "async_blocking", "failed",
     lambda c, t: _set(t, "tables/io_cost.csv", lambda d: (d["format"] == "npz") & (d["mode"] == "async"),
                       "blocking_s", 0.5), None),
    ("checkpoint", "async_blocking", "not_measured",
     lambda c, t: _io_failed(t, "npz", "async", "Traceback\nOSError: [Errno 28] No space left on device"),
     ["npz", "mode=async", "No space left on device"]),
    ("checkpoint", "bandwidth_vs_ceiling", "passed", None, None),
    ("checkpoint", "bandwidth_vs_ceiling", "failed",
     lambda c, t: _set(t, "tables/io_cost.csv", lambda d: d["ranks"] == 1, "bw_over_ceiling", 0.6), None),
    ("checkpoint", "bandwidth_vs_ceiling", "not_measured",
     lambda c, t: (
         _set(t, "tables/io_cost.csv", lambda d: d["ranks"] == 1, "bw_over_ceiling", 0.6),
         _io_failed(t, "npz", "sync", "RuntimeError: scratch limit exceeded"),
     ), ["npz", "scratch limit exceeded"]),
    # a save faster than its ceiling by more than the ceiling's own spread (its two fio runs' disagreement)
    # is a defect of the ceiling: that format reads not measured, with both numbers (#59)
    ("checkpoint", "bandwidth_vs_ceiling", "not_measured",
     lambda c, t: _set(t, "tables/io_cost.csv", lambda d: (d["mode"] == "sync") & (d["ranks"] == 1),
                       "bw_over_ceiling", 1.10),
     ["ceiling is defective", "npz writes at 1.10x", "above 1 + its spread 0.040"]),
    # within the ceiling's own spread above 1 is at the ceiling: judged against the threshold
    ("checkpoint", "bandwidth_vs_ceiling", "passed",
     lambda c, t: _set(t, "tables/io_cost.csv", _ckpt_sync("npz"), "bw_over_ceiling", 1.03), None),
    # the thresholds come from the config
    ("checkpoint", "bandwidth_vs_ceiling", "failed",
     lambda c, t: c["checkpoint"]["claims"].__setitem__("bandwidth_min_ratio", 0.97), None),
    # judged on each format's interval of its per-repeat ratios: one format's above the line passes
    ("checkpoint", "bandwidth_vs_ceiling", "passed", _bw_repeats(torch=[0.95, 0.96, 0.97]), None),
    # a mean above the line with a wide spread (a noisy probe) straddles: noise never eases a pass
    ("checkpoint", "bandwidth_vs_ceiling", "straddles", _bw_repeats(torch=[0.80, 1.00, 1.02]), None),
    ("checkpoint", "bandwidth_vs_ceiling", "failed", _bw_repeats(torch=[0.60, 0.62, 0.61]), None),
    ("checkpoint", "async_blocking", "failed",
     lambda c, t: c["checkpoint"]["claims"].__setitem__("async_max_ratio", 0.04), None),
    ("checkpoint", "resume_bit_identical", "passed", None, None),
    ("checkpoint", "resume_bit_identical", "failed",
     lambda c, t: _set(t, "tables/resume.csv", lambda d: d["format"] == "npz", "bit_identical", False), None),
    ("checkpoint", "resume_bit_identical", "not_measured",
     lambda c, t: t.__setitem__(
         "tables/resume.csv",
         t["tables/resume.csv"].assign(
             status=["ok", "failed"],
             bit_identical=[True, np.nan],
             error=["", "Traceback\nValueError: bad manifest"],
         ),
     ), ["npz", "bad manifest"]),
    ("checkpoint", "roundtrip", "passed", None, None),
    ("checkpoint", "roundtrip", "failed",
     lambda c, t: _set(t, "tables/io_cost.csv", lambda d: d["format"] == "dcp", "roundtrip_ok", False), None),
    ("checkpoint", "roundtrip", "not_measured",
     lambda c, t: _io_failed(t, "dcp", "sync", "RankFailure: timed out", ranks=2),
     ["dcp/sync/2 rank(s)", "timed out"]),
    # hpo
    ("hpo", "hpo.grid_speedup", "passed", None, None),
    ("hpo", "hpo.grid_speedup", "failed",
     lambda c, t: _set(t, "tables/grid_scaling.csv", lambda d: d["workers"] == 2, "elapsed_s", 8.0), None),
    ("hpo", "hpo.grid_speedup", "not_measured",
     lambda c, t: _set(t, "tables/grid_scaling.csv", lambda d: d["workers"] == 2, "n_trials", 1),
     ["grid-2w finished 1/2 trials"]),
    # repeated (hpo.grid.repeats): judged on the interval of the per-repeat speedups against 1.6
    ("hpo", "hpo.grid_speedup", "passed", _grid_repeats([1.80, 1.85, 1.90]), None),
    ("hpo", "hpo.grid_speedup", "failed", _grid_repeats([1.40, 1.45, 1.50]), None),
    # the laptop runs of #40 read 1.52 and 1.88: with 1.70 their interval spans 1.25 to 2.15
    ("hpo", "hpo.grid_speedup", "straddles", _grid_repeats([1.52, 1.88, 1.70]), None),
    # a lost or unfinished repeat is named, not averaged over
    ("hpo", "hpo.grid_speedup", "not_measured",
     _grid_repeats([1.80, 1.85, 1.90], drop={(2, 1)}, short={(1, 2)}),
     ["grid-2w-r1 is not in grid_scaling.csv", "grid-1w-r2 finished 1/2 trials"]),
    ("hpo", "hpo.best_test_acc", "passed", None, None),
    ("hpo", "hpo.best_test_acc", "failed",
     lambda c, t: _set(t, "tables/best_config.csv", lambda d: d["overall_best"], "test_acc", 0.5), None),
    ("hpo", "hpo.best_test_acc", "not_measured",
     lambda c, t: _set(t, "tables/best_config.csv", lambda d: d["overall_best"], "test_acc", np.nan),
     ["random", "no test accuracy"]),
    # the run of #40: 0.8544 on 10000 images, about 1.2 standard errors above 0.85
    ("hpo", "hpo.best_test_acc", "straddles",
     lambda c, t: _set(t, "tables/best_config.csv", lambda d: d["overall_best"], "test_acc", 0.8544), None),
    # a table from before the test set's size was recorded: no interval, so no verdict
    ("hpo", "hpo.best_test_acc", "not_measured",
     lambda c, t: t.update({"tables/best_config.csv": t["tables/best_config.csv"].drop(columns="test_n")}),
     ["no test-set size (test_n)", "rerun the hpo study"]),
    ("hpo", "hpo.pruning", "passed", None, None),
    ("hpo", "hpo.pruning", "failed",
     lambda c, t: _set(t, "tables/pruning.csv", lambda d: d.index == 0, "saving_fraction", 0.1), None),
    ("hpo", "hpo.pruning", "not_measured",
     lambda c, t: t.__setitem__("tables/pruning.csv", t["tables/pruning.csv"].iloc[0:0]),
     ["random-median", "missing"]),
    # the thresholds come from the config: raised past this run's numbers, each claim fails
    ("hpo", "hpo.grid_speedup", "failed",
     lambda c, t: c["hpo"]["claims"].__setitem__("min_speedup_efficiency", 0.95), None),
    ("hpo", "hpo.best_test_acc", "failed",
     lambda c, t: c["hpo"]["claims"].__setitem__("min_best_test_acc", 0.9), None),
    ("hpo", "hpo.pruning", "failed",
     lambda c, t: c["hpo"]["claims"].__setitem__("min_pruning_saving", 0.6), None),
    ("hpo", "hpo.pruning", "failed",
     lambda c, t: c["hpo"]["claims"].__setitem__("max_pruning_loss_pts", 0.4), None),
    # shuffle
    ("shuffle", "random_local_partial_match_global_M{M}", "passed", None, None),
    ("shuffle", "random_local_partial_match_global_M{M}", "failed",
     _shuffle_gaps("local", 0.0, "random", (-5.0, -4.5, -5.5)), None),
    ("shuffle", "random_local_partial_match_global_M{M}", "straddles",
     _shuffle_gaps("local", 0.0, "random", (-2.0, 0.0, 1.0)), None),
    ("shuffle", "random_local_partial_match_global_M{M}", "not_measured",
     lambda c, t: _shuffle_failed(t, _point("partial", 0.1, "random")),
     ["point partial-q0.1-random-M2 failed", "on 2 ranks failed"]),
    ("shuffle", "skewed_partial_recovers_global_M{M}", "passed", None, None),
    ("shuffle", "skewed_partial_recovers_global_M{M}", "failed",    # local is as good as global
     _shuffle_gaps("local", 0.0, "skewed", (0.1, -0.1, 0.0)), None),
    ("shuffle", "skewed_partial_recovers_global_M{M}", "straddles",
     _shuffle_gaps("partial", 0.1, "skewed", (-3.0, 0.0, 1.0)), None),
    ("shuffle", "skewed_partial_recovers_global_M{M}", "not_measured",
     lambda c, t: _shuffle_failed(t, _point("global", 1.0, "shared")),
     ["global-q1-shared-M2 failed"]),
    ("shuffle", "bytes_per_epoch_equal_QN", "passed", None, None),
    ("shuffle", "bytes_per_epoch_equal_QN", "failed",
     lambda c, t: _set(t, "tables/epochs.csv", lambda d: d.index == 3, "bytes_recv", 39 * SAMPLE_BYTES),
     None),
    ("shuffle", "bytes_per_epoch_equal_QN", "not_measured",
     lambda c, t: t.__setitem__("tables/epochs.csv", t["tables/epochs.csv"].iloc[:9]),
     ["partial-q0.1-skewed-M2", "3 of 6 epochs (runs x epochs) recorded"]),
    ("shuffle", "held_at_most_1_plus_Q_N_over_M", "passed", None, None),
    ("shuffle", "held_at_most_1_plus_Q_N_over_M", "failed",
     lambda c, t: _final_set(t, _point("partial", 0.1, "skewed"), "samples_held_max", 221), None),
    ("shuffle", "held_at_most_1_plus_Q_N_over_M", "failed",    # a row beyond the staged copies' (1+2Q)N/M
     lambda c, t: _final_set(t, _point("partial", 0.1, "skewed"), "held_rows_max", 241), None),
    ("shuffle", "held_at_most_1_plus_Q_N_over_M", "not_measured",
     lambda c, t: _shuffle_failed(
         t, _point("partial", 0.1, "skewed"), "ExchangeError: rank 1: shuffle exchange of epoch 1 failed"),
     ["partial-q0.1-skewed-M2 failed", "ExchangeError"]),
    ("shuffle", "kakurenbo_saves_time", "passed", None, None),
    ("shuffle", "kakurenbo_saves_time", "failed", _two_fractions, None),
    ("shuffle", "kakurenbo_saves_time", "straddles",
     _kk_times(0.2, (8.0, 10.5, 9.5), compute_s=(7.2, 7.35, 7.1)), None),
    ("shuffle", "kakurenbo_saves_time", "not_measured",
     lambda c, t: _shuffle_failed(t, KK), ["kakurenbo-M2 failed"]),
    # spatial
    ("spatial", "partitioned_exact", "passed", None, None),
    ("spatial", "partitioned_exact", "failed",
     lambda c, t: _set(t, "tables/exactness.csv", lambda d: d.index == 1, "err_grad_params", 1e-6), None),
    ("spatial", "partitioned_exact", "not_measured",
     lambda c, t: t.__setitem__("tables/exactness.csv", t["tables/exactness.csv"].iloc[0:0]), ["1x2x1"]),
    ("spatial", "strong_efficiency_2", "passed", None, None),
    # judged on the interval of the per-repeat efficiencies where the run kept 2 or more repeats
    ("spatial", "strong_efficiency_2", "straddles", _efficiency_repeats([0.80, 0.95]), None),
    ("spatial", "strong_efficiency_2", "passed", _efficiency_repeats([0.90, 0.91, 0.92]), None),
    ("spatial", "strong_efficiency_2", "failed", _efficiency_repeats([0.60, 0.62, 0.61]), None),
    ("spatial", "strong_efficiency_2", "failed",
     lambda c, t: _set(t, "tables/runs.csv", lambda d: d["run"] == "strong-d1x2x1", "time_per_iter_s", 0.9),
     None),
    ("spatial", "strong_efficiency_2", "not_measured",
     lambda c, t: _spatial_failed(t, "strong-d1x2x1"), ["run strong-d1x2x1 failed", "HaloExchangeError"]),
    ("spatial", "strong_efficiency_2", "not_measured",
     lambda c, t: _spatial_failed(t, "ceiling-d1x2x1", "RankFailure: timed out"),
     ["run ceiling-d1x2x1 failed", "timed out"]),
    ("spatial", "strong_efficiency_2", "not_measured",
     lambda c, t: _spatial_disturbed(t, "ceiling-d1x2x1"),
     ["disturbed by other load", "ceiling-d1x2x1 1.20"]),
    ("spatial", "oracle_error", "passed", None, None),
    # out of sample: an in-sample run's error is evidence, never the verdict
    ("spatial", "oracle_error", "passed",
     lambda c, t: _set(t, "tables/runs.csv", lambda d: d["run"] == "strong-d1x2x1", "oracle_error", -0.6),
     None),
    ("spatial", "oracle_error", "not_measured",
     lambda c, t: _spatial_disturbed(t, "train-d1x1x1"), ["disturbed by other load", "train-d1x1x1 1.20"]),
    ("spatial", "oracle_error", "failed",
     lambda c, t: _set(t, "tables/runs.csv", lambda d: d["run"] == "train-d1x1x1", "oracle_error", -0.6),
     None),
    # per run: a mean |error| of 7.5 % under the 10 % bound, one run at -12.5 %
    ("spatial", "oracle_error", "failed",
     _all_held_out({"strong-d1x1x1": 0.05, "strong-d1x2x1": -0.125, "train-d1x1x1": 0.05}), None),
    # per run on the interval of its repeats: wide (straddles), tight inside, tight outside the bound
    ("spatial", "oracle_error", "straddles", _oracle_repeats({"train-d1x1x1": [0.02, 0.12]}), None),
    ("spatial", "oracle_error", "passed", _oracle_repeats({"train-d1x1x1": [0.049, 0.051]}), None),
    ("spatial", "oracle_error", "failed", _oracle_repeats({"train-d1x1x1": [0.30, 0.31]}), None),
    ("spatial", "oracle_error", "not_measured",
     lambda c, t: c["spatial"].__setitem__("held_out", []),
     ["spatial.held_out names no configured training run"]),
    ("spatial", "oracle_error", "not_measured",
     lambda c, t: _spatial_failed(t, "train-d1x1x1", "RankFailure: timed out"),
     ["train-d1x1x1", "timed out"]),
    ("spatial", "loss_falls", "passed", None, None),
    ("spatial", "loss_falls", "failed",
     lambda c, t: _set(t, "tables/loss.csv", lambda d: d.index >= 0, "loss", 1.0), None),
    ("spatial", "loss_falls", "not_measured",
     lambda c, t: (
         t.__setitem__("tables/loss.csv", t["tables/loss.csv"].iloc[0:0]),
         _spatial_failed(t, "train-d1x1x1", "MemoryError"),
     ), ["train-d1x1x1 failed", "MemoryError"]),
    ("spatial", "oracle_picks_spatial", "passed", None, None),
    ("spatial", "oracle_picks_spatial", "failed", lambda c, t: _spatial_pick(t, "data"), None),
    # from real configs: default.yaml's CosmoFlow 512^3 at mini-batch 16 picks data x spatial, the only
    # families that fit (uncontested: not measured); at 32^3 and mini-batch 256 the model finds data x
    # filter faster at 2048 GPUs
    ("spatial", "oracle_picks_spatial", "not_measured", _real_extrapolation(),
     ["uncontested: no other family is feasible at 2048 GPUs and mini-batch 16"]),
    ("spatial", "oracle_picks_spatial", "failed", _real_extrapolation(grid=32, batch_size=256), None),
    ("spatial", "oracle_picks_spatial", "straddles", _oracle_repeats({"train-d1x1x1": [0.02, 0.12]}), None),
    ("spatial", "oracle_picks_spatial", "not_measured",
     lambda c, t: _spatial_failed(t, "train-d1x1x1"), ["oracle_error", "train-d1x1x1 failed"]),
    ("spatial", "compute_term", "passed", None, None),
    ("spatial", "compute_term", "failed",
     lambda c, t: _set(t, "tables/compute_check.csv", lambda d: d["network"] == "unet3d", "error", 0.15),
     None),
    ("spatial", "compute_term", "not_measured",
     lambda c, t: t.__setitem__("tables/compute_check.csv", t["tables/compute_check.csv"].iloc[0:0]),
     ["no GPU calibration", "spatial calibrate"]),
    # hetmem
    ("hetmem", "estimate_error_le_5pct", "passed", None, None),
    # stream's own mean |error| 8 % fails, though the mean over both apps' placements is 4.75 %
    ("hetmem", "estimate_error_le_5pct", "failed",
     lambda c, t: _set(t, "tables/validation.csv",
                       lambda d: (d["placement"] == "object:x") & (d["app"] == "stream"), "error", -0.16),
     None),
    ("hetmem", "estimate_error_le_5pct", "not_measured", lambda c, t: _hetmem_failed(t, "cg"),
     ["app cg failed", "truncated trace at byte offset 12"]),
    ("hetmem", "estimate_100x_faster", "passed", None, None),
    # the kernel's own compute 0.5 ms (50x), though its process (0.15 s, start-up) is 15000x
    ("hetmem", "estimate_100x_faster", "failed",
     lambda c, t: _set(t, "tables/speed.csv", lambda d: d["app"] == "cg", "native_compute_s", 5e-4), None),
    # the simulated reference (the paper's comparator) only 50x slower
    ("hetmem", "estimate_100x_faster", "failed",
     lambda c, t: _set(t, "tables/speed.csv", lambda d: d["app"] == "stream", "simulated_reference_s", 5e-4),
     None),
    ("hetmem", "estimate_100x_faster", "not_measured",
     lambda c, t: _hetmem_failed(t, "stream", "ToolMissing: tracer (valgrind) 'valgrind' not found"),
     ["app stream failed", "not found"]),
    ("hetmem", "estimate_100x_faster", "not_measured",
     lambda c, t: _set(t, "tables/speed.csv", lambda d: d["app"] == "cg", "native_compute_s", np.nan),
     ["cg vs kernel: app cg: its kernel's compute phase was not timed"]),
    ("hetmem", "placement_near_all_fast", "passed", None, None),
    ("hetmem", "placement_near_all_fast", "failed",
     lambda c, t: _set(t, "tables/policies.csv", lambda d: (d["app"] == "cg") & (d["policy"] != "random"),
                       "gap_to_all_fast", 0.2), None),
    ("hetmem", "placement_near_all_fast", "not_measured",
     lambda c, t: t.__setitem__("tables/policies.csv", t["tables/policies.csv"].iloc[0:0]),
     ["app stream has no result", "app cg has no result"]),
    # microbatch
    ("microbatch", "algorithm_choice_not_slower", "passed", None, None),
    ("microbatch", "algorithm_choice_not_slower", "failed",
     lambda c, t: _mb_rounds(t, "speedup", (0.90, 0.91, 0.89)), None),
    ("microbatch", "algorithm_choice_not_slower", "straddles",
     lambda c, t: _mb_rounds(t, "speedup", (1.05, 0.95, 1.0)), None),
    ("microbatch", "algorithm_choice_not_slower", "not_measured", lambda c, t: _mb_failed(t),
     ["resnet18", "network resnet18 failed", "WorkspaceError: layer conv1"]),
    ("microbatch", "algorithm_choice_not_slower", "not_measured",  # the cuDNN task's failure is not its
     lambda c, t: (_mb_failed(t), _mb_cudnn_failed(t)), ["network resnet18 failed: WorkspaceError"]),
    ("microbatch", "algorithm_choice_prediction_within_tolerance", "passed", None, None),
    ("microbatch", "algorithm_choice_prediction_within_tolerance", "failed",
     lambda c, t: _mb_rounds(t, "prediction_error_scaled_frac", (-0.25, -0.24, -0.26), "alexnet",
                             "undivided/dp"), None),
    ("microbatch", "algorithm_choice_prediction_within_tolerance", "straddles",
     lambda c, t: _mb_rounds(t, "prediction_error_scaled_frac", (0.0, 0.1, 0.2)), None),
    ("microbatch", "algorithm_choice_prediction_within_tolerance", "not_measured", lambda c, t: _mb_failed(t),
     ["resnet18", "network resnet18 failed"]),
    ("microbatch", "outputs_exact", "passed", None, None),
    ("microbatch", "outputs_exact", "failed",
     lambda c, t: t["tables/exactness.csv"].loc.__setitem__((0, "excess_fp64"), 3e-4), None),
    # the H200's pattern: far from an imprecise default, no farther from float64 than that default
    ("microbatch", "outputs_exact", "passed", lambda c, t: _mb_exact(t, max_rel_err=0.012, err_fp64=3e-7,
                                                                     default_err_fp64=0.012), None),
    ("microbatch", "outputs_exact", "failed",
     lambda c, t: _mb_exact(t, c, "default", max_rel_err=0.012), None),
    ("microbatch", "outputs_exact", "not_measured",  # a run without the float64 reference
     lambda c, t: t.__setitem__("tables/exactness.csv",
                                t["tables/exactness.csv"].drop(columns="excess_fp64")),
     ["no float64 reference"]),
    ("microbatch", "outputs_exact", "not_measured", lambda c, t: _mb_failed(t, "alexnet", "MemoryError"),
     ["alexnet", "MemoryError"]),
    ("microbatch", "cudnn_plan_not_slower", "passed", None, None),
    ("microbatch", "cudnn_plan_not_slower", "failed",  # the divided forward at twice the baseline's time
     lambda c, t: _mb_cudnn(t, "limits", "dp", "measured_time_s", 80.0, kernel="c1/forward"), None),
    ("microbatch", "cudnn_plan_not_slower", "failed",  # the ILP's network sum slower than the baselines'
     lambda c, t: _mb_cudnn(t, "networks", "ilp", "measured_time_s", 70.0), None),
    ("microbatch", "cudnn_plan_not_slower", "not_measured",
     lambda c, t: c["microbatch"].update(device="cpu"),
     ["needs cuDNN's workspace-limited algorithms (a GPU)", "this run's device is cpu"]),
    ("microbatch", "cudnn_plan_not_slower", "not_measured", lambda c, t: _mb_cudnn_failed(t),
     ["network resnet18's cuDNN run failed", "no cuDNN plan ran"]),
    ("microbatch", "cudnn_tight_limit_speedup", "passed", None, None),
    ("microbatch", "cudnn_tight_limit_speedup", "failed",  # 1.01: within the repeats' noise (0.02)
     lambda c, t: _mb_cudnn(t, "networks", "dp", "measured_speedup", 1.01), None),
    ("microbatch", "cudnn_tight_limit_speedup", "not_measured",
     lambda c, t: c["microbatch"]["cudnn"].update(engines=False),
     ["needs cuDNN's workspace-limited algorithms (a GPU)", "microbatch.cudnn.engines is false"]),
    ("microbatch", "cudnn_tight_limit_speedup", "not_measured", lambda c, t: _mb_cudnn_failed(t),
     ["network resnet18's cuDNN run failed"]),
    # malleable
    ("malleable", "change_within_one_iteration", "passed", None, None),
    ("malleable", "change_within_one_iteration", "failed",
     lambda c, t: _set(t, "tables/response.csv", lambda d: d.index == 2, "lag_iters", 1), None),
    ("malleable", "change_within_one_iteration", "not_measured",
     lambda c, t: _malleable_point(t, "response", "quota", "skipped",
                                   "skipped: cannot write cgroups under /sys/fs/cgroup/cpu"),
     ["quota", "skipped", "cannot write cgroups"]),
    ("malleable", "follow_quota_faster", "passed", None, None),
    ("malleable", "follow_quota_faster", "failed",
     lambda c, t: _set(t, "tables/oversub.csv", lambda d: (d["mode"] == "keep") & (d["phase"] == 1),
                       "iter_s", 0.06), None),
    ("malleable", "follow_quota_faster", "not_measured",
     lambda c, t: _malleable_point(t, "oversub", "keep"),
     ["oversub point keep repeat 0 failed", "driver exited"]),
    # keep / follow at quota 1: 1.2, 0.9, 1.05 over the repeats, an interval across 1
    ("malleable", "follow_quota_faster", "straddles",
     _malleable_ratios("tables/oversub.csv", lambda d: (d["mode"] == "keep") & (d["phase"] == 1), "iter_s",
                       [0.068 * d * k for d, k in zip(MALLEABLE_DRIFT, (1.2, 0.9, 1.05), strict=True)]),
     None),
    ("malleable", "malleable_beats_rigid", "passed", None, None),
    ("malleable", "malleable_beats_rigid", "failed",
     lambda c, t: _set(t, "tables/policies.csv", lambda d: d["policy"] == "proportional",
                       "mean_turnaround_s", 3.5), None),
    ("malleable", "malleable_beats_rigid", "not_measured",
     lambda c, t: _set(t, "tables/policies.csv", lambda d: d["policy"] == "rigid", "jobs_failed", 1),
     ["rigid", "3 job(s) failed"]),  # one in each repeat
    # proportional's makespan over rigid: 0.9, 1.1, 0.95 over the repeats, an interval across 1
    ("malleable", "malleable_beats_rigid", "straddles",
     _malleable_ratios("tables/policies.csv", lambda d: d["policy"] == "proportional", "makespan_s",
                       [8.0 * d * k for d, k in zip(MALLEABLE_DRIFT, (0.9, 1.1, 0.95), strict=True)]), None),
    # offload
    ("offload", "memory_ratio", "passed", None, None),
    ("offload", "memory_ratio", "failed",
     lambda c, t: _set(t, "tables/tradeoff.csv", lambda d: d["strategy"] == "both", "peak_fast_bytes", 400),
     None),
    ("offload", "memory_ratio", "not_measured",
     lambda c, t: (_offload_failed(t, "both", 8), _offload_failed_also(t)),
     ["strategy=both, depth=8", "BudgetExceeded"]),
    # the slow tier reads as fast as RAM (the page cache): not measured on this host, whatever the ratio
    ("offload", "memory_ratio", "not_measured", lambda c, t: _offload_slow_tier(t, "read", 9.5e9),
     ["on this host the slow tier (files) is not slower than the fast tier", "slow_tier_min_slowdown 1.5x",
      "read 9.5 GB/s vs the fast tier's 10 GB/s (1.053x slower)"]),
    ("offload", "memory_ratio", "not_measured",
     lambda c, t: t.__setitem__("tables/tiers.csv", t["tables/tiers.csv"].iloc[0:0]),
     ["tiers' bandwidths were not measured in this run"]),
    # the threshold comes from the config: a slow tier 3.3x slower fails a 4x requirement
    ("offload", "memory_ratio", "not_measured",
     lambda c, t: c["offload"]["claims"].__setitem__("slow_tier_min_slowdown", 4.0),
     ["read 3 GB/s vs the fast tier's 10 GB/s (3.333x slower)"]),
    ("offload", "hidden_fraction", "passed", None, None),
    ("offload", "hidden_fraction", "failed",
     lambda c, t: _offload_steps(t, "optimizer", 0.4, "0.38 0.40 0.42 0.40"), None),
    # 0.7007 against 0.70 (the audit's case): its steps' interval crosses the line
    ("offload", "hidden_fraction", "straddles",
     lambda c, t: _offload_steps(t, "optimizer", 0.7007, "0.66 0.74 0.70 0.7028"), None),
    ("offload", "hidden_fraction", "not_measured",
     lambda c, t: _offload_steps(t, "both", 0.8, "0.8 nan"),
     ["both: 1 measured step(s) with a transfer; an interval needs 2"]),
    ("offload", "hidden_fraction", "not_measured",
     lambda c, t: t.__setitem__("tables/tradeoff.csv",
                                t["tables/tradeoff.csv"].drop(columns="hidden_frac_steps")),
     ["predates the per-step hidden fractions"]),
    ("offload", "hidden_fraction", "not_measured", lambda c, t: _offload_failed(t, "activations", 8),
     ["strategy=activations, depth=8 failed", "BudgetExceeded"]),
    ("offload", "weights_equal", "passed", None, None),
    ("offload", "weights_equal", "failed",
     lambda c, t: _set(t, "tables/tradeoff.csv", lambda d: (d["strategy"] == "both") & (d["depth"] == 4),
                       "weights_sha256", "other"), None),
    ("offload", "weights_equal", "not_measured",
     lambda c, t: _offload_failed(t, "optimizer", 4, "OSError: EIO"),
     ["optimizer/4L", "OSError: EIO"]),
    ("offload", "capacity_ratio", "passed", None, None),
    ("offload", "capacity_ratio", "failed",
     lambda c, t: _set(t, "tables/capacity.csv", lambda d: d["strategy"] == "both", "max_params", 14), None),
    ("offload", "capacity_ratio", "not_measured", lambda c, t: _offload_capacity_failed(t, "none"),
     ["strategy=none", "is full"]),
    ("offload", "capacity_ratio", "not_measured",
     lambda c, t: (_offload_slow_tier(t, "write", 9e9), _offload_capacity_failed(t, "none")),
     ["write 9 GB/s vs the fast tier's 10 GB/s (1.111x slower)", "strategy=none", "is full"]),
    # zero_offload (ZeRO-Offload's design) against none at the same precision: 0.28 of its memory, 60 / 7
    # = 8.6x its parameters in the baseline
    ("offload", "zero_memory_ratio", "passed", None, None),
    ("offload", "zero_memory_ratio", "failed",
     lambda c, t: _set(t, "tables/tradeoff.csv", lambda d: d["strategy"] == "zero_offload", "peak_fast_bytes",
                       400), None),
    ("offload", "zero_memory_ratio", "not_measured", lambda c, t: _offload_slow_tier(t, "read", 9.5e9),
     ["on this host the slow tier (files) is not slower than the fast tier"]),
    ("offload", "zero_capacity_ratio", "passed", None, None),
    ("offload", "zero_capacity_ratio", "failed",
     lambda c, t: _set(t, "tables/capacity.csv", lambda d: d["strategy"] == "zero_offload", "max_params", 35),
     None),
    ("offload", "zero_capacity_ratio", "not_measured",
     lambda c, t: _offload_capacity_failed(t, "zero_offload"), ["strategy=zero_offload", "is full"]),
]


def _run(study, mutate, tmp_path):
    cfg, tables = BUILDERS[study]()
    if mutate is not None:
        mutate(cfg, tables)
    stage = importlib.import_module(f"hpcdl.studies.{study}.claims")
    claims = stage.judge(cfg, _write(tmp_path / study, tables))
    write_claims(tmp_path / study, study, claims, stage.CLAIMS)  # every id declared, every field sound
    return claims


def _find(claims, cid):
    found = [c for c in claims if declared(c["id"], [cid])]
    assert len(found) == 1, (cid, [c["id"] for c in claims])
    return found[0]


@pytest.mark.parametrize(
    "study, cid, outcome, mutate, words",
    CASES,
    ids=[f"{s}-{c.replace('{M}', 'M')}-{o}" for s, c, o, _, _ in CASES],
)
def test_claim_outcome(study, cid, outcome, mutate, words, tmp_path):
    c = _find(_run(study, mutate, tmp_path), cid)
    assert c["status"] == outcome, c
    assert c["passed"] == (outcome == "passed")
    if outcome == "not_measured":
        assert c["reason"].startswith("not measured: ")
        for w in words:
            assert w in c["reason"], (w, c["reason"])
    else:
        assert "reason" not in c
        assert any(
            k.startswith(("threshold", "tolerance", "required", "min_", "max_")) or k in ("bound",)
            for k in c["measured"]
        ), f"{cid}: evidence names no threshold: {sorted(c['measured'])}"


@pytest.mark.parametrize("study", studies())
def test_baseline_passes_every_claim_and_emits_only_declared_ids(study, tmp_path):
    claims = _run(study, None, tmp_path)
    declared_ids = importlib.import_module(f"hpcdl.studies.{study}.claims").CLAIMS
    assert {c["status"] for c in claims} == {"passed"}, [c for c in claims if not c["passed"]]
    ids = {d for d in declared_ids if any(declared(c["id"], [d]) for c in claims)}
    assert ids == set(declared_ids), (
        f"{study} declares claims it never emits: {set(declared_ids) - ids}"
    )


def test_every_declared_claim_has_a_pass_fail_and_missing_case():
    """... and a straddling case for every claim judged on an interval (the module's INTERVAL_CLAIMS)."""
    covered = {(s, c, o) for s, c, o, _, _ in CASES}
    absent = []
    for study in studies():
        module = importlib.import_module(f"hpcdl.studies.{study}.claims")
        for cid in module.CLAIMS:
            wanted = OUTCOMES + (("straddles",) if cid in getattr(module, "INTERVAL_CLAIMS", ()) else ())
            absent += [(study, cid, o) for o in wanted if (study, cid, o) not in covered]
    assert not absent, f"claims without a test of each outcome: {absent}"


# ------------------------------------------------------------------ specific rules and the writer
def test_kakurenbo_evidence_lists_every_fraction_with_rounds_and_interval(tmp_path):
    c = _find(_run("shuffle", _two_fractions, tmp_path), "kakurenbo_saves_time")
    assert c["measured"]["holds"] == {"F=0.1": True, "F=0.2": False}
    saving = c["measured"]["time_saving"]
    # against the mean of the round's two F=0 runs: 10.05, 10.1 and 9.95 s
    assert saving["F=0.1"]["per_pair"] == {"round 0": pytest.approx(1 - 9.2 / 10.05, abs=1e-4),
                                           "round 1": pytest.approx(1 - 9.4 / 10.1, abs=1e-4),
                                           "round 2": pytest.approx(1 - 9.1 / 9.95, abs=1e-4)}
    assert saving["F=0.2"]["n"] == 3 and saving["F=0.2"]["ci95"][1] < 0      # wholly below zero: fails
    work = c["measured"]["work_and_overhead"]["F=0.1"]
    assert work["backward_skipped_fraction"] == pytest.approx(0.09)          # 0.9 * F in the fixture
    assert work["overhead"] == pytest.approx(0.03 * 9.2 / 10.0, abs=1e-3)
    assert "hiding fractions F in [0.1, 0.2]: at every F" in c["statement"]


def test_kakurenbo_time_is_judged_at_every_f_with_the_regime_beside_it(tmp_path):
    # The fixture's compute is 90 % of each run's time, hidden samples skip 90 % of F and the overhead is
    # 3 % of the run. F=0.2 (8.0 s against 10.05 s): 16.2 % of work skipped less 2.4 % overhead, in the
    # regime (min_net_saving 5 %). F=0.02 at 9.9, 10.1, 9.8 s: 1.6 % skipped less 3 %, outside it. The
    # regime used to leave such an F out of the time verdict (#40: the gate was set after F=0.1 failed);
    # now its wall time is judged too, and its noisy saving (1.5 %, 0 %, 1.5 %) makes the claim straddle.
    c = _find(_run("shuffle", _kk_times(0.02, (9.9, 10.1, 9.8)), tmp_path), "kakurenbo_saves_time")
    low = c["measured"]["work_and_overhead"]["F=0.02"]
    assert low["net_saving"]["mean"] == pytest.approx(0.0162 - 0.0297, abs=1e-3)
    assert not low["in_regime"] and c["measured"]["work_and_overhead"]["F=0.2"]["in_regime"]
    assert c["measured"]["holds"] == {"F=0.02": "straddles", "F=0.2": True}
    assert c["status"] == "straddles" and c["measured"]["min_net_saving"] == 0.05
    assert c["measured"]["timing_resolution"] == pytest.approx(0.0425, abs=0.001)
    assert "Every F is judged" in c["statement"]

    def strict(c, t):  # a floor above every F's net saving no longer takes the claim out of measurement
        c["shuffle"]["kakurenbo"]["min_net_saving"] = 0.2
    c = _find(_run("shuffle", strict, tmp_path / "strict"), "kakurenbo_saves_time")
    assert c["status"] == "passed" and not c["measured"]["work_and_overhead"]["F=0.2"]["in_regime"]
    assert c["measured"]["work_and_overhead"]["F=0.2"]["net_saving"]["mean"] == pytest.approx(0.138, abs=2e-3)


def _kk_small_account(savings, overhead=0.07):
    """F=0.1 saving `savings` of each round's F=0 time, with an overhead (of its own run's time) that
    leaves the method's own account at about 1.4 %, as F=0.1's read on the laptop (1.3-1.5 %)."""
    base = (10.05, 10.1, 9.95)  # the fixture's rounds' F=0 means
    times = tuple(b * (1 - x) for b, x in zip(base, savings, strict=True))

    def mutate(c, t):
        _kk_times(0.1, times)(c, t)
        final = t["tables/final.csv"]
        rows = (final["point"] == KK) & np.isclose(final["kakurenbo_fraction"], 0.1)
        final.loc[rows, "overhead_total_s"] = overhead * final.loc[rows, "train_time_s"]
    return mutate


def test_kakurenbo_a_saving_beyond_what_the_rounds_resolve_of_the_account_straddles(tmp_path):
    # run 2 of three at 0101a14: F=0.1 measured 0.042 [0.016, 0.067] where the method accounts for
    # 0.013 [0.009, 0.018]; runs 1 and 3 straddled on the same code. The interval above 0 is more than
    # the method skips, not its saving, so F=0.1 reads straddles with both numbers
    c = _find(_run("shuffle", _kk_small_account((0.030, 0.042, 0.052)), tmp_path), "kakurenbo_saves_time")
    work = c["measured"]["work_and_overhead"]["F=0.1"]
    assert work["net_saving"]["ci95"][1] < work["wall_time_resolves"]
    assert work["net_saving"]["mean"] == pytest.approx(0.014, abs=0.002) and not work["account_resolved"]
    assert c["measured"]["time_saving"]["F=0.1"]["ci95"][0] > 0              # the wall time alone would pass
    assert c["measured"]["holds"]["F=0.1"] == "straddles" and c["status"] == "straddles"
    assert "not that saving" in c["measured"]["below_resolution"]["F=0.1"]
    assert c["measured"]["work_and_overhead"]["F=0.2"]["account_resolved"]   # 13.8 % against +-4 %: judged
    # a measured loss is a finding whatever the resolution
    c = _find(_run("shuffle", _kk_small_account((-0.05, -0.04, -0.06)), tmp_path / "loss"),
              "kakurenbo_saves_time")
    assert c["status"] == "failed" and c["measured"]["below_resolution"] == {}


def test_shuffle_accuracy_claims_need_two_seeds_for_an_interval(tmp_path):
    def one_seed(c, t):
        c["shuffle"]["seeds"] = [0]
        t["tables/final.csv"] = t["tables/final.csv"][t["tables/final.csv"]["seed"].eq(0)]
    c = _find(_run("shuffle", one_seed, tmp_path), "random_local_partial_match_global_M{M}")
    assert c["status"] == "not_measured"
    assert "1 paired seed(s); an interval needs 2 (shuffle.seeds)" in c["reason"]


def test_shuffle_accuracy_evidence_pairs_by_seed(tmp_path):
    c = _find(_run("shuffle", None, tmp_path), "skewed_partial_recovers_global_M{M}")
    local = c["measured"]["local_minus_global_pt"]
    assert local["per_pair"] == {"seed 0": -20.0, "seed 1": -19.0, "seed 2": -21.0}
    assert local["mean"] == -20.0 and local["ci95"] == [pytest.approx(-22.48, abs=0.01),
                                                        pytest.approx(-17.52, abs=0.01)]


def test_held_claim_compares_measured_samples_with_the_real_bound(tmp_path):
    c = _find(_run("shuffle", None, tmp_path), "held_at_most_1_plus_Q_N_over_M")
    pid = _point("partial", 0.1, "random")
    assert c["measured"]["bound"][pid] == pytest.approx(200 + 20)  # ceil(400/2) + 0.1*400/2
    assert c["measured"]["samples_held_max"][pid] == 220
    assert c["measured"]["buffer_rows_max"][pid] == 240  # staged copies are extra rows...
    assert c["measured"]["bound_rows"][pid] == pytest.approx(200 + 2 * 20)  # ...against their own bound
    assert "(1+2Q)*N/M sample rows" in c["statement"] and "distinct samples" in c["statement"]


def test_oracle_pick_fails_when_the_oracle_misses_this_run(tmp_path):
    mutate = lambda c, t: _set(t, "tables/runs.csv", lambda d: d.index >= 0, "oracle_error", 0.4)  # noqa: E731
    c = _find(_run("spatial", mutate, tmp_path), "oracle_picks_spatial")
    assert c["status"] == "failed" and c["measured"]["picked"].startswith("data x spatial")
    assert c["measured"]["oracle_mean_abs_error"] == pytest.approx(0.4)
    assert "spatial.machine" in c["statement"] and "not measured here" in c["statement"]
    assert c["measured"]["target_machine"] == SPATIAL_CFG["spatial"]["machine"]


def test_oracle_error_judges_each_held_out_run_and_names_the_worst_beside_the_mean(tmp_path):
    claims = _run("spatial", _all_held_out({"strong-d1x1x1": 0.05, "strong-d1x2x1": -0.125,
                                             "train-d1x1x1": 0.05}), tmp_path)
    c, pick = _find(claims, "oracle_error"), _find(claims, "oracle_picks_spatial")
    m = c["measured"]
    assert m["mean_abs_error"] == pytest.approx(0.075) and m["mean_abs_error"] <= m["threshold"] == 0.10
    assert c["status"] == "failed" and m["worst_run"] == {"run": "strong-d1x2x1", "error": -0.125}
    assert m["holds"] == {"strong-d1x1x1": True, "strong-d1x2x1": False, "train-d1x1x1": True}
    assert "every held-out run" in c["statement"] and "worst run" in c["statement"]
    # the pick is trusted only as far as every held-out run was predicted
    assert pick["status"] == "failed" and pick["measured"]["holds"]["oracle_error strong-d1x2x1"] is False


def test_oracle_error_interval_is_over_each_runs_repeats(tmp_path):
    c = _find(_run("spatial", _oracle_repeats({"train-d1x1x1": [0.02, 0.12]}), tmp_path), "oracle_error")
    iv = c["measured"]["per_run_interval"]["train-d1x1x1"]
    assert iv["per_pair"] == {"repeat 0": 0.02, "repeat 1": 0.12} and iv["n"] == 2
    # t(0.975, 1 dof) = 12.706: 0.07 +- 12.706 x 0.0707 / sqrt(2) crosses the 15 % bound
    assert iv["mean"] == pytest.approx(0.07) and iv["ci95"] == [pytest.approx(-0.565, abs=1e-3),
                                                                 pytest.approx(0.705, abs=1e-3)]
    assert c["status"] == "straddles" and c["measured"]["holds"] == {"train-d1x1x1": "straddles"}
    assert c["measured"]["worst_run"]["interval"] == iv


def test_oracle_pick_fail_case_comes_from_a_real_config(tmp_path):
    """default.yaml with spatial.extrapolate grid 32 and mini-batch 256, validated: at 2048 GPUs the oracle
    finds data x filter faster than any spatial split, and the claim fails on the pick alone."""
    c = _find(_run("spatial", _real_extrapolation(grid=32, batch_size=256), tmp_path), "oracle_picks_spatial")
    m = c["measured"]
    assert c["status"] == "failed" and m["holds"]["pick at 2048 GPUs is spatial"] is False
    assert m["holds"]["oracle_error train-d1x1x1"] is True
    assert m["picked"] == "data x filter" and m["picked_family"] == "filter"
    assert m["contested"] and m["feasible_rivals"] == ["filter"]
    assert m["families_at_scale"]["data x spatial"].startswith("fits: data x spatial")
    assert m["families_at_scale"]["data"].startswith("mini-batch: 256 samples < 2048 GPUs")
    assert "32^3, mini-batch 256" in c["statement"]


def test_oracle_pick_at_the_default_scale_lists_why_every_other_family_cannot_run(tmp_path):
    """Only spatial families fit at the default scale: the pick is forced, so the claim is not measured
    (it would only repeat oracle_error), and says why every other family cannot run."""
    c = _find(_run("spatial", _real_extrapolation(), tmp_path), "oracle_picks_spatial")
    m = c["measured"]
    assert c["status"] == "not_measured" and m["picked_family"] == "data x spatial" and not m["contested"]
    assert "channel, data, filter cannot run" in c["reason"]
    assert "only data x spatial, spatial fit" in c["reason"]
    fam = m["families_at_scale"]
    assert set(fam) == {"data", "spatial", "data x spatial", "filter", "channel"}
    assert fam["data"] == "mini-batch: 16 samples < 2048 GPUs (pure data parallelism needs a sample per GPU)"
    assert fam["filter"].startswith("channels: conv0 has 16 output channels < filter split 2048")
    assert "mini-batch: 16 samples < 32 data groups" in fam["filter"]
    assert fam["channel"].startswith("channels: conv0 has 4 input channels < channel split 2048")


def test_oracle_error_is_the_held_out_runs_with_the_in_sample_error_beside_it(tmp_path):
    mutate = lambda c, t: _set(t, "tables/runs.csv", lambda d: d["run"] == "strong-d1x2x1",  # noqa: E731
                               "oracle_error", -0.6)
    c = _find(_run("spatial", mutate, tmp_path), "oracle_error")
    m = c["measured"]
    assert c["status"] == "passed" and m["held_out"] == ["train-d1x1x1"] and "train-d1x1x1" in c["statement"]
    assert m["per_run"] == {"train-d1x1x1": 0.05} and m["mean_abs_error"] == pytest.approx(0.05)
    assert m["in_sample"]["per_run"] == {"strong-d1x1x1": 0.05, "strong-d1x2x1": -0.6}
    assert m["in_sample"]["mean_abs_error"] == pytest.approx(0.325)


def test_a_failed_measured_item_outranks_a_missing_one():
    c = every("x", "every X holds", {"a": False}, {"b": "point b failed"}, threshold=1)
    assert c["status"] == "failed" and c["measured"]["missing"] == {"b": "point b failed"}
    c = every("x", "every X holds", {"a": True}, {"b": "point b failed"}, threshold=1)
    assert c["status"] == "not_measured" and c["reason"] == "not measured: b: point b failed"
    assert every("x", "every X holds", {}, {})["status"] == "not_measured"


def test_every_x_straddles_only_when_nothing_fails_or_is_missing():
    c = every("x", "every X holds", {"a": True, "b": "straddles"}, {}, threshold=0)
    assert c["status"] == "straddles" and not c["passed"]
    assert c["measured"]["holds"] == {"a": True, "b": "straddles"}
    assert every("x", "s", {"a": "fails", "b": "straddles"}, {}, threshold=0)["status"] == "failed"
    missing = every("x", "s", {"a": "straddles"}, {"b": "point b failed"}, threshold=0)
    assert missing["status"] == "not_measured"
    assert every("x", "s", {"a": "holds", "b": True}, {}, threshold=0)["status"] == "passed"
    with pytest.raises(ValueError, match="interval verdict"):
        claim("x", "s", "maybe")


def test_claims_json_and_html_show_four_statuses(tmp_path):
    claims = [
        claim("fast", "x is fast", True, speedup=2.0, threshold=1.5),
        claim("small", "y < 1", False, y=3, threshold=1),
        not_measured("exact", "z is exact", "point z-M8 failed", threshold=0),
        claim("noisy", "a beats b", "straddles", ci95=[-0.1, 0.3], threshold=0),
    ]
    json_path, html_path = write_claims(tmp_path, "demo", claims, ["fast", "small", "exact", "noisy"])
    doc = json.loads(json_path.read_text())
    counts = (doc["passed"], doc["failed"], doc["straddles"], doc["not_measured"], doc["total"])
    assert counts == (1, 1, 1, 1, 4)
    assert [c["status"] for c in doc["claims"]] == ["passed", "failed", "not_measured", "straddles"]
    assert doc["claims"][3]["passed"] is False
    assert doc["claims"][2]["reason"] == "not measured: point z-M8 failed"
    page = html_path.read_text()
    assert "1/4 claims hold on this run (1 failed, 1 straddle, 1 not measured)" in page
    assert "<tr class='straddles'><td>noisy</td>" in page and "STRADDLES" in page
    assert "<tr class='not_measured'><td>exact</td>" in page and "NOT MEASURED" in page
    assert "not measured: point z-M8 failed" in page


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda: [claim("other", "s", True)], "not declared"),
        (
            lambda: [{**claim("fast", "s", True), "status": "passed", "passed": False}],
            "status 'passed' with passed=False",
        ),
        (lambda: [{**not_measured("fast", "s", "why"), "reason": ""}], "gives no reason"),
        (lambda: [{"id": "fast", "statement": "s", "passed": True}], "lacks"),
    ],
)
def test_write_claims_refuses_unsound_claims(bad, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        write_claims(tmp_path, "demo", bad(), ["fast"])
    assert not (tmp_path / "claims.json").exists()


def test_malleable_ratios_are_paired_by_repeat_with_an_interval(tmp_path):
    claims = _run("malleable", None, tmp_path)
    over = _find(claims, "follow_quota_faster")["measured"]["keep_over_follow_iter_time"]
    # each repeat's drift cancels in the ratio: 0.09 * 1.01 / 0.068 in every repeat
    assert set(over) == {"quota 1", "quota 0.5"}
    assert over["quota 1"]["per_pair"] == {f"repeat {r}": pytest.approx(0.09 * 1.01 / 0.068, abs=1e-3)
                                             for r in range(3)}
    assert over["quota 1"]["n"] == 3
    ratios = _find(claims, "malleable_beats_rigid")["measured"]["ratios"]["equal"]
    assert ratios["turnaround_over_rigid"]["per_pair"]["repeat 2"] == pytest.approx(0.8 * 1.04, abs=1e-3)
    assert ratios["makespan_over_rigid"]["ci95"] == [pytest.approx(0.875), pytest.approx(0.875)]


def test_hpo_speedup_pairs_each_repeats_grids_and_says_when_there_is_no_interval(tmp_path):
    c = _find(_run("hpo", _grid_repeats([1.80, 1.85, 1.90]), tmp_path / "three"), "hpo.grid_speedup")
    speedup = c["measured"]["speedup"]
    assert speedup["per_pair"] == {"repeat 0": 1.8, "repeat 1": 1.85, "repeat 2": 1.9} and speedup["n"] == 3
    # 1.85 +- t(0.975, 2) x 0.05 / sqrt(3), t = 4.303: wholly above the required 0.8 x 2 / 1 = 1.6
    assert speedup["ci95"] == [pytest.approx(1.726, abs=1e-3), pytest.approx(1.974, abs=1e-3)]
    assert c["measured"]["required"] == 1.6 and c["measured"]["repeats"] == 3
    assert c["measured"]["elapsed_s"][2] == {"repeat 0": 5.556, "repeat 1": 5.405, "repeat 2": 5.263}
    assert c["statement"].endswith("the 95 % interval of the speedups of 3 round-robin repeats, paired by "
                                   "repeat, above 1.60")
    one = _find(_run("hpo", None, tmp_path / "one"), "hpo.grid_speedup")  # 10 s / 5.5 s, one repeat
    assert one["status"] == "passed" and one["measured"]["speedup"] == pytest.approx(1.818, abs=1e-3)
    assert one["statement"] == ("2 workers finish the 2-point grid >= 1.60x faster than 1 (one repeat: a "
                                "point comparison, no interval)")
    assert one["measured"]["interval"] == "none: one repeat (hpo.grid.repeats: 1)"
    assert one["measured"]["elapsed_s"] == {1: 10.0, 2: 5.5}


def test_malleable_claims_need_two_repeats_for_an_interval(tmp_path):
    def one_repeat(c, t):
        c["malleable"]["repeats"] = 1
        for name in ("raw/points.csv", "tables/oversub.csv", "tables/policies.csv"):
            t[name] = t[name][t[name]["repeat"] == 0]
    claims = _run("malleable", one_repeat, tmp_path)
    for cid, key in (("follow_quota_faster", "malleable.oversub.repeats or malleable.repeats"),
                     ("malleable_beats_rigid", "malleable.repeats")):
        c = _find(claims, cid)
        assert c["status"] == "not_measured", c
        assert f"1 paired repeat(s); an interval needs 2 ({key})" in c["reason"]


def test_malleable_oversub_repeats_override_the_study_repeats():
    from hpcdl.studies.malleable.sweep import cosched_points, oversub_points, repeats_of

    block = {"repeats": 3, "oversub": {"repeats": 7}, "cosched": {}}
    assert (repeats_of(block, "oversub"), repeats_of(block, "cosched")) == (7, 3)
    assert repeats_of({**block, "oversub": {"repeats": None}}, "oversub") == 3
    cfg = validate_config(yaml.safe_load(Path("configs/default.yaml").read_text()))
    assert [p["repeat"] for p in oversub_points(cfg)] == list(range(cfg["malleable"]["oversub"]["repeats"]))
    assert [p["repeat"] for p in cosched_points(cfg)] == list(range(cfg["malleable"]["repeats"]))


def test_malleable_claim_lines_come_from_the_config(tmp_path):
    def stricter(c, t):   # keep / follow is 1.34 at quota 1 and 1.44 at 0.5; equal's makespan ratio 0.875
        c["malleable"]["claims"] = {"keep_over_follow_min": 1.4, "over_rigid_max": 0.85}
    claims = _run("malleable", stricter, tmp_path)
    over = _find(claims, "follow_quota_faster")
    assert over["status"] == "failed" and over["measured"]["threshold_line"] == 1.4
    assert over["measured"]["holds"] == {"quota 1": False, "quota 0.5": True}
    pol = _find(claims, "malleable_beats_rigid")
    assert pol["status"] == "failed" and pol["measured"]["holds"]["equal"] is False


# ------------------------------------------------------------------------- offload: measured vs registry
def test_offload_memory_is_judged_on_the_measured_peak_with_the_registry_beside_it(tmp_path):
    def rss_higher(c, t):  # 'both' holds 40 % of 'none' in RSS, while its registry says 20 %
        _set(t, "tables/tradeoff.csv", lambda d: (d["strategy"] == "both") & (d["depth"] == 8),
             "peak_fast_bytes", 320)
        _set(t, "tables/tradeoff.csv", lambda d: (d["strategy"] == "both") & (d["depth"] == 8),
             "peak_accounted_bytes", 128)
    c = _find(_run("offload", rss_higher, tmp_path), "memory_ratio")
    assert c["status"] == "failed" and c["measured"]["memory_ratio"] == 0.4
    assert c["measured"]["registry_ratio"] == 0.2 and c["measured"]["measured_by"] == OFFLOAD_RSS
    assert c["measured"]["cross_check"].startswith("DISAGREE: measured ratio 0.400 vs registry 0.200")
    assert OFFLOAD_RSS in c["statement"] and "<= 0.3 of 'none'" in c["statement"]
    ok = _find(_run("offload", None, tmp_path / "ok"), "memory_ratio")
    assert ok["measured"]["cross_check"].startswith("agree within 1.5x")


def test_offload_thresholds_come_from_the_config(tmp_path):
    def strict(c, t):
        c["offload"]["claims"].update(memory_max_ratio=0.2, hidden_min=0.8, capacity_min_ratio=5.0)
    claims = {c["id"]: c for c in _run("offload", strict, tmp_path)}
    # measured: memory 0.25, hidden fractions 0.8 / 0.9 / 0.75, capacity 29/7 = 4.1
    assert {k: claims[k]["status"] for k in ("memory_ratio", "hidden_fraction", "capacity_ratio")} == {
        "memory_ratio": "failed", "hidden_fraction": "failed", "capacity_ratio": "failed"}
    assert claims["capacity_ratio"]["measured"]["threshold"] == 5.0


def test_offload_tables_from_before_the_measured_peak_are_not_judged(tmp_path):
    def old(c, t):
        t["tables/tradeoff.csv"] = t["tables/tradeoff.csv"].drop(columns="peak_measured_by")
        t["tables/capacity.csv"] = t["tables/capacity.csv"].drop(columns="peak_measured_by")
    claims = {c["id"]: c for c in _run("offload", old, tmp_path)}
    for cid in ("memory_ratio", "capacity_ratio"):
        assert claims[cid]["status"] == "not_measured"
        assert "predates the measured peak" in claims[cid]["reason"]


def test_offload_weights_names_the_strategies_it_compares(tmp_path):
    def with_save_on_cpu(c, t):
        c["offload"]["strategies"].append("save_on_cpu")
    c = _find(_run("offload", with_save_on_cpu, tmp_path), "weights_equal")  # CPU: save_on_cpu not run
    assert c["status"] == "passed"
    assert c["measured"]["compared"] == ["optimizer", "activations", "both", "zero_offload"]
    assert c["statement"].startswith("optimizer, activations, both each train to bit-identical weights")
    assert "save_on_cpu not compared on this tier (needs CUDA" in c["statement"]

    def on_cuda(c, t):  # on a GPU it is compared, and its absence is a missing input
        with_save_on_cpu(c, t)
        c["offload"]["device"] = "cuda"
        t["tables/tradeoff.csv"]["tier"] = "gpu>pinned_host"
    c = _find(_run("offload", on_cuda, tmp_path / "cuda"), "weights_equal")
    assert c["status"] == "not_measured" and "save_on_cpu/4L" in c["reason"]
    assert "not compared" not in c["statement"] and "both, save_on_cpu each" in c["statement"]


@pytest.mark.parametrize("name", ["default.yaml", "paper.yaml", "test.yaml"])
def test_the_repo_configs_tuned_notes_name_declared_claims(repo, name):
    from hpcdl.platform.kit.claims import attach_tuned
    from hpcdl.platform.kit.config import load_config

    cfg = load_config(repo / "configs" / name)
    for study in cfg["studies"]:
        ids = importlib.import_module(f"hpcdl.studies.{study}.claims").CLAIMS
        attach_tuned([], cfg[study]["tuned"], ids)   # raises on a note naming an undeclared claim
