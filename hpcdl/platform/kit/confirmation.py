"""Where each claim's verdict is confirmed: on seeds (or inputs) that shaped no choice, or why it has none
(docs/architecture.md, "Results").

Choices made while looking at results (thresholds, grids, knobs, gates) are fitted to the seeds those
results came from; a verdict judged on the same seeds confirms nothing. So a study's config block keeps
the two apart: the key the run reads (e.g. `seed`, `seeds`, `kakurenbo.seeds`) holds the CONFIRMATION
seeds, and the block's `exploration` (configs/schema/exploration.yaml) lists, under the same key, the
values it had while choices were made. Each study's claims module declares once, per claim id of its
CLAIMS, where the confirmation comes from:

    CONFIRMATION = {
        "hpo.pruning": confirmed_on("seed"),
        "malleable_beats_rigid": confirmed_on("cosched.jobs", kind="inputs"),
        "roundtrip": deterministic("every checkpoint loads back verified, whatever the seed"),
        "hidden_fraction": unseeded("timings of this run's steps: no seed decides them"),
    }

and write_claims (hpcdl.platform.kit.claims) attaches to every claim one of

    {"seeds": [1], "key": "seed", "exploration": [0], "unseen": true}
    {"none": "deterministic check: ..."}

`unseen` holds only where the exploration is recorded and shares no value with the confirmation; an
unrecorded one (`exploration: null`) never counts as unseen. A study whose declaration misses a claim id
is refused, naming the study and the id.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

KINDS = ("seeds", "inputs")
SHOWN_ITEMS = 8  # seeds listed in a line; longer lists are cut with a count


def lookup(block: Mapping, key: str):
    """The value at a dotted key of a study block; KeyError (naming the part) where it is absent."""
    node = block
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(part)
        node = node[part]
    return node


def _items(value) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def _canon(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class ConfirmedOn:
    """Confirmed on the seeds (or inputs) the block holds at `key` (or at `default_key` where the block
    leaves `key` out, as the study itself falls back)."""

    key: str
    kind: str = "seeds"
    default_key: str | None = None

    def resolve(self, block: Mapping, where: str) -> dict:
        used = self.key
        try:
            value = lookup(block, self.key)
        except KeyError:
            if self.default_key is None:
                raise ValueError(f"{where}: confirmed on config key '{self.key}', which the block does not "
                                 "have") from None
            used = self.default_key
            try:
                value = lookup(block, used)
            except KeyError:
                raise ValueError(f"{where}: confirmed on config key '{self.key}' (or '{used}'), which the "
                                 "block does not have") from None
        seen = (block.get("exploration") or {}).get(used)
        values = _items(value)
        unseen = seen is not None and not ({_canon(v) for v in values} & {_canon(v) for v in seen})
        return {self.kind: values, "key": used, "exploration": None if seen is None else list(seen),
                "unseen": unseen}


@dataclass(frozen=True)
class WithoutSeeds:
    """A claim no seed decides, and why (a deterministic check, or a measurement taken afresh)."""

    why: str

    def resolve(self, block: Mapping, where: str) -> dict:
        return {"none": self.why}


def confirmed_on(key: str, *, kind: str = "seeds", default_key: str | None = None) -> ConfirmedOn:
    if kind not in KINDS:
        raise ValueError(f"confirmed_on({key!r}): kind must be one of {KINDS}, got {kind!r}")
    return ConfirmedOn(key, kind, default_key)


def deterministic(why: str) -> WithoutSeeds:
    """No confirmation seeds: the check comes out the same for any seed (bit-identical, exact counts)."""
    return WithoutSeeds(f"deterministic check: {why}")


def unseeded(why: str) -> WithoutSeeds:
    """No confirmation seeds: no seed decides the measured quantity (a timing or a memory peak of this
    run, measured afresh each run)."""
    return WithoutSeeds(why)


def measured_afresh(what: str) -> WithoutSeeds:
    """`unseeded` for the commonest reason: `what` (timings of this run) is measured afresh each run."""
    return unseeded(f"{what}, measured afresh: no seed decides them")


def resolve_all(study: str, declaration: Mapping, ids: Iterable[str], block: Mapping) -> dict[str, dict]:
    """Each declared claim id's confirmation entry; refuses a declaration that misses an id of `ids` or
    names one that is not among them."""
    ids = list(ids)
    where = f"hpcdl/studies/{study}/claims.py CONFIRMATION"
    absent = [i for i in ids if i not in declaration]
    if absent:
        raise ValueError(f"study {study}: claim {absent[0]!r} declares no confirmation: add it to {where} "
                         "(confirmed_on(<config key>), deterministic(<why>) or unseeded(<why>))")
    extra = [i for i in declaration if i not in ids]
    if extra:
        raise ValueError(f"study {study}: {where} names {extra[0]!r}, which is not a claim of the study; "
                         f"its claims: {', '.join(ids)}")
    for i in ids:
        if not isinstance(declaration[i], ConfirmedOn | WithoutSeeds):
            raise ValueError(f"study {study}: {where}[{i!r}] is {declaration[i]!r}; use confirmed_on, "
                             "deterministic or unseeded")
    return {i: declaration[i].resolve(block, f"study {study}, claim {i}") for i in ids}


def _plain(values: list) -> bool:
    return all(isinstance(v, int | float | str) and not isinstance(v, bool) for v in values)


def _list(values: list) -> str:
    if _plain(values):
        shown = ", ".join(str(v) for v in values[:SHOWN_ITEMS])
        return shown + (f", … ({len(values)} in all)" if len(values) > SHOWN_ITEMS else "")
    return f"{len(values)} item{'s' if len(values) != 1 else ''}"


def describe(conf: Mapping | None) -> str:
    """One line for a claim's confirmation entry: 'confirmed on unseen seeds 1 (seed; exploration: 0)', the
    seeds it was judged on and which of them tuning saw, or why it has none."""
    if not conf:
        return "confirmation not declared"
    if "none" in conf:
        return f"no confirmation seeds: {conf['none']}"
    kind = next(k for k in KINDS if k in conf)
    values, seen, key = conf[kind], conf.get("exploration"), conf.get("key", "?")
    # plain seeds are listed with their key; structured inputs (a workload's jobs) are counted
    plain = _plain(values)
    head = f"{kind} {_list(values)}" if plain else f"{kind}: the {_list(values)} of {key}"
    on = f"{head} ({key})" if plain else head
    if conf.get("unseen"):
        explored = _list(seen) if seen else "none"
        return f"confirmed on unseen {head} ({key + '; ' if plain else ''}exploration: {explored})"
    if seen is None:
        return f"judged on {on}; exploration {kind} not recorded"
    both = [v for v in values if _canon(v) in {_canon(s) for s in seen}]
    return f"judged on {on}, not unseen: {_list(both)} also shaped choices (exploration: {_list(seen)})"
