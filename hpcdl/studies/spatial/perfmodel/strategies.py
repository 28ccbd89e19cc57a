"""Every parallel strategy at a GPU count, why each one cannot run, and the oracle's pick (pure Python).

ParaDL's strategy families, each enumerated over every factorisation of P GPUs into its splits:

  data            P data groups, each a batch share of whole samples
  spatial         one data group; every sample split depth x height over P ranks
  data x spatial  d > 1 data groups of P / d spatial ranks
  filter          (d data groups x) f > 1 ranks sharing every conv's output channels
  channel         (d data groups x) c > 1 ranks sharing every conv's input channels

A candidate cannot run, and says why, when
  mini-batch    the mini-batch has fewer samples than data groups (pure data parallelism: than GPUs);
  divisibility  the mini-batch does not divide into the data groups, or the sample's depth / height
                planes do not divide into the spatial split;
  channels      a conv has fewer output (filter) or input (channel) channels than the split;
  not modelled  the oracle cannot price it on this machine (a GPU calibration times whole-channel
                slabs only, so it has no filter / channel split, nor any shape it did not measure);
  memory        priced, but weights, gradients, optimizer state and activations per GPU exceed the
                machine's memory (oracle.predict).
`extrapolate` shows each family at each scale: its fastest candidate that fits, else its fastest priced
one (over memory), else the reasons none could be priced; the pick is the fastest fitting candidate of
any family, so a family other than spatial wins wherever the model says it is faster.
"""

from __future__ import annotations

import math

from hpcdl.studies.spatial.perfmodel.gpu_table import CalibrationGap
from hpcdl.studies.spatial.perfmodel.machine import Machine
from hpcdl.studies.spatial.perfmodel.oracle import Strategy, predict

FAMILIES = ("data", "spatial", "data x spatial", "filter", "channel")


