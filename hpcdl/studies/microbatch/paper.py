"""The micro-batch study's results beside μ-cuDNN's published ones (resources/papers.yaml; the rows are
built by hpcdl.platform.orchestration.paper_vs_ours).

The papers compare μ-cuDNN's plans with undivided cuDNN under the same workspace limit, so ours comes
from the study's own cuDNN experiment (microbatch.cudnn.engines, CUDA only): tables/cudnn_networks.csv,
the network rollup of tables/cudnn_limits.csv (one row per network, limit, policy and planner). At the
library's default limit (64 MiB, the `defaults` row) ours is the best plan's speedup over the baseline,
measured where the plans were executed, else as planned. The CPU path times PyTorch's oneDNN / native
candidates, which have no workspace-limited algorithms: those rows cannot be reproduced there.
"""

from __future__ import annotations

import math

from hpcdl.platform import Ours, RunFiles

DEFAULT_LIMIT_MIB = 64.0  # μ-cuDNN's library default (papers.yaml: microbatch.defaults)
NEEDS_GPU = "needs cuDNN's workspace-limited algorithms (a GPU); the CPU path has none"
SOURCE = "tables/cudnn_networks.csv (rollup of cudnn_limits.csv): best plan's speedup at the 64 MiB default"


def _speedups(run: RunFiles, table: str):
    """The table's rows with one `speedup` column (measured where executed, else planned), or a reason."""
    limits = run.table("cudnn_limits")
    if limits.empty:
        if not run.on_gpu:
            return {"unreproducible": NEEDS_GPU}
        return {"missing": "no cuDNN engine experiment in this GPU run (microbatch.cudnn.engines is off, "
                           "or it failed: tables/cudnn_limits.csv is empty)"}
    t = run.table(table) if table != "cudnn_limits" else limits
    if t.empty or "network" not in t:
        return {"missing": f"tables/{table}.csv has no rows"}
    if "feasible" in t:
        t = t[t["feasible"].astype(str).str.lower().eq("true")]
    if table == "cudnn_limits":
        measured = t["baseline_measured_time_s"] / t["measured_time_s"] if "measured_time_s" in t else None
        planned = t["planned_speedup"]
    else:
        measured, planned = t.get("measured_speedup"), t["planned_speedup"]
    how = "measured" if measured is not None and measured.notna().any() else "planned"
    return t.assign(speedup=measured if how == "measured" else planned, how=how).dropna(subset=["speedup"])


def _network(name: str):
    def value(run: RunFiles) -> dict | None:
        t = _speedups(run, "cudnn_networks")
        if isinstance(t, dict):
            return t
        t = t[t["network"].astype(str).str.lower().eq(name)]
        if t.empty:
            return {"missing": f"no feasible {name} row in tables/cudnn_networks.csv"}
        at = t[t["limit_mib"].astype(float).eq(DEFAULT_LIMIT_MIB)] if "limit_mib" in t else t[:0]
        at = at if not at.empty else t  # a table without the default limit: its best plan at any limit
        best = at.loc[at["speedup"].astype(float).idxmax()]
        return {"value": float(best["speedup"]),
                "setting": f"{name} at {best.get('limit_label', '?')}, best plan {best.get('planner', '?')} "
                           f"{best.get('policy', '?')} ({best['how']}), vs undivided cuDNN at the same limit"}
    return value


def _deepbench_max(run: RunFiles) -> dict | None:
    """The largest per-kernel speedup of the DeepBench layers at the README's 128-512 MiB limits."""
    t = _speedups(run, "cudnn_limits")
    if isinstance(t, dict):
        return t
    net, limit = t["network"].astype(str).str.lower(), t["limit_mib"].astype(float)
    t = t[net.eq("deepbench") & limit.between(128, 512)]
    if t.empty:
        return {"missing": "no DeepBench kernel at a 128-512 MiB limit (microbatch.networks, "
                           "microbatch.cudnn.limits_mib)"}
    best = t.loc[t["speedup"].astype(float).idxmax()]
    if not math.isfinite(float(best["speedup"])):
        return {"missing": "no finite DeepBench speedup"}
    return {"value": float(best["speedup"]),
            "setting": f"DeepBench {best.get('layer', '?')} {best.get('kernel', '?')} at "
                       f"{best.get('limit_label', '?')} ({best['how']}); our DeepBench subset, its batch"}


# A speedup reproduces in direction above 1 (faster than undivided cuDNN); within 25 % of the paper's
# number, on another GPU generation, counts as within.
PAPER = {
    "alexnet_v100": Ours(SOURCE, value=_network("alexnet"), tolerance=0.25, line=1.0),
    "resnet18_v100": Ours(SOURCE, value=_network("resnet18"), tolerance=0.25, line=1.0),
    "alexnet_p100": Ours(SOURCE, value=_network("alexnet"), tolerance=0.25, line=1.0),
    "resnet18_p100": Ours(SOURCE, value=_network("resnet18"), tolerance=0.25, line=1.0),
    "deepbench_mean": Ours(SOURCE.replace("best plan's", "DeepBench's summed-layer best plan"),
                           value=_network("deepbench"), tolerance=0.25, line=1.0),
    "deepbench_p100_limits": Ours("tables/cudnn_limits.csv: largest DeepBench kernel speedup at 128-512 MiB",
                                  value=_deepbench_max, tolerance=0.25, line=1.0),
    "defaults": Ours("microbatch.cudnn.limits_mib, microbatch.policies",
                     context="ours: the configured limits plus the library's 64 MiB default, labelled "
                             "\"default (64 MiB)\"; policies as configured (powerOfTwo among them)"),
}
