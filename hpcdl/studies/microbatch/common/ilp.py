"""μ-cuDNN's integer linear program: one configuration per kernel, Σ workspace <= one budget.

Each kernel k (a layer's forward, backward-data or backward-filter; a layer run `count` times
contributes count copies) offers its DP Pareto front; x[k, j] = 1 picks configuration j:

    minimise Σ count_k t[k, j] x[k, j]   s.t.   Σ_j x[k, j] = 1 for every k,
                                                Σ count_k ws[k, j] x[k, j] <= budget,   x binary

solved by HiGHS through scipy.optimize.milp. As in μ-cuDNN's workspace-division mode every kernel
owns its workspace segment, so the budget bounds their sum. PyTorch adds one choice μ-cuDNN's
cuDNN interface does not have: a layer's backward may run fused (one convolution_backward call
computing both gradients, as autograd does by default) instead of as the two separate kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from hpcdl.studies.microbatch.common.dp import Front, WorkspaceError

MiB = 2**20


@dataclass
class ILPResult:
    choice: dict[str, int]  # kernel label -> index into its front (only the kernels that run)
    time_s: float  # Σ count x time of the chosen configurations
    workspace_bytes: float  # Σ count x workspace
    solve_s: float  # wall time of the solver call
    status: str


Group = tuple[str, str, str]  # (fused backward, backward-data, backward-filter) labels of one layer


def _least(fronts, counts, groups: list[Group]) -> dict[str, float]:
    """The least workspace each layer's backward (fused, or the separate pair) and each other kernel needs."""
    grouped = {lab for g in groups for lab in g}
    least = {k: counts[k] * float(fronts[k].workspace.min()) for k in fronts if k not in grouped}
    for f, d, w in groups:
        pair = counts[d] * float(fronts[d].workspace.min()) + counts[w] * float(fronts[w].workspace.min())
        least[f] = min(counts[f] * float(fronts[f].workspace.min()), pair)
    return least


def solve(
    fronts: dict[str, Front], counts: dict[str, int], budget_bytes: float, groups: list[Group] | None = None
) -> ILPResult:
    """The time-optimal choice under `budget_bytes`; WorkspaceError (naming the layer) if none fits.

    `groups`: per layer, the fused backward kernel as an alternative to its backward-data +
    backward-filter pair: either one fused configuration runs, or one of each of the pair.
    """
    groups = groups or []
    labels = list(fronts)
    least = _least(fronts, counts, groups)
    if sum(least.values()) > budget_bytes:
        worst = max(least, key=least.get)
        raise WorkspaceError(
            f"workspace budget {budget_bytes / MiB:.3f} MiB is below the least total need "
            f"{sum(least.values()) / MiB:.3f} MiB; the largest least need is {worst} "
            f"({least[worst] / MiB:.3f} MiB)"
        )
    offsets = dict(zip(labels, np.cumsum([0] + [len(fronts[k].time_s) for k in labels]), strict=False))
    n = int(sum(len(fronts[k].time_s) for k in labels))
    cost = np.concatenate([counts[k] * fronts[k].time_s for k in labels])
    ws = np.concatenate([counts[k] * fronts[k].workspace for k in labels]) / MiB  # MiB: well scaled

    def row(*parts: tuple[str, float]) -> np.ndarray:
        r = np.zeros(n)
        for lab, coef in parts:
            r[offsets[lab] : offsets[lab] + len(fronts[lab].time_s)] = coef
        return r

    grouped = {lab for g in groups for lab in g}
    eq_rows, eq_rhs = [], []
    for lab in labels:
        if lab not in grouped:
            eq_rows.append(row((lab, 1.0)))  # exactly one configuration
            eq_rhs.append(1.0)
    for f, d, w in groups:
        eq_rows.append(row((f, 1.0), (d, 1.0)))  # the fused kernel or the data-gradient kernel ...
        eq_rhs.append(1.0)
        eq_rows.append(row((d, 1.0), (w, -1.0)))  # ... and the filter-gradient kernel with it
        eq_rhs.append(0.0)
    constraints = [
        LinearConstraint(np.array(eq_rows), np.array(eq_rhs), np.array(eq_rhs)),
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
    choice = {}
    for lab in labels:
        picked = np.flatnonzero(x[offsets[lab] : offsets[lab] + len(fronts[lab].time_s)])
        if picked.size:
            choice[lab] = int(picked[0])
    return ILPResult(choice, float(cost @ x), float((ws @ x) * MiB), solve_s, str(res.message))


def network_front(
    fronts: dict[str, Front], counts: dict[str, int], budgets: list[float], groups: list[Group] | None = None
) -> list[dict]:
    """(budget, time, workspace used) at each budget, infeasible budgets marked; the network's front."""
    out = []
    for b in sorted(budgets):
        try:
            r = solve(fronts, counts, b, groups)
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
