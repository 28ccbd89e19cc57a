"""Tables stage of the micro-batched convolution study: raw/ -> tables/ (docs/architecture.md, "Stages").

network_speedup.csv (per network, policy and planner: the plan's predicted and measured whole-network
conv time vs the default's, which variants share the plan, kernels divided), network_rounds.csv (every
interleaved round of every distinct plan against the default's same round), layer_speedup.csv (each
layer's share of the whole-network runs), budget_speedup.csv (ILP speedup vs total workspace budget),
plans.csv (chosen micro-batches and algorithms per kernel), planning_cost.csv (benchmark, DP and
solver time), stack_vetting.csv (each layer a plan moved, timed inside the network before the
timed rounds, and whether the move was kept), exactness.csv (max relative error per candidate and
per executed plan), failures.csv, and μ-cuDNN's own experiment on CUDA (empty elsewhere):
cudnn_limits.csv (per workspace limit, policy, planner and kernel: the undivided baseline and the
plan, benchmarked and executed, each with its mode: WR for the DP, WD for the ILP), cudnn_networks.csv
(their network rollup, cudnn.plan.rollup), cudnn_engines.csv (the run's engine table, its timed and
over-limit rows, in engine_table's columns: what the next two are read off, and what tests/data keeps
of a GPU run) and cudnn_why.csv (why micro-batching does or does not pay per kernel and limit, read
off that engine table: hpcdl.studies.microbatch.cudnn.why).
Predicted times are count-weighted sums over each network's conv layers; the CPU path's measured
network times are whole-network runs, never sums of layer times (the cuDNN experiment times kernels
one at a time: its network times are count-weighted sums of executed kernels, and say so).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import StudyDir, ok_rows, read_or_empty, write_table
from hpcdl.studies.microbatch.cudnn import why as cudnn_why
from hpcdl.studies.microbatch.cudnn.engine_table import FIELDS
from hpcdl.studies.microbatch.cudnn.plan import rollup

# μ-cuDNN (Oyama et al., Cluster 2018) on a V100: a reference, not a bar on this machine
SEED_SPEEDUP = {"alexnet": 1.60, "resnet18": 1.30, "deepbench": 1.60}
RAW = ("bench", "plans", "budget", "execution", "network_rounds", "exactness", "planning", "stack_vetting")
CUDNN_RAW = ("cudnn_engines", "cudnn_limits")


NET_COLS = [
    "network", "policy", "planner", "device", "plan_id", "shared_by", "keeps_default", "layers_changed",
    "divided_kernels", "kernels", "rounds", "measured_plan_s", "measured_default_s", "predicted_plan_s",
    "predicted_default_s", "measured_speedup", "predicted_speedup", "prediction_error_frac",
    "prediction_error_scaled_frac", "max_rel_err", "seed_speedup_v100",
]
ROUND_COLS = ["network", "plan_id", "variants", "round", "plan_time_s", "default_time_s", "speedup",
              "predicted_speedup", "prediction_error_scaled_frac"]


def _plan_predictions(execution: pd.DataFrame) -> pd.DataFrame:
    """Per network, policy and planner: the plan's predicted whole-network time (count-weighted sum
    of its layers' benchmarked times), the default's, and what the plan changes."""
    ok = ok_rows(execution)
    ok = ok.assign(
        p=ok["predicted_time_s"] * ok["count"],
        pd_=ok["predicted_default_time_s"] * ok["count"],
        err=ok[["err_output", "err_grad_input", "err_grad_weight"]].max(axis=1),
        changed=~ok["keeps_default"].astype(bool),
    )
    g = ok.groupby(["network", "policy", "planner", "device", "plan_id"], sort=False)
    out = pd.DataFrame({"predicted_plan_s": g["p"].sum(), "predicted_default_s": g["pd_"].sum(),
                        "max_rel_err": g["err"].max(), "layers_changed": g["changed"].sum()}).reset_index()
    out["predicted_speedup"] = out["predicted_default_s"] / out["predicted_plan_s"]
    return out


def network_rounds(execution: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """Every round of every distinct plan with the default's time of the same round: the per-round
    speedup (default / plan) and prediction error (predicted / measured speedup - 1) the claims'
    intervals are taken over."""
    rd, ex = ok_rows(rounds), ok_rows(execution)
    if rd.empty or ex.empty:
        return pd.DataFrame(columns=ROUND_COLS)
    pred = _plan_predictions(ex).drop_duplicates(["network", "plan_id"])[
        ["network", "plan_id", "predicted_speedup"]]
    rd = rd.merge(pred, on=["network", "plan_id"], how="left")
    rd["speedup"] = rd["default_time_s"] / rd["plan_time_s"]
    rd["prediction_error_scaled_frac"] = rd["predicted_speedup"] / rd["speedup"] - 1
    return rd[ROUND_COLS]


def network_speedup(execution: pd.DataFrame, rounds: pd.DataFrame, plans: pd.DataFrame | None = None
                    ) -> pd.DataFrame:
    """Per network, policy and planner: its plan's whole-network time (median of rounds), the
    default's, their per-round speedup (mean), the prediction, which variants share the plan and
    how many kernels it divides into micro-batches (from `plans`, the raw plans rows)."""
    per_round = network_rounds(execution, rounds)
    if per_round.empty:
        return pd.DataFrame(columns=NET_COLS)
    g = per_round.groupby(["network", "plan_id"], sort=False)
    measured = pd.DataFrame({
        "measured_plan_s": g["plan_time_s"].median(), "measured_default_s": g["default_time_s"].median(),
        "measured_speedup": g["speedup"].mean(), "prediction_error_scaled_frac":
        g["prediction_error_scaled_frac"].mean(), "rounds": g["round"].count(), "shared_by":
        g["variants"].first(),
    }).reset_index()
    out = _plan_predictions(execution).merge(measured, on=["network", "plan_id"], how="inner")
    out["keeps_default"] = out["layers_changed"] == 0
    out["prediction_error_frac"] = out["predicted_plan_s"] / out["measured_plan_s"] - 1
    out["divided_kernels"], out["kernels"] = np.nan, np.nan
    ok = ok_rows(plans) if plans is not None else pd.DataFrame()
    if not ok.empty:
        keys = ["network", "policy", "planner"]
        k = ok.groupby(keys).agg(divided_kernels=("n_micro_batches", lambda n: int((n > 1).sum())),
                                 kernels=("kernel", "count")).reset_index()
        out = out.drop(columns=["divided_kernels", "kernels"]).merge(k, on=keys, how="left")
    out["seed_speedup_v100"] = out["network"].map(SEED_SPEEDUP)
    return out[NET_COLS]


def layer_speedup(execution: pd.DataFrame) -> pd.DataFrame:
    ok = ok_rows(execution)
    if ok.empty:
        return ok
    ok["measured_speedup"] = ok["measured_default_time_s"] / ok["measured_time_s"]
    ok["predicted_speedup"] = ok["predicted_default_time_s"] / ok["predicted_time_s"]
    return ok.drop(columns=["status", "error"], errors="ignore")


EXACTNESS_COLS = ["network", "what", "kernel", "max_rel_err", "err_fp64", "default_err_fp64", "excess_fp64",
                  "layers"]


def _fp64(d: pd.DataFrame, err: str, default: str) -> dict:
    """The worst distance from the exact result, the default's, and the worst excess over the
    default's in the same layer (NaN where the run recorded no float64 reference)."""
    if err not in d or default not in d:
        return {"err_fp64": math.nan, "default_err_fp64": math.nan, "excess_fp64": math.nan}
    return {"err_fp64": float(d[err].max()), "default_err_fp64": float(d[default].max()),
            "excess_fp64": float((d[err] - d[default]).max())}


