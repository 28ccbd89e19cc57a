"""Claims: each study's headline restated as a check on this run's numbers (docs/architecture.md, "Results").

One rule for every study: a claim is always present, with one of four statuses.

    passed        measured, and the measured values meet the threshold
    failed        measured, and they do not (a finding of this run, not a crash)
    straddles     measured over repeats, and the 95 % interval of the compared quantity straddles the
                  threshold (hpcdl.platform.kit.intervals): noise decides, so neither a pass nor a fail
    not_measured  an input is missing, failed or incomplete: the claim is present, NOT passed,
                  and its `reason` says which input ("not measured: point partial-0.1 M=8 failed")

A claim over "every X" lists each X in its evidence; a measured X that misses the threshold
fails it, otherwise a missing X leaves it not measured, and otherwise one that straddles makes the
claim straddle (see `every`).

Each study's analysis module declares the claim ids it can emit in `CLAIMS` (a `{M}` in an id
stands for a number); `write_claims` refuses an undeclared id, and tests/test_claims.py
refuses a declared id without a passing, a failing and a missing-input test. The same module declares,
per id, where the claim's confirmation comes from (`CONFIRMATION`, hpcdl.platform.kit.confirmation):
`write_claims` attaches it to each claim and refuses a study whose declaration misses an id.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from hpcdl.platform.kit.atomic import atomic_write_json, atomic_write_text, json_default
from hpcdl.platform.kit.confirmation import describe, resolve_all
from hpcdl.platform.kit.intervals import FAILS, HOLDS, STRADDLES
from hpcdl.platform.kit.study_dir import StudyDir

STATUSES = ("passed", "failed", "straddles", "not_measured")
SHOWN = {"passed": ("green", "PASS"), "failed": ("firebrick", "FAIL"),
         "straddles": ("darkorange", "STRADDLES"), "not_measured": ("dimgray", "NOT MEASURED")}
_STATUS_OF = {True: "passed", False: "failed", HOLDS: "passed", FAILS: "failed", STRADDLES: "straddles"}


def claim(claim_id: str, statement: str, passed: bool | str, **measured) -> dict:
    """A measured claim: `measured` holds the values it was decided on and the threshold.

    `passed`: a bool, or an interval verdict (intervals.HOLDS / FAILS / STRADDLES)."""
    if passed not in _STATUS_OF:
        raise ValueError(f"claim {claim_id}: passed must be a bool or an interval verdict, got {passed!r}")
    status = _STATUS_OF[passed]
    return {"id": claim_id, "statement": statement, "status": status, "passed": status == "passed",
            "measured": measured}


def not_measured(claim_id: str, statement: str, reason: str | Iterable[str], **measured) -> dict:
    """A claim whose inputs are missing, failed or incomplete: present, not passed, with the reason."""
    reasons = [reason] if isinstance(reason, str) else list(reason)
    if not reasons:
        raise ValueError(f"claim {claim_id}: not_measured needs a reason")
    return {"id": claim_id, "statement": statement, "status": "not_measured", "passed": False,
            "reason": "not measured: " + "; ".join(reasons), "measured": measured}


def every(claim_id: str, statement: str, holds: Mapping[str, bool | str], missing: Mapping[str, str],
          **measured) -> dict:
    """A claim over every X. `holds[x]`: the check on a measured x (a bool or an interval verdict);
    `missing[x]`: why x has no value.

    Failed if any measured x misses the threshold (that is a finding whatever else is missing);
    otherwise not measured if any x is missing; otherwise straddles if any x straddles; passed only
    when every x was measured and holds.
    """
    status = {str(k): _STATUS_OF[v] for k, v in holds.items()}
    shown = {k: s == "passed" if s != "straddles" else s for k, s in status.items()}
    measured = {"holds": shown, "missing": dict(missing), **measured}
    if not holds and not missing:
        return not_measured(claim_id, statement, "the run defines nothing to check", **measured)
    if "failed" in status.values():
        return claim(claim_id, statement, False, **measured)
    if missing:
        return not_measured(claim_id, statement, [f"{x}: {why}" for x, why in missing.items()], **measured)
    return claim(claim_id, statement, STRADDLES if "straddles" in status.values() else True, **measured)


def declared(claim_id: str, ids: Iterable[str]) -> bool:
    """Whether `claim_id` matches one of a study's declared ids (`{M}` matches a number)."""
    return any(re.fullmatch(re.escape(d).replace(re.escape("{M}"), r"\d+"), claim_id) for d in ids)


