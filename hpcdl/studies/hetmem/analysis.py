"""Tables, figures and claims of the hetmem study (used by `python -m hpcdl.platform.cli <step> hetmem`).

raw/ (tasks/hetmem.py): traces.csv (per app: tracing cost, footprint, simulated bounds; failed apps
with their error), validation.csv (app x sampling period x placement), policies.csv (app x
capacity x policy). tables/: tracing, validation, errors (mean/max |error| per app and period),
speed (one estimate vs one reference run), policies (with the gap to the all-fast bound).
The reference is a SIMULATION (column `reference` = "simulated"); every figure and claim says so.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform.claims import claim, every, not_measured
from hpcdl.platform.results import mark_no_data, read_table, save_figure, write_table

POLICIES = ("greedy", "random", "ppo")
CLAIMS = ("estimate_error_le_5pct", "estimate_100x_faster", "placement_near_all_fast")


def _started(study_dir: Path) -> float:
    try:
        prov = json.loads((study_dir / "raw" / "traces.provenance.json").read_text())
        return pd.Timestamp(prov["start_time"]).timestamp()
    except (OSError, KeyError, ValueError):
        return time.time()


def _table(path: Path) -> pd.DataFrame:
    try:
        return read_table(path)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()


# ---------------------------------------------------------------------------------------- tables
def tracing_table(traces: pd.DataFrame) -> pd.DataFrame:
    out = traces.copy()
    if "traced_compute_s" in out:
        out["tracing_cost_compute"] = out["traced_compute_s"] / out["untraced_compute_s"]
        out["tracing_cost_process"] = out["traced_wall_s"] / out["untraced_wall_s"]
    return out


def error_table(val: pd.DataFrame) -> pd.DataFrame:
    if val.empty:
        return pd.DataFrame(
            columns=["app", "sample_every", "mean_abs_error", "max_abs_error", "placements", "reference"]
        )
    val = val.assign(abs_error=val["error"].abs())
    per_app = (
        val.groupby(["app", "sample_every"], sort=False)
        .agg(
            mean_abs_error=("abs_error", "mean"),
            max_abs_error=("abs_error", "max"),
            placements=("abs_error", "size"),
        )
        .reset_index()
    )
    overall = (
        val.groupby("sample_every")
        .agg(
            mean_abs_error=("abs_error", "mean"),
            max_abs_error=("abs_error", "max"),
            placements=("abs_error", "size"),
        )
        .reset_index()
        .assign(app="all")
    )
    return pd.concat([per_app, overall[per_app.columns]], ignore_index=True).assign(reference="simulated")


def speed_table(val: pd.DataFrame, every_n: int) -> pd.DataFrame:
    if val.empty:
        return pd.DataFrame(columns=["app", "estimate_s", "reference_s", "speedup", "reference"])
    v = (
        val[val["sample_every"].eq(every_n)]
        .groupby("app", sort=False)
        .agg(estimate_s=("estimate_s", "first"), reference_s=("reference_s", "first"))
        .reset_index()
    )
    return v.assign(speedup=v["reference_s"] / v["estimate_s"], reference="simulated")


def policy_table(pol: pd.DataFrame) -> pd.DataFrame:
    if pol.empty:
        return pol
    return pol.assign(
        gap_to_all_fast=pol["ref_runtime_s"] / pol["all_fast_runtime_s"] - 1.0,
        est_gap_to_all_fast=pol["est_runtime_s"] / pol["all_fast_runtime_s"] - 1.0,
    )


def aggregate(cfg: dict, study_dir: Path) -> None:
    study_dir = Path(study_dir)
    raw = study_dir / "raw"
    traces = read_table(raw / "traces.csv")
    val, pol = _table(raw / "validation.csv"), _table(raw / "policies.csv")
    started = _started(study_dir)
    tables = study_dir / "tables"
    write_table(tracing_table(traces), tables / "tracing.csv", cfg, started)
    write_table(val, tables / "validation.csv", cfg, started)
    write_table(error_table(val), tables / "errors.csv", cfg, started)
    write_table(speed_table(val, cfg["hetmem"]["sample_every"]), tables / "speed.csv", cfg, started)
    write_table(policy_table(pol), tables / "policies.csv", cfg, started)


# ---------------------------------------------------------------------------------------- figures
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(cfg: dict, study_dir: Path) -> None:
    plt = _plt()
    study_dir = Path(study_dir)
    block = cfg["hetmem"]
    tables, figs = study_dir / "tables", study_dir / "figures"
    val, errs = _table(tables / "validation.csv"), _table(tables / "errors.csv")
    speed, pol = _table(tables / "speed.csv"), _table(tables / "policies.csv")
    n = block["sample_every"]
    tiers = f"{block['tiers']['fast']['name']} vs {block['tiers']['slow']['name']}"

    fig, ax = plt.subplots(figsize=(5.5, 5))
    v = val[val["sample_every"].eq(n)] if not val.empty else val
    if v.empty:
        mark_no_data(ax, "no validation rows (every app failed)")
    else:
        for app, g in v.groupby("app", sort=False):
            ax.scatter(g["ref_runtime_s"] * 1e6, g["est_runtime_s"] * 1e6, label=app, s=18)
        lo, hi = (
            v[["ref_runtime_s", "est_runtime_s"]].min().min() * 1e6,
            v[["ref_runtime_s", "est_runtime_s"]].max().max() * 1e6,
        )
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="estimate = reference")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    ax.set_xlabel("reference runtime, SIMULATED two-tier (µs)")
    ax.set_ylabel(f"differential-tracing estimate, N={n} (µs)")
    ax.set_title(f"Estimate vs simulated reference ({tiers})", fontsize=10)
    save_figure(fig, figs / "parity.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    if errs.empty:
        mark_no_data(ax, "no validation rows")
    else:
        for app, g in errs.groupby("app", sort=False):
            g = g.sort_values("sample_every")
            ax.plot(
                g["sample_every"],
                100 * g["mean_abs_error"],
                "o-",
                lw=2.5 if app == "all" else 1.2,
                color="k" if app == "all" else None,
                label=app,
            )
        ax.axhline(100 * block["error_ceiling"], color="firebrick", ls=":", label="claim ceiling")
        ax.set_xscale("log")
        ax.legend(fontsize=8)
    ax.set_xlabel("sampling period N (1 in N LLC misses sampled)")
    ax.set_ylabel("mean |error| vs simulated reference (%)")
    ax.set_title("Estimator error vs sampling rate (reference simulated)", fontsize=10)
    save_figure(fig, figs / "error_vs_sampling.png")

    apps = list(dict.fromkeys(pol["app"])) if not pol.empty else []
    fig, axes = plt.subplots(1, max(1, len(apps)), figsize=(3.6 * max(1, len(apps)), 3.6), squeeze=False)
    if not apps:
        mark_no_data(axes[0, 0], "no policy rows")
    for ax, app in zip(axes[0], apps, strict=False):
        g = pol[pol["app"].eq(app)]
        for policy, gp in g.groupby("policy", sort=False):
            gp = gp.sort_values("capacity")
            ax.plot(gp["capacity"], gp["ref_runtime_s"] / gp["all_fast_runtime_s"], "o-", label=policy)
        ax.axhline(1.0, color="k", ls="--", lw=1, label="all-fast bound")
        ax.axhline(
            float((g["all_slow_runtime_s"] / g["all_fast_runtime_s"]).iloc[0]),
            color="gray",
            ls=":",
            lw=1,
            label="all-slow",
        )
        ax.set_title(app, fontsize=10)
        ax.set_xlabel("fast capacity (fraction of footprint)")
    axes[0, 0].set_ylabel("simulated runtime / all-fast")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Placement policies: simulated runtime vs fast-memory capacity", fontsize=10)
    fig.tight_layout()
    save_figure(fig, figs / "runtime_vs_fraction.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    if speed.empty:
        mark_no_data(ax, "no timings")
    else:
        x = np.arange(len(speed))
        ax.bar(x - 0.2, speed["reference_s"], 0.4, label="one reference run (simulated: cache sim + timing)")
        ax.bar(x + 0.2, speed["estimate_s"], 0.4, label="one estimate (differential tracing)")
        ax.set_xticks(x, speed["app"])
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    ax.set_ylabel("wall time per placement (s, log)")
    ax.set_title("Cost of one estimate vs one simulated reference run", fontsize=10)
    save_figure(fig, figs / "estimate_vs_reference_time.png")


# ---------------------------------------------------------------------------------------- claims
def _failed_apps(study_dir: Path, cfg: dict, measured: set[str]) -> dict[str, str]:
    """Configured apps without results, and why (their error's last line, or absent)."""
    traces = _table(study_dir / "tables" / "tracing.csv")
    out = {}
    for app in (a["name"] for a in cfg["hetmem"]["apps"]):
        if app in measured:
            continue
        row = traces[traces["app"].eq(app)] if "app" in traces else pd.DataFrame()
        if not row.empty and row["status"].iloc[0] == "failed":
            lines = [ln for ln in str(row["error"].iloc[0]).strip().splitlines() if ln.strip()]
            out[app] = f"app {app} failed: {(lines or ['no error text'])[-1][:300]}"
        else:
            out[app] = f"app {app} has no result"
    return out


def claims(cfg: dict, study_dir: Path) -> list[dict]:
    study_dir = Path(study_dir)
    block = cfg["hetmem"]
    tables = study_dir / "tables"
    val, speed, pol = (
        _table(tables / "validation.csv"),
        _table(tables / "speed.csv"),
        _table(tables / "policies.csv"),
    )
    n = block["sample_every"]
    v = val[val["sample_every"].eq(n)] if not val.empty else val
    missing_val = _failed_apps(study_dir, cfg, set(v["app"]) if not v.empty else set())
    return [
        _claim_error(block, v, missing_val),
        _claim_speed(
            block, speed, _failed_apps(study_dir, cfg, set(speed["app"]) if not speed.empty else set())
        ),
        _claim_bound(block, pol, _failed_apps(study_dir, cfg, set(pol["app"]) if not pol.empty else set())),
    ]


def _claim_error(block: dict, v: pd.DataFrame, missing: dict[str, str]) -> dict:
    ceiling = block["error_ceiling"]
    stmt = (
        f"differential-tracing estimate within {100 * ceiling:g} % mean |error| of the SIMULATED two-tier "
        f"reference over all validation placements of every app (N={block['sample_every']}; "
        "seed: 4.4 % on hardware)"
    )
    per_app = (
        {a: round(float(g["error"].abs().mean()), 5) for a, g in v.groupby("app", sort=False)}
        if not v.empty
        else {}
    )
    mean = float(v["error"].abs().mean()) if not v.empty else None
    measured = {
        "mean_abs_error": mean,
        "max_abs_error": float(v["error"].abs().max()) if not v.empty else None,
        "per_app_mean_abs_error": per_app,
        "placements": int(len(v)),
        "threshold": ceiling,
        "reference": "simulated",
    }
    if missing or mean is None or not np.isfinite(mean):
        return not_measured(
            "estimate_error_le_5pct", stmt, list(missing.values()) or ["no validation rows"], **measured
        )
    return claim("estimate_error_le_5pct", stmt, mean <= ceiling, **measured)


def _claim_speed(block: dict, speed: pd.DataFrame, missing: dict[str, str]) -> dict:
    floor = block["speedup_floor"]
    stmt = (
        f"one estimate at least {floor:g}x faster than one SIMULATED reference run "
        "(cache simulation of the trace + the placement's timing), for every app"
    )
    holds = {r.app: bool(r.speedup >= floor) for r in speed.itertuples()} if not speed.empty else {}
    ratios = {r.app: round(float(r.speedup), 1) for r in speed.itertuples()} if not speed.empty else {}
    return every(
        "estimate_100x_faster", stmt, holds, missing, speedup=ratios, threshold=floor, reference="simulated"
    )


def _claim_bound(block: dict, pol: pd.DataFrame, missing: dict[str, str]) -> dict:
    tol = block["bound_tolerance"]
    cap = max(block["agent"]["capacities"])
    stmt = (
        f"the greedy or the learned (PPO) placement within {100 * tol:g} % of the all-fast bound at the "
        f"largest capacity tried ({cap:g} of the footprint), SIMULATED runtimes, for every app"
    )
    holds, gaps = {}, {}
    if not pol.empty:
        at = pol[np.isclose(pol["capacity"], cap) & pol["policy"].isin(["greedy", "ppo"])]
        for app, g in at.groupby("app", sort=False):
            best = float(g["gap_to_all_fast"].min())
            gaps[app] = {
                p: round(float(x), 4) for p, x in zip(g["policy"], g["gap_to_all_fast"], strict=True)
            }
            holds[app] = best <= tol
        for app in set(pol["app"]) - set(holds):
            missing[app] = f"app {app} has no greedy/ppo row at capacity {cap:g}"
    return every(
        "placement_near_all_fast",
        stmt,
        holds,
        missing,
        gap_to_all_fast=gaps,
        capacity=cap,
        tolerance=tol,
        reference="simulated",
    )
