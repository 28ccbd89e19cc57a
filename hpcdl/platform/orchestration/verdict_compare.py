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
from pathlib import Path

from hpcdl.platform.kit.claims import STATUSES, counts
from hpcdl.platform.orchestration.claim_lines import readable

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
        if not isinstance(claims, list) or not all(isinstance(c, dict) and "id" in c and c.get("status")
                                                   in STATUSES for c in claims):
            raise NoClaims(f"{f}: has no list of claims with an id and a status each")
        study = doc.get("study") or f.parent.name
        out.update({f"{study}.{c['id']}": c for c in claims})
    return out


def statuses(runs: dict[str, dict[str, dict]]) -> dict[str, tuple[str, ...]]:
    """Each claim of any run -> its status in each run, in run order (ABSENT where a run lacks it)."""
    keys = sorted({k for claims in runs.values() for k in claims})
    return {k: tuple(claims[k]["status"] if k in claims else ABSENT for claims in runs.values())
            for k in keys}


def verdict_line(claims: list[dict]) -> str:
    n = counts(claims)
    return ", ".join(f"{s.replace('_', ' ')} {n[s]}" for s in sorted(STATUSES) if n[s])


def not_holding(c: dict) -> list[str]:
    """The items of a per-item claim (its measured `holds`: each run, format, network) that did not
    hold, with their verdicts: where a moved claim moved."""
    holds = (c.get("measured") or {}).get("holds")
    if not isinstance(holds, dict):
        return []
    return [f"{k} {'fails' if v is False else v}" for k, v in holds.items() if v is not True and v != "holds"]


def render(runs: dict[str, dict[str, dict]]) -> tuple[str, list[str]]:
    """The report, and the claims that moved."""
    per_claim = statuses(runs)
    moved = [k for k, s in per_claim.items() if len(set(s)) > 1]
    lines = [f"run {i + 1} ({name}): {verdict_line(list(claims.values()))}"
             for i, (name, claims) in enumerate(runs.items())]
    lines.append(f"{len(per_claim) - len(moved)} of {len(per_claim)} claims had the same verdict in all "
                 f"{len(runs)} runs")
    for k in moved:
        lines.append(f"moved: {k}: {' / '.join(per_claim[k])}")
        for i, claims in enumerate(runs.values()):
            if k in claims:
                missed = not_holding(claims[k])
                lines.append(f"  run {i + 1}: {claims[k]['status']}: {readable(claims[k])}"
                             + (f"; not holding: {', '.join(missed)}" if missed else ""))
    return "\n".join(lines), moved


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
    text, moved = render(runs)
    print(text)
    return 1 if moved else 0