def exactness_table(exact: pd.DataFrame, execution: pd.DataFrame) -> pd.DataFrame:
    """Per candidate algorithm and kernel (split [1, B-1]) and per executed plan: the max relative
    error against the undivided default, against the exact (float64) result, the default's own
    distance from that, and the worst excess of the first over the second in any one layer."""
    rows = []
    ok = ok_rows(exact)
    if not ok.empty:
        for (net, alg, k), d in ok.groupby(["network", "algorithm", "kernel"]):
            rows.append({"network": net, "what": f"candidate {alg}", "kernel": k,
                         "max_rel_err": float(d["max_rel_err"].max()),
                         **_fp64(d, "err_fp64", "default_err_fp64"), "layers": len(d)})
    ex = ok_rows(execution)
    if not ex.empty:
        for (net, pol, pl), d in ex.groupby(["network", "policy", "planner"]):
            for k, col in (
                ("forward", "err_output"),
                ("backward_data", "err_grad_input"),
                ("backward_filter", "err_grad_weight"),
            ):
                rows.append({"network": net, "what": f"plan {pol}/{pl}", "kernel": k,
                             "max_rel_err": float(d[col].max()),
                             **_fp64(d, f"{col}_fp64", f"default_{col}_fp64"), "layers": len(d)})
    return pd.DataFrame(rows, columns=EXACTNESS_COLS)