def family(st: Strategy) -> str:
    if st.filter > 1:
        return "filter"
    if st.channel > 1:
        return "channel"
    if st.spatial > 1 and st.data > 1:
        return "data x spatial"
    if st.spatial > 1:
        return "spatial"
    return "data"


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _of_family(P: int, fam: str) -> list[Strategy]:
    """Every factorisation of P into the splits of one family."""
    out = []
    for d in divisors(P):
        rest = P // d
        if fam == "data" and rest == 1:
            out.append(Strategy(d))
        elif fam in ("spatial", "data x spatial") and rest > 1 and (d == 1) == (fam == "spatial"):
            out += [Strategy(d, pd, rest // pd) for pd in divisors(rest)]
        elif fam == "filter" and rest > 1:
            out.append(Strategy(d, filter=rest))
        elif fam == "channel" and rest > 1:
            out.append(Strategy(d, channel=rest))
    return out


def why_not(st: Strategy, batch: int, spec: list[dict]) -> str:
    """Why `st` cannot train `spec` at mini-batch `batch` before any pricing ('' when it can be priced)."""
    if batch < st.data:
        whom = f"{st.data} GPUs (pure data parallelism needs a sample per GPU)" if st.ranks == st.data \
            else f"{st.data} data groups"
        return f"mini-batch: {batch} samples < {whom}"
    if batch % st.data:
        return f"divisibility: mini-batch {batch} not divisible by {st.data} data groups"
    _, d0, h0, _ = spec[0]["in"]
    for axis, planes, parts in (("depth", d0, st.depth), ("height", h0, st.height)):
        if planes % parts:
            rel = "fewer than" if planes < parts else "not divisible by"
            return f"divisibility: the sample's {planes} {axis} planes {rel} {parts} {axis} ranks"
    convs = [L for L in spec if L["kind"] == "conv"]
    for split, side in ((st.filter, "cout"), (st.channel, "cin")):
        thin = [L for L in convs if L[side] < split]
        if split > 1 and thin:
            what = "output" if side == "cout" else "input"
            return (f"channels: {thin[0]['name']} has {thin[0][side]} {what} channels < "
                    f"{'filter' if side == 'cout' else 'channel'} split {split}")
    return ""


def strategies(P: int, batch: int, spec: list[dict]) -> list[Strategy]:
    """Every strategy of every family on P GPUs that the mini-batch, the sample and the channels allow."""
    return [st for fam in FAMILIES for st in _of_family(P, fam) if not why_not(st, batch, spec)]


def _summary(reasons: list[str]) -> str:
    """The distinct kinds of reason of a family's candidates: the first of each kind and how many share it."""
    kinds: dict[str, list[str]] = {}
    for r in reasons:
        kinds.setdefault(r.split(":", 1)[0], []).append(r)
    return "; ".join(rs[0] + (f" (and {len(rs) - 1} more split{'s' * (len(rs) > 2)} like it)"
                              if len(rs) > 1 else "") for rs in kinds.values())


def _price(spec, batch, st, machine: Machine) -> tuple[dict | None, str]:
    """The oracle's prediction for `st`, or None and why the model cannot price it on `machine`."""
    if machine.measured is not None and st.filter * st.channel > 1:
        return None, ("not modelled: the GPU calibration times whole-channel slabs only; a filter or "
                      "channel split is not in it")
    try:
        return predict(spec, batch, st, machine), ""
    except CalibrationGap as exc:
        return None, f"not modelled: {exc}"


def _row(P: int, fam: str, st: Strategy | None, pr: dict | None, batch: int) -> dict:
    row = {"gpus": P, "family": fam, "strategy": st.name if st else "none",
           "data": st.data if st else 0, "depth": st.depth if st else 0, "height": st.height if st else 0,
           "filter": st.filter if st else 0, "channel": st.channel if st else 0}
    if pr is None:
        return {**row, "total_s": math.nan, "memory_bytes": math.nan, "feasible": False,
                "samples_per_s": math.nan}
    return {**row, **pr, "samples_per_s": batch / pr["total_s"]}


def extrapolate(spec: list[dict], batch: int, machine: Machine, gpus: list[int]) -> list[dict]:
    """One row per scale and family: its fastest fitting candidate (else fastest priced, else none), with
    `infeasible_reason` (empty where it fits), the candidates counted; `chosen` flags the pick per scale."""
    rows = []
    limit = f"{machine.memory_bytes / 1e9:g} GB"
    for P in gpus:
        scale = []
        for fam in FAMILIES:
            cands = _of_family(P, fam)
            priced, reasons = [], {}
            for st in cands:
                why = why_not(st, batch, spec)
                pr, why = (None, why) if why else _price(spec, batch, st, machine)
                if pr is not None:
                    priced.append((not pr["feasible"], pr["total_s"], st, pr))
                    why = "" if pr["feasible"] else (
                        f"memory: {pr['memory_bytes'] / 1e9:.3g} GB per GPU (weights, gradients, optimizer "
                        f"state, activations) > {limit}")
                reasons[st] = why
            if priced:
                _, _, st, pr = min(priced, key=lambda x: (x[0], x[1]))
                row = _row(P, fam, st, pr, batch)
                # the shown candidate's reason first: it speaks for the others of its kind
                shown = [reasons.pop(st)]
            else:
                row, shown = _row(P, fam, None, None, batch), []
            rest = shown + [r for r in reasons.values() if r]
            row["infeasible_reason"] = "" if row["feasible"] else (
                _summary(rest) if rest else f"no split: {P} GPUs leave no {fam} factorisation")
            row["candidates"] = len(cands)
            row["candidates_feasible"] = sum(not x[0] for x in priced)
            scale.append(row)
        fitting = [r for r in scale if r["feasible"]]
        pick = min(fitting, key=lambda r: r["total_s"]) if fitting else None
        for r in scale:
            r["chosen"] = r is pick
        rows += scale
    return rows
