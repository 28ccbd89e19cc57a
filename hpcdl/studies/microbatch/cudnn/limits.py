"""Planning under μ-cuDNN's workspace limits from a table of cuDNN engines (pure: no torch, no GPU).

The input is a benchmark table with one row per (layer, kernel, micro-batch, engine): its time and
the workspace it needs, as hpcdl.studies.microbatch.cudnn.engines measures them (any table with
these columns plans the same way, which is what makes the planner testable on the CPU):

    layer, kernel, micro_batch, engine, time_s, workspace_bytes   [, status]

`engine` is the engine configuration's name (cuDNN's engine id and knobs), the same engine at every
micro-batch size; rows whose status is not "ok" are left out.

- `undivided`: per kernel, the fastest engine that fits the limit at the full mini-batch - what a
  framework with that workspace limit runs (Caffe and Chainer defaulted to 8 MiB). The baseline.
- `per_layer`: μ-cuDNN's DP per kernel (dp.KernelDP) under the same per-kernel limit.
- `limit_sweep` / `network_speedup`: both at every limit, per kernel and summed per network.
- `budget_plan`: μ-cuDNN's ILP (ilp.solve): one workspace budget shared by all kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from hpcdl.studies.microbatch.common.dp import KernelDP, WorkspaceError, division_text
from hpcdl.studies.microbatch.common.ilp import ILPResult, solve

MiB = 2**20
COLUMNS = ("layer", "kernel", "micro_batch", "engine", "time_s", "workspace_bytes")
Key = tuple[str, str]  # (layer, kernel)


@dataclass(frozen=True)
class Choice:
    """One kernel's configuration: micro-batches [(engine, size), ...] run one after another."""

    division: tuple[tuple[str, int], ...]
    time_s: float
    workspace_bytes: float

    @property
    def sizes(self) -> str:
        return division_text(self.division)[0]

    @property
    def engines(self) -> str:
        return division_text(self.division)[1]


def label(key: Key) -> str:
    return f"{key[0]}/{key[1]}"


def kernel_tables(table: pd.DataFrame) -> dict[Key, dict[tuple[str, int], tuple[float, float]]]:
    """Per (layer, kernel): (engine, micro-batch) -> (time_s, workspace_bytes), as KernelDP takes it."""
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"engine table lacks column(s) {', '.join(missing)}; needs {', '.join(COLUMNS)}")
    if "status" in table.columns:
        table = table[table["status"] == "ok"]
    out: dict[Key, dict] = {}
    for row in table.itertuples(index=False):
        key = (str(row.layer), str(row.kernel))
        cell = (str(row.engine), int(row.micro_batch))
        got = out.setdefault(key, {})
        if cell in got:
            raise ValueError(
                f"engine table: {label(key)} has two rows for engine {cell[0]} at micro-batch {cell[1]}"
            )
        got[cell] = (float(row.time_s), float(row.workspace_bytes))
    if not out:
        raise ValueError("engine table has no usable rows (status ok)")
    return out


def fastest_undivided(key: Key, cells: dict, batch: int, limit_bytes: float) -> Choice:
    """One kernel's baseline: its fastest engine fitting `limit_bytes` at the full mini-batch
    (`cells` as kernel_tables gives them); WorkspaceError naming the kernel where none fits."""
    full = [(e, t, w) for (e, b), (t, w) in cells.items() if b == batch]
    if not full:
        raise ValueError(f"{label(key)}: no engine benchmarked at the full mini-batch {batch}")
    fits = [c for c in full if c[2] <= limit_bytes]
    if not fits:
        raise WorkspaceError(
            f"{label(key)}: workspace limit {limit_bytes / MiB:.3f} MiB is smaller than every "
            f"engine's need at the full mini-batch {batch} (the least is "
            f"{min(w for _, _, w in full) / MiB:.3f} MiB)"
        )
    e, t, w = min(fits, key=lambda c: (c[1], c[2], c[0]))  # ties: less workspace, then name
    return Choice(((e, batch),), t, w)


def undivided(table: pd.DataFrame, batch: int, limit_bytes: float) -> dict[Key, Choice]:
    """The fastest engine that fits `limit_bytes` at the full mini-batch, per kernel; WorkspaceError
    (naming the kernel) where none fits."""
    return {
        key: fastest_undivided(key, cells, batch, limit_bytes) for key, cells in kernel_tables(table).items()
    }


def _dp(key: Key, cells: dict, batch: int, policy: str) -> KernelDP:
    return KernelDP(cells, batch, policy, label=label(key))


def per_layer(table: pd.DataFrame, batch: int, policy: str, limit_bytes: float | None) -> dict[Key, Choice]:
    """μ-cuDNN's DP per kernel under the per-kernel limit (None: no limit)."""
    out = {}
    for key, cells in kernel_tables(table).items():
        dp = _dp(key, cells, batch, policy)
        i, t, w = dp.best(limit_bytes)
        out[key] = Choice(tuple(dp.division(i)), t, w)
    return out