def failures(raws: dict[str, pd.DataFrame]) -> pd.DataFrame:
    rows, seen = [], set()
    for name, df in raws.items():
        if df.empty or "status" not in df:
            continue
        for r in df[df["status"] == "failed"].itertuples():
            if (r.network, r.error) not in seen:
                seen.add((r.network, r.error))
                rows.append({"network": r.network, "table": name, "error": r.error})
    return pd.DataFrame(rows, columns=["network", "table", "error"])


def write(cfg: dict, study_dir: Path) -> None:
    started = time.time()
    run = StudyDir(study_dir)
    raws = {k: read_or_empty(run.raw_table(k)) for k in (*RAW, *CUDNN_RAW)}
    nets = network_speedup(raws["execution"], raws["network_rounds"], raws["plans"])
    write_table(nets, run.table("network_speedup"), cfg, started)
    write_table(network_rounds(raws["execution"], raws["network_rounds"]), run.table("network_rounds"), cfg,
                started)
    write_table(layer_speedup(raws["execution"]), run.table("layer_speedup"), cfg, started)
    write_table(ok_rows(raws["budget"]), run.table("budget_speedup"), cfg, started)
    write_table(ok_rows(raws["plans"]), run.table("plans"), cfg, started)
    write_table(ok_rows(raws["planning"]), run.table("planning_cost"), cfg, started)
    write_table(ok_rows(raws["stack_vetting"]), run.table("stack_vetting"), cfg, started)
    write_table(exactness_table(raws["exactness"], raws["execution"]), run.table("exactness"), cfg, started)
    write_table(failures(raws), run.table("failures"), cfg, started)
    limits = ok_rows(raws["cudnn_limits"])
    write_table(limits, run.table("cudnn_limits"), cfg, started)
    write_table(rollup(limits), run.table("cudnn_networks"), cfg, started)
    engines = engine_rows(raws["cudnn_engines"])
    write_table(engines, run.table("cudnn_engines"), cfg, started)
    write_table(cudnn_why_table(cfg["microbatch"], engines), run.table("cudnn_why"), cfg, started)


def engine_rows(raw: pd.DataFrame) -> pd.DataFrame:
    """The run's engine table as engine_table writes one (its columns, in its order), timed and
    over-limit rows only: a skipped plan (most of them: cuDNN deselects TF32 engines) plans nothing."""
    cols = [c for c in FIELDS if c in raw.columns]
    if raw.empty or "status" not in raw:
        return pd.DataFrame(columns=list(FIELDS))
    return raw[raw["status"].isin(["ok", "over_limit"])][cols].reset_index(drop=True)


def cudnn_why_table(block: dict, engines: pd.DataFrame) -> pd.DataFrame:
    """cudnn_why.why_table on the run's engine table under the limits each network was planned under."""
    if engines.empty:
        return pd.DataFrame(columns=cudnn_why.COLUMNS)
    nets = list(dict.fromkeys(engines["network"]))
    return cudnn_why.why_table(engines, cudnn_why.limits_for(block, nets), block["policies"])
