"""The two claims of μ-cuDNN's own experiment (cuDNN's engines by id under workspace limits, CUDA
only), judged on tables/cudnn_limits.csv and tables/cudnn_networks.csv; claims.judge adds them.

cudnn_plan_not_slower      at every limit, each kernel's DP plan, executed, is not slower than the
                           undivided baseline under the same limit beyond the noise its repeats
                           show, and each network's ILP plan (one budget for all kernels) likewise;
                           a plan that is its baseline is nothing to judge (listed, not held)
cudnn_tight_limit_speedup  at the tightest limit, AlexNet's and ResNet-18's DP plans beat the
                           baseline by more than that noise; the papers' speedups stand beside ours

Where the run has no such experiment (device cpu, or microbatch.cudnn.engines false) both are not
measured: the effect needs cuDNN's workspace-limited algorithms, which only a GPU has.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hpcdl.platform import every, failed_because, not_measured, read_tables
from hpcdl.studies.microbatch.cudnn.plan import cudnn_networks

CLAIMS = ("cudnn_plan_not_slower", "cudnn_tight_limit_speedup")
NEEDS = "needs cuDNN's workspace-limited algorithms (a GPU)"
# μ-cuDNN's published network speedups over undivided cuDNN under the same workspace limit (the
# project's papers list, microbatch ids alexnet_v100, resnet18_v100, alexnet_p100, resnet18_p100)
PAPER_SPEEDUP = {"alexnet": {"V100": 1.60, "P100-SXM2": 1.63}, "resnet18": {"V100": 1.30, "P100-SXM2": 1.21}}
PAPER_SOURCES = {
    "V100": "Oyama, PhD thesis summary (2021): \"we achieve speedups of 1.60x for AlexNet and 1.30x "
            "for ResNet-18 on an NVIDIA V100 GPU\"",
    "P100-SXM2": "Oyama, Ben-Nun, Hoefler, Matsuoka, μ-cuDNN (arXiv 1804.04806; IEEE CLUSTER 2018), "
                 "abstract: \"achieving speedups of 1.63x for AlexNet and 1.21x for ResNet-18 on "
                 "P100-SXM2 GPU\"",
}
PAPER_NOTE = ("μ-cuDNN's papers: AlexNet 1.60x and ResNet-18 1.30x on a V100 (Oyama's thesis summary, "
              "2021), 1.63x and 1.21x on a P100-SXM2 (arXiv 1804.04806, abstract), each over undivided "
              "cuDNN under the same workspace limit; the quoted sentences name no limit or mini-batch")
TIMING = ("Kernels are executed by cuDNN engine id and timed one at a time in interleaved rounds; a "
          "network's time is the count-weighted sum of its kernels' median times.")


def _truthy(s: pd.Series) -> pd.Series:
    return s.astype(str).str.lower().eq("true")


def _text(v, empty: str) -> str:
    return v if isinstance(v, str) and v else empty


def _true(v) -> bool:
    return str(v).lower() == "true"


def _first(s: pd.Series) -> float | None:
    return round(float(s.iloc[0]), 4) if len(s) and pd.notna(s.iloc[0]) else None


def _not_run(block: dict, nets: pd.DataFrame, lim: pd.DataFrame) -> str | None:
    """Why this run has no cuDNN-engine experiment (None: it has one)."""
    if not (block.get("cudnn") or {}).get("engines", False):
        return "microbatch.cudnn.engines is false"
    device = block.get("device", "auto")
    if device == "auto":  # resolved where the run happened: its tables say where
        seen = {str(v) for df in (nets, lim) if not df.empty and "device" in df for v in df["device"]}
        device = "cpu" if seen and "cuda" not in seen else "cuda"
    return "this run's device is cpu" if device == "cpu" else None


def _missing(block: dict, lim: pd.DataFrame, fails: pd.DataFrame) -> dict[str, str]:
    """Networks with no cuDNN rows, and why (their task's error where it failed)."""
    out = {}
    for net in block["networks"]:
        if not lim.empty and (lim["network"] == net).any():
            continue
        f = fails[(fails["network"] == net) & fails["table"].astype(str).str.startswith("cudnn")] \
            if not fails.empty else fails
        out[net] = (failed_because(f"network {net}'s cuDNN run", f["error"].iloc[0]) if len(f)
                    else f"network {net} has no cuDNN limit rows")
    return out


def _ratio_over(d: pd.DataFrame) -> pd.Series:
    """Plan time / baseline time - 1 - noise allowance: > 0 is slower than the noise explains."""
    return d["measured_time_s"] / d["baseline_measured_time_s"] - 1 - d["noise_frac"]


def not_slower(block: dict, lim: pd.DataFrame, nets: pd.DataFrame, missing_nets: dict) -> dict:
    cid = "cudnn_plan_not_slower"
    statement = (
        "Under every workspace limit (microbatch.cudnn.limits_mib and the library default, 64 MiB), each "
        "kernel's DP plan (μ-cuDNN per kernel under the limit), executed, takes no longer than the "
        "undivided baseline (the fastest cuDNN engine fitting the same limit at the full mini-batch) "
        "beyond the noise its repeats show ((slowest - fastest) / median round, the larger of the two), "
        "every kernel; each network's ILP plan (one budget, the limit times its kernels) likewise over "
        "the network's summed time, as the ILP may give one kernel's workspace to another. A plan that "
        "runs its baseline's engines and micro-batches is the baseline itself: nothing to judge. " + TIMING)
    holds, missing, worst, unjudged, nothing = {}, dict(missing_nets), {}, {}, []
    for net in block["networks"]:
        if net in missing_nets:
            continue
        d = lim[(lim["network"] == net) & (lim["planner"] == "dp")]
        for (label, policy), g in d.groupby(["limit_label", "policy"], sort=False):
            key = f"{net} dp {label} [{policy}]"
            judged = g[_truthy(g["feasible"]) & g["baseline_measured_time_s"].notna()]
            unjudged.update({f"{key} {r.layer}/{r.kernel}": _text(r.reason, "no baseline")
                             for r in g[~g.index.isin(judged.index)].itertuples()})
            if judged.empty:
                continue
            # a kernel whose plan runs its baseline's division (same engines, same micro-batches) is
            # one measurement against itself: nothing to judge; a limit with only such kernels neither
            differ = judged[~_truthy(judged["same_as_baseline"])]
            if differ.empty:
                nothing.append(key)
                continue
            if differ["measured_time_s"].isna().any():
                missing[key] = "a kernel with a plan and a baseline was not executed"
                continue
            over = _ratio_over(differ)
            holds[key] = bool((over <= 0).all())
            w = differ.loc[over.idxmax()]
            worst[key] = {"kernel": f"{w['layer']}/{w['kernel']}", "micro_batches": str(w["micro_batches"]),
                          **_ratio(w["measured_time_s"], w["baseline_measured_time_s"], w["noise_frac"])}
        n = nets[(nets["network"] == net) & (nets["planner"] == "ilp")] if not nets.empty else nets
        for r in n.itertuples():
            key = f"{net} ilp {r.limit_label} [{r.policy}]"
            if not _true(r.feasible):
                unjudged[key] = "the ILP or a baseline is infeasible at this limit"
                continue
            if _is_baseline(lim, net, r.limit_label, r.policy, "ilp"):
                nothing.append(key)
                continue
            if pd.isna(r.measured_time_s):
                missing[key] = "the ILP plan or its baselines were not executed"
                continue
            holds[key] = bool(r.measured_time_s <= r.baseline_measured_time_s * (1 + r.noise_frac))
            worst[key] = _ratio(r.measured_time_s, r.baseline_measured_time_s, r.noise_frac)
    kernels = [(k, v) for k, v in worst.items() if v.get("kernel")]
    where, w = max(kernels, key=lambda kv: kv[1]["plan_over_baseline"] - kv[1]["noise_allowance"],
                   default=(None, None))
    evidence = dict(worst_kernel=w and {"where": where, **w}, worst_per_limit=worst, not_judged=unjudged,
                    nothing_to_judge=nothing, divided_kernels=_divided(nets), threshold_time_ratio=1.0,
                    tolerance="each kernel's noise_frac (repeats' spread)")
    if nothing and not holds and not missing:
        why = f"nothing to judge: every plan is its baseline ({'; '.join(nothing)})"
        return not_measured(cid, statement, why, **evidence)
    return every(cid, statement, holds, missing, **evidence)


def _is_baseline(lim: pd.DataFrame, net: str, label: str, policy: str, planner: str) -> bool:
    """Whether every kernel of the plan runs its baseline's division (plan.attach_measured's
    same_as_baseline): then the plan is its baseline, and its time the baseline's own measurement."""
    g = lim[(lim["network"] == net) & (lim["limit_label"] == label) & (lim["policy"] == policy)
            & (lim["planner"] == planner)]
    return len(g) > 0 and bool(_truthy(g["same_as_baseline"]).all())


def _ratio(plan_s, baseline_s, noise) -> dict:
    return {"plan_over_baseline": round(float(plan_s / baseline_s), 4),
            "noise_allowance": round(float(noise), 4)}


def _divided(nets: pd.DataFrame) -> dict:
    if nets.empty:
        return {}
    return {f"{r.network} {r.planner} {r.limit_label} [{r.policy}]":
            f"{int(r.divided_kernels)}/{int(r.kernels)}" for r in nets.itertuples()}


def tight_limit_speedup(block: dict, nets: pd.DataFrame, missing_nets: dict) -> dict:
    cid = "cudnn_tight_limit_speedup"
    tight = float(min((block.get("cudnn") or {}).get("limits_mib", [8])))
    statement = (
        f"At the tightest workspace limit ({tight:g} MiB per kernel), the network's DP plan, executed, is "
        "faster than the undivided baseline under the same limit by more than its repeats' noise "
        "(network speedup = baseline time / plan time > 1 + noise), on AlexNet and on ResNet-18. "
        f"{PAPER_NOTE}. " + TIMING)
    wanted = [n for n in ("alexnet", "resnet18") if n in block["networks"]]
    if not wanted:
        return not_measured(cid, statement, "microbatch.networks has neither alexnet nor resnet18",
                            threshold_speedup=1.0, paper_speedup=PAPER_SPEEDUP)
    holds, missing, speedup, divided = {}, {}, {}, {}
    for net in wanted:
        if net in missing_nets:
            missing[net] = missing_nets[net]
            continue
        d = nets[(nets["network"] == net) & (nets["limit_mib"].astype(float) == tight)] if len(nets) else nets
        dp = d[d["planner"] == "dp"] if not d.empty else d
        if dp.empty:
            missing[net] = f"network {net} has no plan at {tight:g} MiB"
            continue
        for r in dp.itertuples():
            key = f"{net} [{r.policy}]"
            if not _true(r.feasible) or pd.isna(r.measured_speedup):
                missing[key] = f"{key}: no feasible, executed plan and baseline at {tight:g} MiB"
                continue
            ilp = d[(d["planner"] == "ilp") & (d["policy"] == r.policy)]
            holds[key] = bool(r.measured_speedup > 1 + r.noise_frac)
            speedup[key] = {"measured": round(float(r.measured_speedup), 4),
                            "planned": round(float(r.planned_speedup), 4),
                            "noise_allowance": round(float(r.noise_frac), 4),
                            "ilp_measured": _first(ilp["measured_speedup"]),
                            "paper": PAPER_SPEEDUP[net]}
            divided[key] = f"{int(r.divided_kernels)} of {int(r.kernels)} kernels divided"
    if divided:
        statement += " This run: " + "; ".join(f"{k}: {v}" for k, v in divided.items()) + "."
    return every(cid, statement, holds, missing, speedup=speedup, kernels_divided=divided,
                 tightest_limit_mib=tight, threshold_speedup=1.0, paper_speedup=PAPER_SPEEDUP,
                 paper_sources=PAPER_SOURCES)


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    # μ-cuDNN's experiment runs its own networks: microbatch.cudnn.networks, or microbatch.networks
    block = {**cfg["microbatch"], "networks": cudnn_networks(cfg["microbatch"])}
    lim, nets, fails, speedups = read_tables(study_dir, "cudnn_limits", "cudnn_networks", "failures",
                                             "network_speedup")
    why = _not_run(block, speedups, lim)
    if why is not None:
        return [not_measured(cid, text, [NEEDS, why], threshold=threshold) for cid, text, threshold in (
            ("cudnn_plan_not_slower", "each kernel's μ-cuDNN plan, executed by cuDNN engine id, is not "
             "slower than the fastest undivided engine under the same workspace limit", 1.0),
            ("cudnn_tight_limit_speedup", "at the tightest workspace limit the network's μ-cuDNN plan "
             f"beats the undivided baseline on AlexNet and ResNet-18. {PAPER_NOTE}", 1.0))]
    missing_nets = _missing(block, lim, fails)
    return [not_slower(block, lim, nets, missing_nets), tight_limit_speedup(block, nets, missing_nets)]
