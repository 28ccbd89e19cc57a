"""μ-cuDNN's integer linear program: one configuration per kernel, Σ workspace <= one budget.

Each kernel k (a layer's forward, backward-data or backward-filter; a layer run `count` times
contributes count copies) offers its DP Pareto front; x[k, j] = 1 picks configuration j:

    minimise Σ count_k t[k, j] x[k, j]   s.t.   Σ_j x[k, j] = 1 for every k,
                                                Σ count_k ws[k, j] x[k, j] <= budget,   x binary

solved by HiGHS through scipy.optimize.milp. As in μ-cuDNN's workspace-division mode every kernel
owns its workspace segment, so the budget bounds their sum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from hpcdl.microbatch.dp import Front, WorkspaceError

MiB = 2**20


@dataclass
class ILPResult:
    choice: dict[str, int]  # kernel label -> index into its front
    time_s: float  # Σ count x time of the chosen configurations
    workspace_bytes: float  # Σ count x workspace
    solve_s: float  # wall time of the solver call
    status: str


def solve(fronts: dict[str, Front], counts: dict[str, int], budget_bytes: float) -> ILPResult:
    """The time-optimal choice under `budget_bytes`; WorkspaceError (naming the layer) if none fits."""
    labels = list(fronts)
    least = {k: counts[k] * float(fronts[k].workspace.min()) for k in labels}
    if sum(least.values()) > budget_bytes:
        worst = max(least, key=least.get)
        raise WorkspaceError(
            f"workspace budget {budget_bytes / MiB:.3f} MiB is below the least total need "
            f"{sum(least.values()) / MiB:.3f} MiB; the largest least need is {worst} "
            f"({least[worst] / MiB:.3f} MiB)"
        )
    offsets = np.cumsum([0] + [len(fronts[k].time_s) for k in labels])
    n = int(offsets[-1])
    cost = np.concatenate([counts[k] * fronts[k].time_s for k in labels])
    ws = np.concatenate([counts[k] * fronts[k].workspace for k in labels]) / MiB  # MiB: well scaled
    one_each = np.zeros((len(labels), n))
    for i in range(len(labels)):
        one_each[i, offsets[i] : offsets[i + 1]] = 1.0
    constraints = [
        LinearConstraint(one_each, 1.0, 1.0),
        LinearConstraint(ws[None, :], -np.inf, budget_bytes / MiB + 1e-9),
    ]
    t0 = time.perf_counter()
    res = milp(cost, constraints=constraints, integrality=np.ones(n), bounds=Bounds(0, 1))
    solve_s = time.perf_counter() - t0
    if res.x is None:
        raise WorkspaceError(
            f"workspace budget {budget_bytes / MiB:.3f} MiB: HiGHS found no feasible choice ({res.message})"
        )
    x = np.round(res.x).astype(int)
    choice = {k: int(np.flatnonzero(x[offsets[i] : offsets[i + 1]])[0]) for i, k in enumerate(labels)}
    return ILPResult(choice, float(cost @ x), float((ws @ x) * MiB), solve_s, str(res.message))


def network_front(fronts: dict[str, Front], counts: dict[str, int], budgets: list[float]) -> list[dict]:
    """(budget, time, workspace used) at each budget, infeasible budgets marked; the network's front."""
    out = []
    for b in sorted(budgets):
        try:
            r = solve(fronts, counts, b)
            out.append(
                {
                    "budget_bytes": b,
                    "feasible": True,
                    "time_s": r.time_s,
                    "workspace_bytes": r.workspace_bytes,
                    "solve_s": r.solve_s,
                }
            )
        except WorkspaceError as exc:
            out.append(
                {
                    "budget_bytes": b,
                    "feasible": False,
                    "time_s": float("nan"),
                    "workspace_bytes": float("nan"),
                    "solve_s": 0.0,
                    "reason": str(exc),
                }
            )
    return out
