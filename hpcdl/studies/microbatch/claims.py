"""Claims stage of the micro-batched convolution study: tables/ -> the claims. Three on the
per-kernel algorithm choice the DP/ILP planner makes among PyTorch's algorithms (each distinct
executed ILP plan is not slower than the default, its predicted speedup matches the measured one,
outputs are exact), and μ-cuDNN's own two on cuDNN's engines under workspace limits
(hpcdl.studies.microbatch.cudnn.claims; not measured without a GPU).

The two timing claims compare whole-network runs of a plan and of the default, paired by
interleaved round: each is judged on the 95 % interval of the per-round values
(hpcdl.platform.kit.intervals) and straddles when that interval crosses its line. Policies (and
planners) that give the same plan are one plan: it is judged once, and the evidence names who
shares it. A plan that moves no layer off the default has no prediction to check: the prediction
claim leaves it out, and is not measured when no plan is left.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hpcdl.platform import (
    above,
    all_of,
    below,
    deterministic,
    every,
    failed_because,
    interval_for,
    measured_afresh,
    not_measured,
    read_tables,
)
from hpcdl.studies.microbatch.cudnn import claims as cudnn_claims

CLAIMS = ("algorithm_choice_not_slower", "algorithm_choice_prediction_within_tolerance", "outputs_exact",
          *cudnn_claims.CLAIMS)
# judged on intervals: tests/test_claims.py wants a straddling case of each
INTERVAL_CLAIMS = ("algorithm_choice_not_slower", "algorithm_choice_prediction_within_tolerance")
SEED_NOTE = "μ-cuDNN on a V100 (paper): AlexNet 1.60x, ResNet-18 1.30x, DeepBench 1.60x average, up to 4.54x"
# "not slower" has no allowance: the line is equal time, and noise shows as a straddling interval
NOT_SLOWER_LINE = 1.0
MIN_ROUNDS = 2  # an interval needs two paired rounds
# where each verdict is confirmed (hpcdl.platform.kit.confirmation): `seed` sets the layers' inputs, and
# no kernel's time depends on their values
CONFIRMATION = {
    "algorithm_choice_not_slower": measured_afresh("whole-network times of this run's rounds"),
    "algorithm_choice_prediction_within_tolerance": measured_afresh("planned and measured times of this run"),
    "outputs_exact": deterministic("each plan's outputs against the exact (float64) result and the "
                                   "undivided layer's, element by element"),
    **{cid: measured_afresh("cuDNN engine times of this run")
       for cid in cudnn_claims.CLAIMS},
}


def _missing_networks(block: dict, have: set[str], fails: pd.DataFrame) -> dict[str, str]:
    out = {}
    for net in block["networks"]:
        if net in have:
            continue
        # the cuDNN-engine task's failures are its own claims' (cudnn_claims)
        own = fails[(fails["network"] == net) & ~fails["table"].astype(str).str.startswith("cudnn")] \
            if not fails.empty else fails
        errs = own["error"] if not own.empty else []
        error = next(iter(errs), "")
        if str(error).strip():
            out[net] = failed_because(f"network {net}", error)
        else:
            out[net] = f"network {net} is not in the table"
    return out


def _plans(ilp: pd.DataFrame, block: dict, missing_nets: dict) -> tuple[dict, dict]:
    """The distinct ILP plans of the configured networks and policies, {"net [pol, pol]": (net,
    plan_id)}, and why an expected network or policy has none."""
    plans, missing = {}, {}
    for net in block["networks"]:
        d = ilp[ilp["network"] == net] if not ilp.empty else ilp
        if d.empty:
            missing[net] = missing_nets.get(net, f"network {net} has no executed plan")
            continue
        d = d[d["policy"].isin(block["policies"])]
        for pol in block["policies"]:
            if pol not in set(d["policy"]):
                missing[f"{net}/{pol}"] = f"{net}/{pol} has no executed plan"
        for pid, g in d.groupby("plan_id", sort=False):
            plans[f"{net} [{', '.join(g['policy'])}]"] = (net, pid)
    return plans, missing


def _intervals(plans: dict, rounds: pd.DataFrame, column: str, missing: dict, statistic: str) -> dict:
    """The interval of `column` over each plan's rounds (microbatch.round_statistic: their mean or 20 %
    trimmed mean); a plan with too few rounds goes to `missing`."""
    interval = interval_for(statistic)
    out = {}
    for key, (net, pid) in plans.items():
        d = rounds[(rounds["network"] == net) & (rounds["plan_id"] == pid)] if not rounds.empty else rounds
        values = d[column].dropna().tolist() if not d.empty else []
        if len(values) < MIN_ROUNDS:
            missing[key] = (f"{key} has {len(values)} timed round(s); an interval needs {MIN_ROUNDS} "
                            "(microbatch.exec_repeats)")
            continue
        out[key] = interval(values)
    return out


def _what_it_tests(ilp: pd.DataFrame, block: dict) -> tuple[str, dict]:
    """What the ILP plans change on this device, in words, and the counts per network/policy."""
    d = ilp[ilp["policy"].isin(block["policies"])] if not ilp.empty else ilp
    if d.empty:
        return "", {}
    counts = {f"{r.network}/{r.policy}": {"divided_kernels": None if pd.isna(r.divided_kernels)
                                          else int(r.divided_kernels),
                                          "layers_leaving_default": int(r.layers_changed)}
              for r in d.itertuples()}
    device = "/".join(sorted(set(map(str, d["device"])))).upper()
    divided = d["divided_kernels"].dropna()
    if divided.empty:
        what = f"On this device ({device}) the kernels divided are not recorded."
    elif divided.sum() == 0:
        what = (f"On this device ({device}) no ILP plan divides a mini-batch (every kernel runs "
                "undivided): this tests per-kernel algorithm choice (and fused vs separate backward) "
                "against the framework's default, not micro-batching.")
    else:
        what = (f"On this device ({device}) the ILP plans divide {int(divided.sum())} kernel(s) into "
                "micro-batches over all networks and policies: this tests micro-batching together with "
                "per-kernel algorithm choice.")
    if not d["layers_changed"].astype(int).any():
        what += " No plan leaves the default in any layer: every plan runs the default's computation."
    return " " + what, counts


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    block = cfg["microbatch"]
    nets, rounds, exact, fails = read_tables(study_dir, "network_speedup", "network_rounds", "exactness",
                                             "failures")
    ilp = nets[nets["planner"] == "ilp"] if not nets.empty else nets
    have = set(ilp["network"]) if not ilp.empty else set()
    missing_nets = _missing_networks(block, have, fails)
    what, counts = _what_it_tests(ilp, block)
    plans, plan_missing = _plans(ilp, block, missing_nets)
    # who runs each distinct plan: "policy/planner" variants, the DP's included where they agree
    shared = {key: str(ilp[(ilp["network"] == n) & (ilp["plan_id"] == p)]["shared_by"].iloc[0])
              for key, (n, p) in plans.items()}

    missing = dict(plan_missing)
    statistic = block.get("round_statistic", "mean")
    of = "s' 20 % trimmed mean (Yuen)" if statistic == "trimmed_mean" else ""
    ivs = _intervals(plans, rounds, "speedup", missing, statistic)
    c1 = every(
        "algorithm_choice_not_slower",
        "Per-kernel algorithm choice by the DP/ILP planner among PyTorch's algorithms: each distinct ILP "
        "plan (budget = the default's workspace; policies giving the same plan count "
        "once), executed as the network's whole conv stack (every forward, then every backward), is "
        f"faster than the default stack run in the same interleaved rounds: the 95 % interval of the "
        f"per-round speedup{of} (default time / plan time) lies above {NOT_SLOWER_LINE:g}; it fails when "
        "the whole interval is at or below it (slower), and straddles when noise cannot tell, every "
        "network." + what,
        {k: above(iv, NOT_SLOWER_LINE) for k, iv in ivs.items()},
        missing,
        speedup_per_round={k: iv.evidence(4) for k, iv in ivs.items()},
        shared_by=shared,
        distinct_plans={net: sum(n == net for n, _ in plans.values()) for net in block["networks"]},
        kernels_divided=counts,
        threshold_speedup=NOT_SLOWER_LINE,
        seed_reference=SEED_NOTE,
    )

    tol = block["prediction_tolerance"]
    missing = dict(plan_missing)
    # a plan that moves no layer off the default is the default: its predicted speedup is 1 by
    # construction and its measured one the default timed against itself, so it predicts nothing
    unmoved = [k for k, (n, p) in plans.items()
               if (ilp[(ilp["network"] == n) & (ilp["plan_id"] == p)]["layers_changed"] == 0).all()]
    moved = {k: v for k, v in plans.items() if k not in unmoved}
    ivs = _intervals(moved, rounds, "prediction_error_scaled_frac", missing, statistic)
    raw_errs = {k: round(float(ilp[(ilp["network"] == n) & (ilp["plan_id"] == p)]["prediction_error_frac"]
                               .iloc[0]), 4) for k, (n, p) in moved.items()}
    cid = "algorithm_choice_prediction_within_tolerance"
    statement = (
        "Per-kernel algorithm choice by the DP/ILP planner among PyTorch's algorithms: for each distinct "
        "ILP plan that moves a layer off the default, the planner's predicted speedup (the default's over "
        "the plan's whole-network conv time, each the count-weighted sum of benchmarked kernel times) "
        "matches the speedup measured by executing both whole networks: the 95 % interval of the "
        f"per-round error{of} (predicted / measured speedup - 1) lies within ±{tol:.0%}, every network."
        + what)
    evidence = dict(scaled_error_per_round={k: iv.evidence(4) for k, iv in ivs.items()},
                    unscaled_predicted_over_measured_minus_1=raw_errs, nothing_to_predict=unmoved,
                    shared_by=shared, tolerance=tol)
    if unmoved and not moved and not missing:
        c2 = not_measured(cid, statement, f"no layer left the default in any plan ({'; '.join(unmoved)}): "
                          "each plan is the default, so there is nothing to predict", **evidence)
    else:
        c2 = every(cid, statement, {k: all_of([above(iv, -tol), below(iv, tol)]) for k, iv in ivs.items()},
                   missing, **evidence)

    c3 = _outputs_exact(block, exact, missing_nets)
    return [c1, c2, c3, *cudnn_claims.judge(cfg, study_dir)]


def _outputs_exact(block: dict, exact: pd.DataFrame, missing_nets: dict) -> dict:
    """Against the exact (float64) result (`exact_reference: fp64`): no candidate or plan is farther
    from it than the undivided default is in the same layer, by more than the tolerance. Against the
    default (`default`): each within the tolerance of the default's result."""
    tol, reference = block["exact_tolerance"], block.get("exact_reference", "fp64")
    column = "excess_fp64" if reference == "fp64" else "max_rel_err"
    holds, missing, worst, default_fp64 = {}, {}, {}, {}
    for net in block["networks"]:
        d = exact[exact["network"] == net] if not exact.empty else exact
        if d.empty:
            missing[net] = missing_nets.get(net, f"network {net} has no exactness check")
            continue
        if column not in d or d[column].isna().any():
            missing[net] = (f"network {net}'s exactness table has no float64 reference (a run before "
                            "exact_reference: fp64)")
            continue
        worst[net] = float(d[column].max())
        holds[net] = worst[net] <= tol
        if "default_err_fp64" in d:
            default_fp64[net] = float(d["default_err_fp64"].max())
    results = ("output, input gradient and weight gradient of every candidate (micro-batches [1, B-1]) "
               "and of every executed plan")
    if reference == "fp64":
        statement = (f"{results} are no farther from the exact (float64) result than the undivided "
                     f"default layer's, within {tol:g} relative (fp32)")
        evidence = {"max_excess_over_default": worst, "default_err_fp64": default_fp64}
    else:
        statement = f"{results} equal the undivided default layer within {tol:g} relative (fp32)"
        evidence = {"max_rel_err": worst}
    return every("outputs_exact", statement, holds, missing, **evidence, reference=reference, tolerance=tol)
