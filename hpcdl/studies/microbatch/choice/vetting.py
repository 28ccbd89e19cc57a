"""Plans vetted inside the network stack before they are timed (microbatch.stack_vetting_rounds).

A kernel benchmarked alone and warm can beat the framework's default and still run slower among the
network's other layers (on the laptop, 28 of 28 such moves besides each network's first conv, #40).
Every layer a plan moves off the default is timed inside whole-network rounds against the default
(plan_timing.in_stack_speedups); a layer whose move does not reach `needed_speedup` there is pinned to
the default and the planners run again, until every move left has reached it. These rounds shape
the plans; the timed rounds the claims judge come after them and are fresh ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hpcdl.studies.microbatch.choice.algorithms import KernelCall
from hpcdl.studies.microbatch.choice.plan_timing import in_stack_speedups, plan_key
from hpcdl.studies.microbatch.common.dp import division_text

# the raw table's columns (compute.py adds the network), also its header where nothing was timed
COLUMNS = ["network", "vetting_pass", "plan_id", "variants", "layer", "layer_plan", "in_stack_default_s",
           "in_stack_plan_s", "in_stack_speedup", "needed_speedup", "confirmed", "rounds"]

# exec_plans: {layer: {variant: layer plan}}; a planner returns what it made and those plans
Planner = Callable[[frozenset[str]], tuple[object, dict[str, dict[str, dict]]]]


@dataclass
class Vetted:
    planned: object  # what the planner returned beside the plans, on its last pass
    variants: dict[str, dict[str, dict]]  # {variant: {layer: layer plan}}, every move confirmed
    pinned: set[str] = field(default_factory=set)
    rows: list[dict] = field(default_factory=list)  # every move timed: in_stack_speedups' rows + verdict
    seconds: float = 0.0  # spent timing in the stack


def by_variant(exec_plans: dict[str, dict[str, dict]]) -> dict[str, dict[str, dict]]:
    """{layer: {variant: layer plan}} -> {variant: {layer: layer plan}}."""
    variants: dict[str, dict[str, dict]] = {}
    for layer, plans in exec_plans.items():
        for variant, layer_plan in plans.items():
            variants.setdefault(variant, {})[layer] = layer_plan
    return variants


def vet(plan: Planner, calls: dict[str, KernelCall], keeps_default: Callable[[dict], bool], device: str,
        rounds: int, needed_speedup: float) -> Vetted:
    """Plan with nothing pinned; with `rounds` > 0, time every layer a plan moves (a move already
    confirmed, or a pinned layer, is not timed again) and pin each one below `needed_speedup`, then
    plan again. Each pass pins a layer or confirms every move, so it ends within len(calls) + 1
    passes."""
    confirmed: set[tuple] = set()  # plan_key of a (layer, layer plan) that reached needed_speedup
    out = Vetted(None, {})
    for vetting_pass in range(len(calls) + 1):
        out.planned, exec_plans = plan(frozenset(out.pinned))
        out.variants = by_variant(exec_plans)
        if not rounds:
            break
        # a pinned layer runs what the planners offer it nearest the default (where only the separate
        # backward is on offer, that is the default algorithm through the executor): not timed again
        moved = {v: {name for name, p in layers.items() if not keeps_default(p)
                     and name not in out.pinned and plan_key({name: p}) not in confirmed}
                 for v, layers in out.variants.items()}
        if not any(moved.values()):
            break
        started = time.perf_counter()
        rows = in_stack_speedups(calls, {v: p for v, p in out.variants.items() if moved[v]}, moved, device,
                                 rounds)
        out.seconds += time.perf_counter() - started
        for r in rows:
            layer_plan = out.variants[r["plan_id"]][r["layer"]]
            r |= {"vetting_pass": vetting_pass, "layer_plan": plan_text(layer_plan),
                  "needed_speedup": needed_speedup, "confirmed": r["in_stack_speedup"] >= needed_speedup}
            if r["confirmed"]:
                confirmed.add(plan_key({r["layer"]: layer_plan}))
            else:
                out.pinned.add(r["layer"])
        out.rows += rows
        if all(r["confirmed"] for r in rows):
            break
    return out


def plan_text(layer_plan: dict) -> str:
    """A layer plan in one line: each kernel's micro-batch sizes and their algorithms."""
    return "; ".join(f"{kernel} {'/'.join(division_text(steps))}" for kernel, steps in layer_plan.items())