def check(claims: list[dict], ids: Iterable[str] | None = None) -> None:
    ids = list(ids) if ids is not None else None
    for c in claims:
        missing = {"id", "statement", "status", "passed", "measured"} - set(c)
        if missing:
            raise ValueError(f"claim {c!r} lacks {sorted(missing)}; "
                             "build claims with hpcdl.platform.kit.claims")
        if c["status"] not in STATUSES or c["passed"] != (c["status"] == "passed"):
            raise ValueError(f"claim {c['id']}: status {c['status']!r} with passed={c['passed']!r}")
        if c["status"] == "not_measured" and not c.get("reason"):
            raise ValueError(f"claim {c['id']} is not measured but gives no reason")
        if ids is not None and not declared(c["id"], ids):
            raise ValueError(f"claim {c['id']} is not declared in the study's CLAIMS {ids}")


def counts(claims: list[dict]) -> dict[str, int]:
    return {s: sum(c["status"] == s for c in claims) for s in STATUSES}


def attach_tuned(claims: list[dict], notes: Iterable[Mapping],
                 ids: Iterable[str] | None = None) -> list[dict]:
    """Each claim with the config's `tuned` notes that name it (a note may name a declared id with
    `{M}`), under `tuned`: [{key, why}]. A note naming no declared claim is an error, not ignored."""
    notes, ids = list(notes), list(ids) if ids is not None else None
    for i, note in enumerate(notes):
        for named in note["claims"]:
            if ids is not None and named not in ids and not declared(named, ids):
                raise ValueError(f"config key 'tuned[{i}].claims': {named!r} is not a claim of the study; "
                                 f"allowed: {', '.join(ids)}")
    out = []
    for c in claims:
        hits = [{"key": n["key"], "why": n["why"]} for n in notes
                if any(c["id"] == named or declared(c["id"], [named]) for named in n["claims"])]
        out.append({**c, "tuned": hits} if hits else c)
    return out


def attach_confirmation(claims: list[dict], study: str, declaration: Mapping, ids: Iterable[str],
                        block: Mapping) -> list[dict]:
    """Each claim with its confirmation entry, under `confirmation` (the declaration's entry for the
    declared id it matches, resolved against the study's config block). A claim that carries its own
    entry keeps it: where the run's input came from (a committed file rather than this run's
    measurement) is known only when the claim is judged; the declaration must still cover its id."""
    ids = list(ids)
    entries = resolve_all(study, declaration, ids, block)
    out = []
    for c in claims:
        match = next((d for d in ids if c["id"] == d or declared(c["id"], [d])), None)
        own = c.get("confirmation")
        out.append({**c, "confirmation": own or entries[match]} if match is not None else c)
    return out


def annotate(claims: list[dict], study: str, ids: Iterable[str] | None = None, tuned: Iterable[Mapping] = (),
             confirmation: Mapping | None = None, block: Mapping | None = None) -> list[dict]:
    """The claims as written: with their `tuned` notes and, where a declaration is given, their
    confirmation (which then must cover every id of `ids`)."""
    ids = list(ids) if ids is not None else None
    claims = attach_tuned(claims, tuned, ids)
    if confirmation is not None:
        claims = attach_confirmation(claims, study, confirmation,
                                     ids if ids is not None else list(confirmation), block or {})
    return claims


# The page fits the window: fixed column widths, long values wrap anywhere (ids, paths, JSON keys).
PAGE_CSS = (
    "body { font-family: sans-serif; margin: 0.5em; max-width: 100%; }"
    " table.claims { border-collapse: collapse; table-layout: fixed; width: 100%; }"
    " table.claims > tbody > tr > td, table.claims > tbody > tr > th { border: 1px solid #bbb; padding: 4px;"
    " vertical-align: top; overflow-wrap: anywhere; word-break: break-word; text-align: left; }"
    " table.kv { border-collapse: collapse; width: 100%; font-size: 0.85em; }"
    " table.kv th, table.kv td { border-top: 1px solid #ddd; padding: 1px 4px; vertical-align: top;"
    " text-align: left; overflow-wrap: anywhere; word-break: break-word; }"
    " table.kv th { font-weight: normal; color: #555; width: 35%; }"
)
MAX_DEPTH = 3  # deeper values are shown as compact JSON


def _scalar(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v) if isinstance(v, str | int | bool) or v is None else json.dumps(v, default=json_default)


