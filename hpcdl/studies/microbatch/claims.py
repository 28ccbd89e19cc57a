"""Claims stage of the micro-batched convolution study: tables/ -> the three claims (the executed ILP
plan is not slower than the default, its predicted time is within tolerance, outputs are exact)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hpcdl.platform.claims import every
from hpcdl.platform.stages import failed_because, read_or_empty

CLAIMS = ("plan_not_slower", "prediction_within_tolerance", "outputs_exact")
SEED_NOTE = "μ-cuDNN on a V100 (paper): AlexNet 1.60x, ResNet-18 1.30x, DeepBench 1.60x average, up to 4.54x"


def _missing_networks(block: dict, have: set[str], fails: pd.DataFrame) -> dict[str, str]:
    out = {}
    for net in block["networks"]:
        if net in have:
            continue
        errs = fails[fails["network"] == net]["error"] if not fails.empty else []
        error = next(iter(errs), "")
        if str(error).strip():
            out[net] = failed_because(f"network {net}", error)
        else:
            out[net] = f"network {net} is not in the table"
    return out


def _per_plan(ilp, block: dict, missing_nets: dict, column: str) -> tuple[dict, dict]:
    """One value of `column` per configured network/policy ILP plan, and why each absent one is."""
    values, missing = {}, {}
    for net in block["networks"]:
        for pol in block["policies"]:
            key = f"{net}/{pol}"
            d = ilp[(ilp["network"] == net) & (ilp["policy"] == pol)] if not ilp.empty else ilp
            if d.empty:
                missing[key] = missing_nets.get(net, f"{key} has no executed plan")
                continue
            values[key] = round(float(d[column].iloc[0]), 4)
    return values, missing


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    block = cfg["microbatch"]
    tables = Path(study_dir) / "tables"
    nets = read_or_empty(tables / "network_speedup.csv")
    exact = read_or_empty(tables / "exactness.csv")
    fails = read_or_empty(tables / "failures.csv")
    ilp = nets[nets["planner"] == "ilp"] if not nets.empty else nets
    have = set(ilp["network"]) if not ilp.empty else set()
    missing_nets = _missing_networks(block, have, fails)

    speed, missing = _per_plan(ilp, block, missing_nets, "measured_speedup")
    holds = {k: v >= block["min_speedup"] for k, v in speed.items()}
    c1 = every(
        "plan_not_slower",
        f"the executed ILP plan (budget = the default's workspace) runs at >= {block['min_speedup']}x the "
        "default's conv time, every network and policy",
        holds,
        missing,
        measured_speedup=speed,
        min_speedup=block["min_speedup"],
        seed_reference=SEED_NOTE,
    )

    errs, missing = _per_plan(ilp, block, missing_nets, "prediction_error_scaled_frac")
    raw_errs, _ = _per_plan(ilp, block, missing_nets, "prediction_error_frac")
    holds = {k: abs(v) <= block["prediction_tolerance"] for k, v in errs.items()}
    c2 = every(
        "prediction_within_tolerance",
        f"the DP/ILP's predicted network conv time, scaled by this run's executed / benchmarked time of "
        f"the default layers, is within {block['prediction_tolerance']:.0%} of the measured time of the "
        "executed plan (equivalently: predicted and measured speedup over the default agree), every "
        "network and policy",
        holds,
        missing,
        scaled_predicted_over_measured_minus_1=errs,
        unscaled_predicted_over_measured_minus_1=raw_errs,
        tolerance=block["prediction_tolerance"],
    )

    holds, missing, worst = {}, {}, {}
    for net in block["networks"]:
        d = exact[exact["network"] == net] if not exact.empty else exact
        if d.empty:
            missing[net] = missing_nets.get(net, f"network {net} has no exactness check")
            continue
        worst[net] = float(d["max_rel_err"].max())
        holds[net] = worst[net] <= block["exact_tolerance"]
    c3 = every(
        "outputs_exact",
        f"output, input gradient and weight gradient of every candidate (micro-batches [1, B-1]) and of "
        f"every executed plan equal the undivided default layer within {block['exact_tolerance']:g} "
        "relative (fp32)",
        holds,
        missing,
        max_rel_err=worst,
        tolerance=block["exact_tolerance"],
    )
    return [c1, c2, c3]
