"""`python -m hpcdl compare-verdicts DIR DIR …`: did consecutive runs give every claim the same verdict?

Each DIR is one run's results_dir (every `<study>/claims.json` in it). Prints each run's verdict line
(its counts by status), how many claims had one verdict in every run, and each claim that moved: its
status per run beside the number it was decided on (claim_lines.readable) and the items of it
that did not hold (its measured `holds`). This is the consistency
check of docs/architecture.md, "Results": a claim whose verdict moves between idle runs at the same
commit was decided by the host's noise, not by the measurement.

Exit status: 0 when every claim kept its verdict, 1 when one moved or is missing from a run, 2 when
a DIR holds no readable claims.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from hpcdl.platform.orchestration.claim_lines import readable

ORDER = ("failed", "not_measured", "passed", "straddles")
ABSENT = "absent"


class NoClaims(ValueError):
    """A results directory without readable claims; the message names the file or directory."""


def read_run(results_dir: str | Path) -> dict[str, dict]:
    """Every claim of one run, keyed "<study>.<claim id>"."""
    root = Path(results_dir)
    files = sorted(root.glob("*/claims.json"))
    if not files:
        raise NoClaims(f"{root}: no <study>/claims.json in it; a run writes them there "
                       "(make figures, or snakemake --config results_dir=...)")
    out = {}
    for f in files:
        try:
            doc = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise NoClaims(f"{f}: not a readable claims file ({e})") from e
        claims = doc.get("claims") if isinstance(doc, dict) else None
        if not isinstance(claims, list) or not all(isinstance(c, dict) and "id" in c and "status" in c
                                                   for c in claims):
            raise NoClaims(f"{f}: has no list of claims with an id and a status each")
        study = doc.get("study") or f.parent.name
        out.update({f"{study}.{c['id']}": c for c in claims})
    return out


@dataclass(frozen=True)
class Comparison:
    runs: tuple[str, ...]
    counts: tuple[Counter, ...]
    statuses: dict[str, tuple[str, ...]]  # claim -> its status in each run (ABSENT where missing)

    @property
    def moved(self) -> list[str]:
        return [k for k, s in self.statuses.items() if len(set(s)) > 1]

    @property
    def same(self) -> int:
        return len(self.statuses) - len(self.moved)


def compare(runs: dict[str, dict[str, dict]]) -> Comparison:
    """`runs`: run name -> read_run's claims, in run order."""
    keys = sorted({k for claims in runs.values() for k in claims})
    statuses = {k: tuple(claims[k]["status"] if k in claims else ABSENT for claims in runs.values())
                for k in keys}
    counts = tuple(Counter(c["status"] for c in claims.values()) for claims in runs.values())
    return Comparison(tuple(runs), counts, statuses)


def verdict_line(counts: Counter) -> str:
    named = [s for s in ORDER if counts.get(s)] + sorted(s for s in counts if s not in ORDER)
    return ", ".join(f"{s.replace('_', ' ')} {counts[s]}" for s in named)


def not_holding(c: dict) -> list[str]:
    """The items of a per-item claim (its measured `holds`: each run, format, network) that did not
    hold, with their verdicts: where a moved claim moved."""
    holds = (c.get("measured") or {}).get("holds")
    if not isinstance(holds, dict):
        return []
    word = {False: "fails", "fails": "fails", "straddles": "straddles"}
    return [f"{k} {word.get(v, v)}" for k, v in holds.items() if v is not True and v != "holds"]


def render(cmp: Comparison, runs: dict[str, dict[str, dict]]) -> str:
    lines = [f"run {i + 1} ({name}): {verdict_line(c)}"
             for i, (name, c) in enumerate(zip(cmp.runs, cmp.counts, strict=True))]
    lines.append(f"{cmp.same} of {len(cmp.statuses)} claims had the same verdict in all {len(cmp.runs)} runs")
    for k in cmp.moved:
        lines.append(f"moved: {k}: {' / '.join(cmp.statuses[k])}")
        for i, claims in enumerate(runs.values()):
            if k in claims:
                missed = not_holding(claims[k])
                lines.append(f"  run {i + 1}: {claims[k]['status']}: {readable(claims[k])}"
                             + (f"; not holding: {', '.join(missed)}" if missed else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcdl compare-verdicts",
                                 description="Whether consecutive runs gave every claim the same verdict.")
    ap.add_argument("results_dirs", nargs="+", metavar="DIR", help="one run's results_dir, in run order")
    args = ap.parse_args(argv)
    try:
        runs = {d: read_run(d) for d in args.results_dirs}
    except NoClaims as e:
        print(f"compare-verdicts: {e}", file=sys.stderr)
        return 2
    cmp = compare(runs)
    print(render(cmp, runs))
    return 1 if cmp.moved else 0