def measured_html(value, depth: int = 0) -> str:
    """Measured values as nested key / value tables (an interval as 'mean [low, high] (95 % CI, n)',
    a list of plain values and a nested flat mapping as one line), escaped."""
    if isinstance(value, dict) and value:
        ci = [k for k in value if str(k).startswith("ci")]
        if "mean" in value and ci and isinstance(value[ci[0]], list | tuple) and len(value[ci[0]]) == 2:
            low, high = value[ci[0]]
            rest = {k: v for k, v in value.items() if k not in ("mean", ci[0], "n")}
            head = (f"{_scalar(value['mean'])} [{_scalar(low)}, {_scalar(high)}] "
                    f"({str(ci[0])[2:]} % CI, n={value.get('n', '?')})")
            return html.escape(head) + (measured_html(rest, depth + 1) if rest else "")
        if depth and all(not isinstance(v, dict | list | tuple) for v in value.values()):
            # a flat mapping (per app, per X) on one wrapping line: compact, and still a table above it
            return html.escape(", ".join(f"{k}: {_scalar(v)}" for k, v in value.items()))
        if depth >= MAX_DEPTH:
            return html.escape(json.dumps(value, default=json_default))
        rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{measured_html(v, depth + 1)}</td></tr>"
                       for k, v in value.items())
        return f"<table class='kv'>{rows}</table>"
    if isinstance(value, list | tuple) and value and all(not isinstance(v, dict | list) for v in value):
        return html.escape(", ".join(_scalar(v) for v in value))
    return html.escape("—" if isinstance(value, dict) else _scalar(value))


def _tuned_html(c: dict) -> str:
    return "".join(f"<br><small class='tuned'><b>tuned</b> after seeing this claim: "
                   f"<code>{html.escape(n['key'])}</code>: {html.escape(n['why'])}</small>"
                   for n in c.get("tuned", []))


def _confirmation_html(c: dict) -> str:
    if "confirmation" not in c:
        return ""
    return f"<br><small class='confirmation'>{html.escape(describe(c['confirmation']))}</small>"


def write_claims(study_dir: str | Path, study: str, claims: list[dict],
                 ids: Iterable[str] | None = None, tuned: Iterable[Mapping] = (),
                 confirmation: Mapping | None = None, block: Mapping | None = None) -> tuple[Path, Path]:
    """claims.json (machine-readable) and claims.html (shown in the Snakemake report), both saying
    the device the run was measured on (from the study's provenance sidecars). `tuned`: the study
    block's `tuned` notes, shown with the claims they name (`attach_tuned`). `confirmation`: the
    study's CONFIRMATION, resolved against its config `block` and attached to each claim
    (`attach_confirmation`); a declaration that misses a claim id is refused before anything is written."""
    study_dir = Path(study_dir)
    check(claims, ids)
    claims = annotate(claims, study, ids, tuned, confirmation, block)
    n = counts(claims)
    device = StudyDir(study_dir).measured_on() or "unknown (no provenance sidecars)"
    doc = {"study": study, "claims": claims, **n, "total": len(claims), "measured_on": device}
    json_path = atomic_write_json(StudyDir(study_dir).claims_json, doc)
    confirmed = [c for c in claims if "confirmation" in c]
    unseen = (f" {sum(bool(c['confirmation'].get('unseen')) for c in confirmed)} of {len(confirmed)} "
              "confirmed on unseen seeds or inputs (each claim says on which).") if confirmed else ""
    rows = []
    for c in claims:
        color, word = SHOWN[c["status"]]
        why = f"<br><i>{html.escape(c['reason'])}</i>" if c.get("reason") else ""
        rows.append(f"<tr class='{c['status']}'><td>{html.escape(c['id'])}</td>"
                    f"<td>{html.escape(c['statement'])}{why}{_tuned_html(c)}{_confirmation_html(c)}</td>"
                    f"<td style='color:{color}'><b>{word}</b></td>"
                    f"<td class='measured'>{measured_html(c['measured'])}</td></tr>")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(study)} claims</title>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<style>{PAGE_CSS}</style></head><body>"
            f"<h2>{html.escape(study)}: {n['passed']}/{len(claims)} claims hold on this run "
            f"({n['failed']} failed, {n['straddles']} straddle, {n['not_measured']} not measured)</h2>"
            f"<p>Measured on {html.escape(device)}: each verdict holds for this run on this device."
            f"{unseen}</p>"
            "<table class='claims'><colgroup><col style='width:14%'><col style='width:34%'>"
            "<col style='width:10%'><col style='width:42%'></colgroup>"
            "<tr><th>claim</th><th>statement</th><th>result</th><th>measured</th></tr>"
            f"{''.join(rows)}</table></body></html>\n")
    html_path = atomic_write_text(StudyDir(study_dir).claims_html, page)
    return json_path, html_path
