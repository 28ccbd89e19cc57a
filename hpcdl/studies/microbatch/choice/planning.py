"""The planners on one network's benchmark: the ILP's speedup against the workspace budget, and the
DP per kernel and the ILP over the network under every policy, as plan rows and executable plans.

`NetworkPlanning` holds what both need of a network's benchmark: each kernel's table of (fastest
time, workspace) per (algorithm, micro-batch), its median times, the framework's default
configuration, and the executor's measured overhead per layer. A kernel is labelled "layer/kernel".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hpcdl.studies.microbatch.choice.algorithms import FUSED, KERNELS
from hpcdl.studies.microbatch.common import ilp
from hpcdl.studies.microbatch.common.dp import (
    KernelDP,
    WorkspaceError,
    challenger_prices,
    division_text,
    policy_sizes,
)
from hpcdl.studies.microbatch.common.workloads import ConvLayer

MiB = 2**20
BACKWARD = (FUSED, "backward_data", "backward_filter")  # a layer's backward: fused, or the separate pair


def label(layer: str, kernel: str) -> str:
    return f"{layer}/{kernel}"


def ok_rows(bench: list[dict], default: str, network_name: str) -> list[dict]:
    """The candidates: rows where the forced backend really ran, and the framework's default as it
    dispatches; the default must be among them."""
    ok = [r for r in bench if r["status"] == "ok" and (r["forced_ok"] or r["algorithm"] == default)]
    if not any(r["algorithm"] == default for r in ok):
        raise RuntimeError(
            f"{network_name}: the default algorithm {default} did not run: "
            f"{[r['reason'] for r in bench if r['algorithm'] == default][:1]}"
        )
    return ok


@dataclass
class NetworkPlanning:
    """One network's benchmark as the planners see it (see the module's docstring)."""

    network_name: str
    layers: list[ConvLayer]
    kernels: tuple[str, ...]  # the kernels benchmarked: forward and the backward forms allowed
    batch_size: int
    default: str  # the framework's default algorithm on this device
    policies: list[str]
    switch_margin: float
    kernel_limit_mib: float | None
    bench: list[dict]  # every benchmark row (the planning rows charge each policy its share)
    bench_s: float
    ok: list[dict]  # the candidates' rows (ok_rows)
    table: dict = field(init=False)  # label -> {(algorithm, micro-batch): (fastest repeat, workspace)}
    typical: dict = field(init=False)  # label -> {(algorithm, micro-batch): median repeat}
    counts: dict = field(init=False)  # label -> how many times the network runs it
    default_cfg: dict = field(init=False)  # label -> the default's (time, workspace), undivided
    default_total_ws: float = field(init=False)  # the default network's workspace, count-weighted
    default_time: float = field(init=False)  # and its predicted time
    overhead: dict = field(default_factory=dict)  # layer -> the planned executor's own cost (s)
    sweep_s: dict = field(default_factory=dict)  # policy -> the budget sweep's solver time

    def __post_init__(self):
        self.table, self.typical = {}, {}
        for r in self.ok:
            key = (r["algorithm"], r["micro_batch"])
            lab = label(r["layer"], r["kernel"])
            self.table.setdefault(lab, {})[key] = (r["time_s"], float(r["workspace_bytes"]))
            self.typical.setdefault(lab, {})[key] = r["time_median_s"]
        self.counts = {label(ly.name, k): ly.count for ly in self.layers for k in self.kernels}
        self.default_cfg = {lab: tab[(self.default, self.batch_size)] for lab, tab in self.table.items()}
        runs_by_default = [label(ly.name, k) for ly in self.layers for k in self.default_kernels]
        self.default_total_ws = sum(self.counts[lab] * self.default_cfg[lab][1] for lab in runs_by_default)
        self.default_time = sum(self.counts[lab] * self.default_cfg[lab][0] for lab in runs_by_default)

    @property
    def fused_ok(self) -> bool:
        return FUSED in self.kernels

    @property
    def separate_ok(self) -> bool:
        return "backward_data" in self.kernels

    @property
    def default_kernels(self) -> tuple[str, ...]:
        """The framework's default layer: forward, then the fused backward (autograd's one call); priced
        as the separate pair when only that form is benchmarked (μ-cuDNN's three kernels)."""
        return ("forward", FUSED) if self.fused_ok else KERNELS

    @property
    def undivided_default(self) -> tuple[str, int]:
        return (self.default, self.batch_size)

    def keeps_default(self, plan: dict) -> bool:
        return all(plan.get(k) == [self.undivided_default] for k in ("forward", FUSED))

    def priced(self, lab: str) -> dict:
        layer_name, kernel = lab.split("/")
        incumbent = self.undivided_default if kernel in self.default_kernels else None
        return challenger_prices(self.table[lab], self.typical[lab], incumbent, self.switch_margin,
                                 self.overhead[layer_name])

    def benchmarked(self, lab: str, steps: list[tuple[str, int]]) -> float:
        return sum(self.table[lab][step][0] for step in steps)

    def groups(self, pinned: frozenset[str]) -> list[tuple[str, ...]]:
        """The ILP's either-or groups: each layer's fused backward against its separate pair (none
        unless both forms are allowed, none for a pinned layer)."""
        if not (self.fused_ok and self.separate_ok):
            return []
        return [tuple(label(ly.name, k) for k in BACKWARD) for ly in self.layers if ly.name not in pinned]

    def budget_rows(self, budget_fractions: list[float]) -> list[dict]:
        """Speedup vs workspace budget (ILP), as fractions of the default's total workspace: what the
        benchmarked times allow (every layer, no margin, none pinned), so solved once whatever vetting
        pins. Records each policy's solver time in `sweep_s`."""
        rows = []
        for policy in self.policies:
            sweep_fronts = {lab: KernelDP(tab, self.batch_size, policy).front()
                            for lab, tab in self.table.items()}
            t2 = time.perf_counter()
            budgets = [f * self.default_total_ws for f in budget_fractions]
            sweep = ilp.network_front(sweep_fronts, self.counts, budgets, self.groups(frozenset()))
            self.sweep_s[policy] = time.perf_counter() - t2
            for f, row in zip(sorted(budget_fractions), sweep, strict=True):
                rows.append(
                    {
                        "network": self.network_name,
                        "policy": policy,
                        "budget_fraction": f,
                        "budget_bytes": row["budget_bytes"],
                        "feasible": row["feasible"],
                        "predicted_time_s": row["time_s"],
                        "default_predicted_time_s": self.default_time,
                        "predicted_speedup":
                            self.default_time / row["time_s"] if row["feasible"] else float("nan"),
                        "workspace_bytes": row["workspace_bytes"],
                        "solve_s": row["solve_s"],
                        "reason": row.get("reason", ""),
                    }
                )
        return rows

    def plan_all(self, pinned: frozenset[str]) -> tuple[tuple[list, list], dict]:
        """Both planners under every policy; a layer in `pinned` is offered only the framework's
        own configuration of the kernels the default runs (its separate backward pair is not on
        offer), so every plan keeps the default there. Returns (the plans and planning rows) and
        {layer: {variant: layer plan}}."""
        plan_table = self._plan_table(pinned)
        plans_rows, planning_rows = [], []
        exec_plans: dict[str, dict[str, dict]] = {ly.name: {} for ly in self.layers}
        for policy in self.policies:
            t1 = time.perf_counter()
            dps = {  # a pinned layer offers only the undivided default: no policy can divide it
                lab: KernelDP(tab, self.batch_size, "undivided" if lab.split("/")[0] in pinned else policy,
                              label=f"layer {lab.split('/')[0]} ({lab.split('/')[1]})")
                for lab, tab in plan_table.items()
            }
            fronts = {lab: dp.front() for lab, dp in dps.items()}
            dp_s = time.perf_counter() - t1
            dp_choice = self._dp_choice(dps)
            # ILP over the network under the default's total workspace ("the same memory footprint")
            headline = ilp.solve(fronts, self.counts, self.default_total_ws, self.groups(pinned))
            for planner, choice in (("dp", dp_choice), ("ilp", headline.choice)):
                for lab, idx in choice.items():
                    steps = dps[lab].division(idx)
                    layer_name, kernel = lab.split("/")
                    exec_plans[layer_name].setdefault(f"{policy}/{planner}", {})[kernel] = steps
                    ws = float(fronts[lab].workspace[idx])
                    plans_rows.append(self._plan_row(policy, planner, lab, steps, ws))
                self._charge_overhead(plans_rows, exec_plans, policy, planner)
            planning_rows.append(self._planning_row(policy, dp_s, headline, fronts))
        return (plans_rows, planning_rows), exec_plans

    def _plan_table(self, pinned: frozenset[str]) -> dict:
        """Each kernel's table as the planners are offered it (`priced`; a pinned layer's kernels the
        default runs: the default alone)."""
        plan_table = {}
        for lab in self.table:
            layer_name, kernel = lab.split("/")
            if layer_name not in pinned:
                plan_table[lab] = self.priced(lab)
            elif kernel in self.default_kernels:
                plan_table[lab] = {self.undivided_default: self.table[lab][self.undivided_default]}
        return plan_table

    def _limit(self, lab: str) -> float:
        """A kernel's own workspace limit: microbatch.kernel_limit_mib, else the default's workspace."""
        return self.kernel_limit_mib * MiB if self.kernel_limit_mib is not None else self.default_cfg[lab][1]

    def _dp_choice(self, dps: dict[str, KernelDP]) -> dict[str, int]:
        """DP per kernel: each kernel under its own limit; a layer's backward runs fused or as the
        separate pair, whichever the DP finds faster."""
        choice = {}
        for ly in self.layers:
            fwd = label(ly.name, "forward")
            choice[fwd] = dps[fwd].best(self._limit(fwd))[0]
            fused, bd, bf = (label(ly.name, k) for k in BACKWARD)
            options, errors = [], []
            try:
                if self.fused_ok:
                    i = dps[fused].best(self._limit(fused))
                    options.append((i[1], {fused: i[0]}))
            except WorkspaceError as exc:
                errors.append(exc)
            try:
                if self.separate_ok and bd in dps:  # a pinned layer's separate pair is not on offer
                    i, j = dps[bd].best(self._limit(bd)), dps[bf].best(self._limit(bf))
                    options.append((i[1] + j[1], {bd: i[0], bf: j[0]}))
            except WorkspaceError as exc:
                errors.append(exc)
            if not options:
                raise errors[0]
            choice.update(min(options, key=lambda o: o[0])[1])
        return choice

    def _plan_row(self, policy: str, planner: str, lab: str, steps: list[tuple[str, int]], ws: float) -> dict:
        layer_name, kernel = lab.split("/")
        sizes_text, algs_text = division_text(steps)
        return {
            "network": self.network_name,
            "policy": policy,
            "planner": planner,
            "layer": layer_name,
            "count": self.counts[lab],
            "kernel": kernel,
            "micro_batches": sizes_text,
            "algorithms": algs_text,
            "n_micro_batches": len(steps),
            "largest_micro_batch": max(b for _, b in steps),
            "predicted_time_s": self.benchmarked(lab, steps),
            "workspace_bytes": ws,
            "default_time_s": self.default_cfg[lab][0],
            "default_workspace_bytes": self.default_cfg[lab][1],
            "executor_overhead_s": 0.0,
        }

    def _charge_overhead(self, plans_rows: list[dict], exec_plans: dict, policy: str, planner: str) -> None:
        """A layer that leaves the default pays the executor's overhead once (on its forward row)."""
        for ly in self.layers:
            keeps = self.keeps_default(exec_plans[ly.name][f"{policy}/{planner}"])
            row = next(r for r in plans_rows if (r["policy"], r["planner"], r["layer"], r["kernel"])
                       == (policy, planner, ly.name, "forward"))
            row["executor_overhead_s"] = 0.0 if keeps else self.overhead[ly.name]
            row["predicted_time_s"] += row["executor_overhead_s"]

    def _planning_row(self, policy: str, dp_s: float, headline: ilp.ILPResult, fronts: dict) -> dict:
        """What planning under `policy` cost: its share of the benchmark, the DP, the ILP's solves."""
        policy_bench_s = sum(
            r["bench_wall_s"]
            for r in self.bench
            if r.get("bench_wall_s") and r["micro_batch"] in policy_sizes(policy, self.batch_size)
        )
        return {
            "network": self.network_name,
            "policy": policy,
            "bench_s": policy_bench_s,
            "bench_total_s": self.bench_s,
            "dp_s": dp_s,
            "ilp_solve_s": headline.solve_s,
            "ilp_sweep_s": self.sweep_s[policy],
            "front_points": int(sum(len(f.time_s) for f in fronts.values())),
            "kernels": len(fronts),
            "default_workspace_bytes": self.default_total_ws,
            "ilp_workspace_bytes": headline.workspace_bytes,
        }
