"""HAND-MADE cuDNN engine tables and execution times for the microbatch study's cuDNN-engine tests
(tests/test_microbatch_cudnn_study.py, tests/test_claims.py). Nothing here is measured: the
numbers are invented so that every expected plan can be worked out by hand.

Mini-batch 4, micro-batches 1, 2, 4 (powerOfTwo), three kernels:

    c1/forward (count 1)          "slow": 10 b s, no workspace;  "fast": 4 b + 1 s, 6 b MiB
    c1/backward_filter (count 1)  "a": 3 b s, no workspace (nothing to choose)
    c2/forward (count 2)          "g": 2 b s, no workspace;      "h": b + 0.5 s, 40 b MiB

Per-kernel plans (DP, powerOfTwo) against the undivided baseline under each limit:

    8 MiB    c1/forward: slow 40 -> fast 1+1+1+1 = 20 (fast fits 8 MiB only at b = 1); c2: g 8 = 8
             network (count-weighted): 40 + 12 + 2 x 8 = 68 -> 20 + 12 + 2 x 8 = 48; 1 of 3 divided
    64 MiB   c1/forward: fast 17 = 17; c2/forward: g 8 -> h 1+1+1+1 = 6 (h fits only at b = 1)
             network: 17 + 12 + 16 = 45 -> 17 + 12 + 12 = 41; 1 of 3 divided
    512 MiB  c1/forward: fast 17; c2/forward: h 4.5 (160 MiB): 38 = 38, nothing divided

ILP (budget = the limit x 4 kernel instances):

    8 MiB (32 MiB)    c1/forward fast@4 (24 MiB, over the per-kernel limit), c2 g: 17 + 12 + 16 = 45
    64 MiB (256 MiB)  c1/forward fast@4, c2/forward h 2+2 (2 x 80 MiB): 17 + 12 + 2 x 5 = 39
    512 MiB (2 GiB)   c1/forward fast@4, c2/forward h@4 (2 x 160 MiB): 17 + 12 + 9 = 38
"""

from __future__ import annotations

import pandas as pd

from hpcdl.studies.microbatch.cudnn import plan as cudnn_plan

MiB = 2**20
BATCH = 4
COUNTS = {("c1", "forward"): 1, ("c1", "backward_filter"): 1, ("c2", "forward"): 2}


def engine_table(network: str = "alexnet") -> pd.DataFrame:
    """The engine table above in engine_table.FIELDS' main columns, plus an over_limit row (a tiny
    time no plan may use) and a skipped one."""
    rows = []
    for b in (1, 2, 4):
        rows += [
            ("c1", 1, "forward", b, "slow", 10.0 * b, 0),
            ("c1", 1, "forward", b, "fast", 4.0 * b + 1, 6 * MiB * b),
            ("c1", 1, "backward_filter", b, "a", 3.0 * b, 0),
            ("c2", 2, "forward", b, "g", 2.0 * b, 0),
            ("c2", 2, "forward", b, "h", b + 0.5, 40 * MiB * b),
        ]
    df = pd.DataFrame(rows, columns=["layer", "count", "kernel", "micro_batch", "engine", "time_s",
                                     "workspace_bytes"])
    df["status"], df["reason"] = "ok", ""
    extra = pd.DataFrame([
        {"layer": "c1", "count": 1, "kernel": "forward", "micro_batch": 4, "engine": "huge", "time_s": 0.001,
         "workspace_bytes": 4096 * MiB, "status": "over_limit", "reason": "needs 4096 MiB"},
        {"layer": "c2", "count": 2, "kernel": "forward", "micro_batch": 1, "engine": "bad", "time_s": None,
         "workspace_bytes": 0, "status": "skipped", "reason": "at sample 1: ValueError: misaligned"},
    ])
    df = pd.concat([df, extra], ignore_index=True)
    df.insert(0, "network", network)
    df["batch_size"] = BATCH
    return df


def planned(network: str = "alexnet", limits_mib=(8, 512)):
    """plan_network's rows and configurations on the hand-made table (64 MiB is always added)."""
    t = engine_table(network)
    return cudnn_plan.plan_network(t[t["status"] == "ok"], network, BATCH, ["powerOfTwo"], list(limits_mib),
                                   COUNTS)


def executed(rows, configs, factor: dict | None = None, noise: float = 0.02) -> list[dict]:
    """The rows with HAND-MADE execution times: each division runs at its benchmarked time (the
    table's sum of its steps) times factor.get(division, 1), every noise_frac `noise`."""
    t = engine_table()
    bench = {(r.layer, r.kernel, r.engine, r.micro_batch): r.time_s for r in t.itertuples()}
    measured = {}
    for key, divisions in cudnn_plan.distinct_divisions(configs).items():
        for d in divisions:
            base = sum(bench[(*key, e, b)] for e, b in d)
            measured[(key, d)] = {"time_s": base * (factor or {}).get(d, 1.0), "noise_frac": noise,
                                  "rounds": 3, "max_rel_err": 1e-7}
    return cudnn_plan.attach_measured(rows, configs, measured)


def study_tables(networks=("alexnet", "resnet18")) -> dict[str, pd.DataFrame]:
    """tables/cudnn_limits.csv and tables/cudnn_networks.csv of a CUDA run whose every network has
    the hand-made table, executed at its benchmarked times (the tables stage's own rollup)."""
    rows = []
    for net in networks:
        r, c = planned(net)
        rows += [{**x, "device": "cuda", "status": "ok", "error": ""} for x in executed(r, c)]
    limits = pd.DataFrame(rows)
    return {"tables/cudnn_limits.csv": limits, "tables/cudnn_networks.csv": cudnn_plan.rollup(limits)}
