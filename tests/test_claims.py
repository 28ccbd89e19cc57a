"""Every claim of every study, fed small synthetic tables that pass it, fail it and lack its input.

Each study's baseline tables below pass all its claims; a case mutates them and names the
status the claim must then have (and, for a missing input, words the reason must contain).
`test_every_declared_claim_has_a_pass_fail_and_missing_case` fails when a study declares a
claim (its analysis module's CLAIMS) that has no case of each kind here.
"""

from __future__ import annotations

import copy
import importlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hpcdl.claims import claim, declared, every, not_measured, write_claims
from hpcdl.config import STUDIES
from hpcdl.shuffle.run import SAMPLE_BYTES

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
    }
}


def _checkpoint() -> tuple[dict, dict]:
    rows = [
        {
            "format": f,
            "mode": m,
            "process_group": False,
            "ranks": 1,
            "n_params": 1024,
            "blocking_s": 1.0 if m == "sync" else 0.05,
            "bw_over_ceiling": 0.95,
            "roundtrip_ok": True,
        }
        for f in ("torch", "npz")
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


# ------------------------------------------------------------------------------------------- hpo
HPO_CFG = {
    "hpo": {
        "grid": {"workers": [1, 2], "optimizer": ["adam", "sgd"], "batch_size": [32], "epochs": [1]},
        "pruner": "median",
        "sampler": "random",
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


# --------------------------------------------------------------------------------------- shuffle
N, M = 400, 2
SHUFFLE_CFG = {
    "shuffle": {
        "n_train": N,
        "epochs": 2,
        "tolerance_pt": 1.0,
        "alpha": 0.1,
        "seeds": [0],
        "grids": [{"world_sizes": [M], "qs": [0, 0.1, 1], "partitionings": ["random", "skewed"]}],
        "kakurenbo": {"fractions": [0, 0.2], "world_size": M},
    }
}


def _point(strategy, q, part, f=0.0):
    return f"{strategy}-q{q:g}-{part}-M{M}-F{f:g}-s0"


def _final_row(strategy, q, part, acc, f=0.0, time_s=10.0, shown_as=None):
    label = strategy if strategy != "partial" else f"partial-{q:g}"
    held = int(np.ceil(N / M) + q * N / M) if strategy == "partial" else N // M
    return {
        "point": _point(strategy, q, part, f),
        "strategy": strategy,
        "q": q,
        "label": label,
        "partitioning": shown_as or part,
        "world_size": M,
        "seed": 0,
        "kakurenbo_fraction": f,
        "final_val_acc": acc,
        "train_time_s": time_s,
        "samples_held_max": held,
        "held_rows_max": held + (int(q * N / M) if strategy == "partial" else 0),
    }


def _shuffle() -> tuple[dict, dict]:
    final = [
        _final_row("local", 0.0, "random", 0.795),
        _final_row("partial", 0.1, "random", 0.80),
        _final_row("local", 0.0, "skewed", 0.60),
        _final_row("partial", 0.1, "skewed", 0.795),
    ]
    for part in ("random", "skewed"):  # the global baseline is shown in both partitionings
        final.append(_final_row("global", 1.0, "shared", 0.80, shown_as=part))
        final.append(_final_row("global", 1.0, "shared", 0.795, f=0.2, time_s=8.0, shown_as=part))
    epochs = [
        {
            "point": _point("partial", 0.1, part),
            "q": 0.1,
            "epoch": e,
            "samples_sent": 0.1 * N,
            "bytes_sent": 0.1 * N * SAMPLE_BYTES,
            "bytes_recv": 0.1 * N * SAMPLE_BYTES,
        }
        for part in ("random", "skewed")
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


def _two_fractions(cfg, t):
    """F=0.1 saves time, F=0.2 loses it: a claim over 'any F' would pass, one over every F must not."""
    cfg["shuffle"]["kakurenbo"]["fractions"] = [0, 0.1, 0.2]
    _final_set(t, _point("global", 1.0, "shared", 0.2), "train_time_s", 10.3)
    extra = [
        _final_row("global", 1.0, "shared", 0.80, f=0.1, time_s=9.2, shown_as=p) for p in ("random", "skewed")
    ]
    t["tables/final.csv"] = pd.concat([t["tables/final.csv"], pd.DataFrame(extra)], ignore_index=True)
    t["raw/points.csv"] = pd.concat(
        [
            t["raw/points.csv"],
            pd.DataFrame([{"point": _point("global", 1.0, "shared", 0.1), "status": "ok", "error": ""}]),
        ],
        ignore_index=True,
    )


# --------------------------------------------------------------------------------------- spatial
SPATIAL_CFG = {
    "spatial": {
        "batch_size": 2,
        "iterations": 3,
        "repeats": 1,
        "strong": {"grid": 16, "layouts": [[1, 1, 1], [1, 2, 1]]},
        "weak": {"grid": 8, "layouts": []},
        "hybrid": {"grid": 16, "layouts": []},
        "train": {"grid": 16, "layout": [1, 1, 1], "iterations": 6, "batch_size": 2},
        "exactness": {"tolerance": 1e-10, "layouts": [[1, 2, 1]]},
        "claims": {"min_efficiency": 0.85, "max_oracle_error": 0.15, "loss_drop": 0.8},
        "extrapolate": {"grid": 512, "gpus": [4, 16]},
        "machine": {"peak_tflops": 7.8, "memory_gb": 16},
    }
}
RUNS = ["strong-d1x1x1", "strong-d1x2x1", "ceiling-d1x2x1", "train-d1x1x1"]


def _spatial() -> tuple[dict, dict]:
    ext = [
        {"gpus": g, "family": fam, "strategy": strat, "chosen": chosen, "feasible": feas, "total_s": 1.0}
        for g in (4, 16)
        for fam, strat, chosen, feas in (
            ("data", "data", False, False),
            ("data x spatial", f"data x spatial {g // 4}x4", True, True),
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


BUILDERS = {"checkpoint": _checkpoint, "hpo": _hpo, "shuffle": _shuffle, "spatial": _spatial}

# (study, declared claim id, outcome, mutate(cfg, tables), words the reason must contain)
CASES = [
    # checkpoint
    ("checkpoint", "async_blocking", "passed", None, None),
    (
        "checkpoint",
        "async_blocking",
        "failed",
        lambda c, t: _set(
            t,
            "tables/io_cost.csv",
            lambda d: (d["format"] == "npz") & (d["mode"] == "async"),
            "blocking_s",
            0.5,
        ),
        None,
    ),
    (
        "checkpoint",
        "async_blocking",
        "not_measured",
        lambda c, t: _io_failed(t, "npz", "async", "Traceback\nOSError: [Errno 28] No space left on device"),
        ["npz", "mode=async", "No space left on device"],
    ),
    ("checkpoint", "bandwidth_vs_ceiling", "passed", None, None),
    (
        "checkpoint",
        "bandwidth_vs_ceiling",
        "failed",
        lambda c, t: _set(t, "tables/io_cost.csv", lambda d: d["ranks"] == 1, "bw_over_ceiling", 0.6),
        None,
    ),
    (
        "checkpoint",
        "bandwidth_vs_ceiling",
        "not_measured",
        lambda c, t: (
            _set(t, "tables/io_cost.csv", lambda d: d["ranks"] == 1, "bw_over_ceiling", 0.6),
            _io_failed(t, "npz", "sync", "RuntimeError: scratch limit exceeded"),
        ),
        ["npz", "scratch limit exceeded"],
    ),
    ("checkpoint", "resume_bit_identical", "passed", None, None),
    (
        "checkpoint",
        "resume_bit_identical",
        "failed",
        lambda c, t: _set(t, "tables/resume.csv", lambda d: d["format"] == "npz", "bit_identical", False),
        None,
    ),
    (
        "checkpoint",
        "resume_bit_identical",
        "not_measured",
        lambda c, t: t.__setitem__(
            "tables/resume.csv",
            t["tables/resume.csv"].assign(
                status=["ok", "failed"],
                bit_identical=[True, np.nan],
                error=["", "Traceback\nValueError: bad manifest"],
            ),
        ),
        ["npz", "bad manifest"],
    ),
    ("checkpoint", "roundtrip", "passed", None, None),
    (
        "checkpoint",
        "roundtrip",
        "failed",
        lambda c, t: _set(t, "tables/io_cost.csv", lambda d: d["format"] == "dcp", "roundtrip_ok", False),
        None,
    ),
    (
        "checkpoint",
        "roundtrip",
        "not_measured",
        lambda c, t: _io_failed(t, "dcp", "sync", "RankFailure: timed out", ranks=2),
        ["dcp/sync/2 rank(s)", "timed out"],
    ),
    # hpo
    ("hpo", "hpo.grid_speedup", "passed", None, None),
    (
        "hpo",
        "hpo.grid_speedup",
        "failed",
        lambda c, t: _set(t, "tables/grid_scaling.csv", lambda d: d["workers"] == 2, "elapsed_s", 8.0),
        None,
    ),
    (
        "hpo",
        "hpo.grid_speedup",
        "not_measured",
        lambda c, t: _set(t, "tables/grid_scaling.csv", lambda d: d["workers"] == 2, "n_trials", 1),
        ["grid-2w finished 1/2 trials"],
    ),
    ("hpo", "hpo.best_test_acc", "passed", None, None),
    (
        "hpo",
        "hpo.best_test_acc",
        "failed",
        lambda c, t: _set(t, "tables/best_config.csv", lambda d: d["overall_best"], "test_acc", 0.5),
        None,
    ),
    (
        "hpo",
        "hpo.best_test_acc",
        "not_measured",
        lambda c, t: _set(t, "tables/best_config.csv", lambda d: d["overall_best"], "test_acc", np.nan),
        ["random", "no test accuracy"],
    ),
    ("hpo", "hpo.pruning", "passed", None, None),
    (
        "hpo",
        "hpo.pruning",
        "failed",
        lambda c, t: _set(t, "tables/pruning.csv", lambda d: d.index == 0, "saving_fraction", 0.1),
        None,
    ),
    (
        "hpo",
        "hpo.pruning",
        "not_measured",
        lambda c, t: t.__setitem__("tables/pruning.csv", t["tables/pruning.csv"].iloc[0:0]),
        ["random-median", "missing"],
    ),
    # shuffle
    ("shuffle", "random_local_partial_match_global_M{M}", "passed", None, None),
    (
        "shuffle",
        "random_local_partial_match_global_M{M}",
        "failed",
        lambda c, t: _final_set(t, _point("local", 0.0, "random"), "final_val_acc", 0.70),
        None,
    ),
    (
        "shuffle",
        "random_local_partial_match_global_M{M}",
        "not_measured",
        lambda c, t: _shuffle_failed(t, _point("partial", 0.1, "random")),
        ["point partial-q0.1-random-M2-F0-s0 failed", "on 2 ranks failed"],
    ),
    ("shuffle", "skewed_partial_recovers_global_M{M}", "passed", None, None),
    (
        "shuffle",
        "skewed_partial_recovers_global_M{M}",
        "failed",
        lambda c, t: _final_set(t, _point("local", 0.0, "skewed"), "final_val_acc", 0.80),
        None,
    ),
    (
        "shuffle",
        "skewed_partial_recovers_global_M{M}",
        "not_measured",
        lambda c, t: _shuffle_failed(t, _point("global", 1.0, "shared")),
        ["global-q1-shared-M2-F0-s0 failed"],
    ),
    ("shuffle", "bytes_per_epoch_equal_QN", "passed", None, None),
    (
        "shuffle",
        "bytes_per_epoch_equal_QN",
        "failed",
        lambda c, t: _set(t, "tables/epochs.csv", lambda d: d.index == 3, "bytes_recv", 39 * SAMPLE_BYTES),
        None,
    ),
    (
        "shuffle",
        "bytes_per_epoch_equal_QN",
        "not_measured",
        lambda c, t: t.__setitem__("tables/epochs.csv", t["tables/epochs.csv"].iloc[:3]),
        ["partial-q0.1-skewed-M2-F0-s0", "1 of 2 epochs recorded"],
    ),
    ("shuffle", "held_at_most_1_plus_Q_N_over_M", "passed", None, None),
    (
        "shuffle",
        "held_at_most_1_plus_Q_N_over_M",
        "failed",
        lambda c, t: _final_set(t, _point("partial", 0.1, "skewed"), "samples_held_max", 221),
        None,
    ),
    (
        "shuffle",
        "held_at_most_1_plus_Q_N_over_M",
        "not_measured",
        lambda c, t: _shuffle_failed(
            t, _point("partial", 0.1, "skewed"), "ExchangeError: rank 1: shuffle exchange of epoch 1 failed"
        ),
        ["partial-q0.1-skewed-M2-F0-s0 failed", "ExchangeError"],
    ),
    ("shuffle", "kakurenbo_saves_time", "passed", None, None),
    ("shuffle", "kakurenbo_saves_time", "failed", _two_fractions, None),
    (
        "shuffle",
        "kakurenbo_saves_time",
        "not_measured",
        lambda c, t: _shuffle_failed(t, _point("global", 1.0, "shared", 0.2)),
        ["F=0.2", "failed"],
    ),
    # spatial
    ("spatial", "partitioned_exact", "passed", None, None),
    (
        "spatial",
        "partitioned_exact",
        "failed",
        lambda c, t: _set(t, "tables/exactness.csv", lambda d: d.index == 1, "err_grad_params", 1e-6),
        None,
    ),
    (
        "spatial",
        "partitioned_exact",
        "not_measured",
        lambda c, t: t.__setitem__("tables/exactness.csv", t["tables/exactness.csv"].iloc[0:0]),
        ["1x2x1"],
    ),
    ("spatial", "strong_efficiency_2", "passed", None, None),
    (
        "spatial",
        "strong_efficiency_2",
        "failed",
        lambda c, t: _set(
            t, "tables/runs.csv", lambda d: d["run"] == "strong-d1x2x1", "time_per_iter_s", 0.9
        ),
        None,
    ),
    (
        "spatial",
        "strong_efficiency_2",
        "not_measured",
        lambda c, t: _spatial_failed(t, "strong-d1x2x1"),
        ["run strong-d1x2x1 failed", "HaloExchangeError"],
    ),
    (
        "spatial",
        "strong_efficiency_2",
        "not_measured",
        lambda c, t: _spatial_failed(t, "ceiling-d1x2x1", "RankFailure: timed out"),
        ["run ceiling-d1x2x1 failed", "timed out"],
    ),
    (
        "spatial",
        "strong_efficiency_2",
        "not_measured",
        lambda c, t: _spatial_disturbed(t, "ceiling-d1x2x1"),
        ["disturbed by other load", "ceiling-d1x2x1 1.20"],
    ),
    ("spatial", "oracle_error", "passed", None, None),
    (
        "spatial",
        "oracle_error",
        "not_measured",
        lambda c, t: _spatial_disturbed(t, "strong-d1x1x1"),
        ["disturbed by other load", "strong-d1x1x1 1.20"],
    ),
    (
        "spatial",
        "oracle_error",
        "failed",
        lambda c, t: _set(t, "tables/runs.csv", lambda d: d["run"] == "strong-d1x2x1", "oracle_error", -0.6),
        None,
    ),
    (
        "spatial",
        "oracle_error",
        "not_measured",
        lambda c, t: _spatial_failed(t, "train-d1x1x1", "RankFailure: timed out"),
        ["train-d1x1x1", "timed out"],
    ),
    ("spatial", "loss_falls", "passed", None, None),
    (
        "spatial",
        "loss_falls",
        "failed",
        lambda c, t: _set(t, "tables/loss.csv", lambda d: d.index >= 0, "loss", 1.0),
        None,
    ),
    (
        "spatial",
        "loss_falls",
        "not_measured",
        lambda c, t: (
            t.__setitem__("tables/loss.csv", t["tables/loss.csv"].iloc[0:0]),
            _spatial_failed(t, "train-d1x1x1", "MemoryError"),
        ),
        ["train-d1x1x1 failed", "MemoryError"],
    ),
    ("spatial", "oracle_picks_spatial", "passed", None, None),
    ("spatial", "oracle_picks_spatial", "failed", lambda c, t: _spatial_pick(t, "data"), None),
    (
        "spatial",
        "oracle_picks_spatial",
        "not_measured",
        lambda c, t: _spatial_failed(t, "strong-d1x1x1"),
        ["oracle_error", "strong-d1x1x1 failed"],
    ),
]


def _run(study, mutate, tmp_path):
    cfg, tables = BUILDERS[study]()
    if mutate is not None:
        mutate(cfg, tables)
    analysis = importlib.import_module(f"hpcdl.{study}.analysis")
    claims = analysis.claims(cfg, _write(tmp_path / study, tables))
    write_claims(tmp_path / study, study, claims, analysis.CLAIMS)  # every id declared, every field sound
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


@pytest.mark.parametrize("study", STUDIES)
def test_baseline_passes_every_claim_and_emits_only_declared_ids(study, tmp_path):
    claims = _run(study, None, tmp_path)
    analysis = importlib.import_module(f"hpcdl.{study}.analysis")
    assert {c["status"] for c in claims} == {"passed"}, [c for c in claims if not c["passed"]]
    ids = {d for d in analysis.CLAIMS if any(declared(c["id"], [d]) for c in claims)}
    assert ids == set(analysis.CLAIMS), (
        f"{study} declares claims it never emits: {set(analysis.CLAIMS) - ids}"
    )


def test_every_declared_claim_has_a_pass_fail_and_missing_case():
    covered = {(s, c, o) for s, c, o, _, _ in CASES}
    absent = [
        (study, cid, o)
        for study in STUDIES
        for cid in importlib.import_module(f"hpcdl.{study}.analysis").CLAIMS
        for o in OUTCOMES
        if (study, cid, o) not in covered
    ]
    assert not absent, f"claims without a test of each outcome: {absent}"


# ------------------------------------------------------------------ specific rules and the writer
def test_kakurenbo_evidence_lists_every_fraction(tmp_path):
    c = _find(_run("shuffle", _two_fractions, tmp_path), "kakurenbo_saves_time")
    assert c["measured"]["holds"] == {"F=0.1": True, "F=0.2": False}
    assert c["measured"]["time_saving"] == {"F=0.1": pytest.approx(0.08), "F=0.2": pytest.approx(-0.03)}
    assert "every configured hiding fraction F in [0.1, 0.2]" in c["statement"]


def test_held_claim_compares_measured_samples_with_the_real_bound(tmp_path):
    c = _find(_run("shuffle", None, tmp_path), "held_at_most_1_plus_Q_N_over_M")
    pid = _point("partial", 0.1, "random")
    assert c["measured"]["bound"][pid] == pytest.approx(200 + 20)  # ceil(400/2) + 0.1*400/2
    assert c["measured"]["samples_held_max"][pid] == 220
    assert c["measured"]["buffer_rows_max"][pid] == 240  # staged copies are extra rows


def test_oracle_pick_fails_when_the_oracle_misses_this_run(tmp_path):
    mutate = lambda c, t: _set(t, "tables/runs.csv", lambda d: d.index >= 0, "oracle_error", 0.4)  # noqa: E731
    c = _find(_run("spatial", mutate, tmp_path), "oracle_picks_spatial")
    assert c["status"] == "failed" and c["measured"]["picked"].startswith("data x spatial")
    assert c["measured"]["oracle_mean_abs_error"] == pytest.approx(0.4)
    assert "spatial.machine" in c["statement"] and "not measured here" in c["statement"]
    assert c["measured"]["target_machine"] == SPATIAL_CFG["spatial"]["machine"]


def test_a_failed_measured_item_outranks_a_missing_one():
    c = every("x", "every X holds", {"a": False}, {"b": "point b failed"}, threshold=1)
    assert c["status"] == "failed" and c["measured"]["missing"] == {"b": "point b failed"}
    c = every("x", "every X holds", {"a": True}, {"b": "point b failed"}, threshold=1)
    assert c["status"] == "not_measured" and c["reason"] == "not measured: b: point b failed"
    assert every("x", "every X holds", {}, {})["status"] == "not_measured"


def test_claims_json_and_html_show_three_statuses(tmp_path):
    claims = [
        claim("fast", "x is fast", True, speedup=2.0, threshold=1.5),
        claim("small", "y < 1", False, y=3, threshold=1),
        not_measured("exact", "z is exact", "point z-M8 failed", threshold=0),
    ]
    json_path, html_path = write_claims(tmp_path, "demo", claims, ["fast", "small", "exact"])
    doc = json.loads(json_path.read_text())
    assert (doc["passed"], doc["failed"], doc["not_measured"], doc["total"]) == (1, 1, 1, 3)
    assert [c["status"] for c in doc["claims"]] == ["passed", "failed", "not_measured"]
    assert doc["claims"][2]["reason"] == "not measured: point z-M8 failed"
    page = html_path.read_text()
    assert "1/3 claims hold on this run (1 failed, 1 not measured)" in page
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