def limit_sweep(
    table: pd.DataFrame,
    batch: int,
    policies: list[str],
    limits_mib: list[float],
    reference_s: dict[Key, float] | None = None,
) -> list[dict]:
    """One row per (limit, policy, kernel): the DP's choice beside the undivided baseline under the
    same limit, and `reference_s` (PyTorch's default, cudnn.benchmark on) where given. A limit under
    which a kernel has no configuration gives a row with feasible False and the reason."""
    tables = kernel_tables(table)
    rows = []
    for limit in sorted(limits_mib):
        lb = limit * MiB
        base: dict[Key, Choice | str] = {}
        for key, cells in tables.items():
            try:
                base[key] = fastest_undivided(key, cells, batch, lb)
            except WorkspaceError as exc:
                base[key] = str(exc)
        for policy in policies:
            for key, cells in tables.items():
                b = base[key]
                row = {
                    "limit_mib": float(limit),
                    "policy": policy,
                    "layer": key[0],
                    "kernel": key[1],
                    "undivided_engine": b.engines if isinstance(b, Choice) else "",
                    "undivided_s": b.time_s if isinstance(b, Choice) else math.nan,
                    "undivided_workspace_bytes": b.workspace_bytes if isinstance(b, Choice) else math.nan,
                    "pytorch_default_s": (reference_s or {}).get(key, math.nan),
                }
                try:
                    dp = _dp(key, cells, batch, policy)
                    i, t, w = dp.best(lb)
                    c = Choice(tuple(dp.division(i)), t, w)
                    row.update(
                        feasible=True,
                        micro_batches=c.sizes,
                        engines=c.engines,
                        time_s=t,
                        workspace_bytes=w,
                        reason="" if isinstance(b, Choice) else b,
                    )
                except WorkspaceError as exc:
                    row.update(
                        feasible=False,
                        micro_batches="",
                        engines="",
                        time_s=math.nan,
                        workspace_bytes=math.nan,
                        reason=str(exc),
                    )
                row["speedup"] = row["undivided_s"] / row["time_s"]  # nan where either is infeasible
                rows.append(row)
    return rows


def network_speedup(sweep_rows: list[dict]) -> list[dict]:
    """Per (limit, policy): the kernels' summed times, undivided vs μ-batched (each layer's kernels
    run once per iteration). A limit where any kernel is infeasible for either is marked so."""
    df = pd.DataFrame(sweep_rows)
    out = []
    for (limit, policy), g in df.groupby(["limit_mib", "policy"], sort=True):
        ok = bool(g["feasible"].all() and g["undivided_s"].notna().all())
        und, mub = float(g["undivided_s"].sum()), float(g["time_s"].sum())
        ref = float(g["pytorch_default_s"].sum()) if g["pytorch_default_s"].notna().all() else math.nan
        out.append(
            {
                "limit_mib": float(limit),
                "policy": policy,
                "feasible": ok,
                "undivided_s": und if ok else math.nan,
                "microbatched_s": mub if ok else math.nan,
                "pytorch_default_s": ref,
                "speedup": und / mub if ok else math.nan,
                "divided_kernels": int((g["micro_batches"].str.contains(r"\+")).sum()),
            }
        )
    return out


def budget_plan(
    table: pd.DataFrame,
    batch: int,
    policy: str,
    budget_bytes: float,
    counts: dict[Key, int] | None = None,
) -> tuple[ILPResult, dict[Key, Choice]]:
    """μ-cuDNN's ILP: one configuration per kernel from its DP front, the kernels' workspaces
    summed (each owns its segment) within `budget_bytes`. With policy "undivided" this is the
    baseline under the same budget. WorkspaceError where the budget is below the least need."""
    dps = {key: _dp(key, cells, batch, policy) for key, cells in kernel_tables(table).items()}
    labels = {label(k): k for k in dps}
    fronts = {lab: dps[k].front() for lab, k in labels.items()}
    cnt = {lab: (counts or {}).get(k, 1) for lab, k in labels.items()}
    res = solve(fronts, cnt, budget_bytes)
    choice = {}
    for lab, j in res.choice.items():
        k, f = labels[lab], fronts[lab]
        choice[k] = Choice(tuple(dps[k].division(j)), float(f.time_s[j]), float(f.workspace[j]))
    return res, choice


def dominated(cells: list[tuple[object, float, float]], ratio: float) -> set[int]:
    """Which configurations no workspace limit can choose, by a margin: cells[j] = (group, workspace
    bytes, time) (a group: one kernel at one micro-batch size); j is dominated where another cell of
    its group needs no more workspace and takes at most time_j / ratio. The baseline (the fastest engine
    within a limit), the DP's fronts and the ILP keep only configurations no other beats in both time
    and workspace, so a dominated engine is never chosen as long as its true time stays above the other's
    (`ratio` > 1 leaves that margin for the noise of one timed call). A NaN time dominates nothing and is
    never dominated."""
    if not ratio > 1:
        raise ValueError(f"screen ratio must be > 1, got {ratio}")
    groups: dict[object, list[int]] = {}
    for j, (g, _, _) in enumerate(cells):
        groups.setdefault(g, []).append(j)
    out = set()
    for members in groups.values():
        for j in members:
            _, wj, tj = cells[j]
            if math.isnan(tj):
                continue
            if any(k != j and cells[k][1] <= wj and cells[k][2] * ratio <= tj for k in members
                   if not math.isnan(cells[k][2])):
                out.add(j)
    return out
