"""Paper vs ours: each result the studies' papers published (resources/papers.yaml, every one with its
source and verbatim sentence) beside this run's number, the committed GPU records' and the oracle's
prediction, with a verdict (docs/architecture.md, "Report").

Which of a run's tables or claims gives "ours" for a published id, and how the two compare, is the
study's declaration (`StudySpec.paper`: {id: hpcdl.platform.kit.study.Ours}, in hpcdl/studies/<study>/
paper.py); the platform reaches it through the registry, never by importing a study. The verdicts:

    within N %                    |ours / paper - 1| <= N % (or beyond the paper on its better side)
    reproduced in direction       ours on the same side of the declared line as the paper's value
                                  (a speedup above 1, a saving above 0; an interval wholly on it), or a
                                  qualitative result whose claims of this run all passed
    direction undecided           ours' interval straddles the line, or one of the claims straddles
    not reproduced                the other side, a claim failed, or off by more than N % with no line
    not reproducible on this hardware (why)   e.g. 2048 GPUs, or cuDNN's workspace limits on a CPU
    not yet measured (why)        the study did not run, or the run lacks the table or claim
    context, not a result         a setting or definition the paper states: shown, not compared
    other setting (which)         a setting key the row declares essential differs from the paper's
    other mechanism (why)         ours was not made by the paper's mechanism (no kernel divided)
    older code (what changed)     a GPU record of code that has changed since: shown, not judged

A row is never better than its own claims (`Ours.rests_on`): a failed claim caps it at not reproduced,
a straddling one at undecided, a not-measured or absent one at not yet measured.

The comparison is shown only: it never feeds back into a model, a threshold or a claim (a config value
taken from it would need a `tuned` note, hpcdl.platform.kit.claims).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import yaml

from hpcdl.platform.kit.claims import SHOWN
from hpcdl.platform.kit.study import REPO_ROOT, Ours, RunFiles, StudySpec, registered
from hpcdl.platform.kit.study_dir import StudyDir
from hpcdl.platform.orchestration import gpu_records
from hpcdl.platform.orchestration.claim_lines import AMBER, readable

PAPERS = REPO_ROOT / "resources" / "papers.yaml"
SCALES = {"default": "laptop", "test": "test", "paper": "paper", "gpu": "gpu"}  # config file stem -> scale
KINDS = {"within": "green", "reproduced": "green", "undecided": AMBER, "not_reproduced": "firebrick",
         "not_measured": AMBER, "unreproducible": "dimgray", "context": "dimgray",
         "other_setting": "dimgray", "other_mechanism": "dimgray", "older_code": "dimgray"}
GREEN = ("within", "reproduced")
_E = html.escape


class PapersError(ValueError):
    """papers.yaml, or a study's mapping of it, that does not have the expected form."""


def load(path: str | Path = PAPERS) -> dict[str, list[dict]]:
    """study -> its published results, each with an id, a source, and a value + unit or a qualitative
    statement; an error names the file and the entry."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PapersError(f"{path}: cannot be read as YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise PapersError(f"{path}: needs a mapping of study name -> list of published results")
    for study, items in doc.items():
        if not isinstance(items, list):
            raise PapersError(f"{path}: '{study}' needs a list of published results")
        seen = set()
        for i, it in enumerate(items):
            where = f"{path}: {study}[{i}]"
            if not isinstance(it, dict) or not isinstance(it.get("id"), str):
                raise PapersError(f"{where}: needs an 'id'")
            if it["id"] in seen:
                raise PapersError(f"{where}: id {it['id']!r} appears twice")
            seen.add(it["id"])
            if not isinstance(it.get("source"), str) or not it["source"].strip():
                raise PapersError(f"{where} ({it['id']}): needs a 'source'")
            numeric = "value" in it
            if numeric == ("qualitative" in it):
                raise PapersError(f"{where} ({it['id']}): needs exactly one of 'value' (with 'unit') and "
                                  "'qualitative'")
            if numeric and not (isinstance(it["value"], int | float) and isinstance(it.get("unit"), str)):
                raise PapersError(f"{where} ({it['id']}): 'value' must be a number with a 'unit'")
    return doc


def paper_inputs(path: str | Path = PAPERS) -> list[str]:
    """The file a page showing paper-vs-ours rows reads, where it exists (a rule input: a change reruns
    the page)."""
    return [str(path)] if Path(path).is_file() else []


def scale_of(config_files: Iterable[str]) -> str:
    """The run's scale from its config files' names (configs/default.yaml: laptop; test, paper, gpu)."""
    names = [Path(f).stem for f in config_files]
    return " + ".join(SCALES.get(n, n) for n in names) or "unknown"


def run_files(study_dir: str | Path) -> RunFiles | None:
    """What a mapping reads of this run's study; None where the study did not run (no claims.json)."""
    study_dir = Path(study_dir)
    try:
        claims = json.loads(StudyDir(study_dir).claims_json.read_text())["claims"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return RunFiles(study_dir / "tables", tuple(claims), StudyDir(study_dir).measured_on())


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _off(ours: float, paper: float) -> tuple[float, str]:
    dev = ours / paper - 1 if paper else ours - paper
    return dev, f"ours {_pct(abs(dev))} {'above' if dev > 0 else 'below'} the paper"


def compare(paper: float, got: dict, ours: Ours) -> tuple[str, str]:
    """(kind, verdict) of our number against the paper's (module docstring). With a line, the direction
    comes first: a number on the other side of it is never "within N %" (a 0.95x slowdown is not
    within 25 % of a 1.21x speedup)."""
    v = float(got["value"])
    dev, off = _off(v, paper)
    tol = ours.tolerance
    if ours.line is not None and paper != ours.line:
        up = paper > ours.line
        low, high = got.get("interval") or (v, v)
        same_side = low > ours.line if up else high < ours.line
        if not same_side and not (high <= ours.line if up else low >= ours.line):
            return "undecided", (f"direction undecided: ours' interval [{_fmt(low)}, {_fmt(high)}] straddles "
                                 f"{ours.line:g}")
        if not same_side:
            return "not_reproduced", (f"not reproduced: ours {_fmt(v)} is on the other side of {ours.line:g} "
                                      f"from the paper's {paper:g}")
    if tol is not None:
        if abs(dev) <= tol:
            return "within", f"within {_pct(tol)} ({off})"
        if (ours.better == "higher" and dev > 0) or (ours.better == "lower" and dev < 0):
            return "within", f"within {_pct(tol)} or better ({off})"
    beyond = f"; beyond the {_pct(tol)} tolerance" if tol is not None else ""
    if ours.line is not None and paper != ours.line:
        return "reproduced", f"reproduced in direction ({off}{beyond})"
    return "not_reproduced", f"not reproduced ({off}{beyond})"


def _by_claims(ours: Ours, run: RunFiles) -> dict:
    found = [c for name in ours.claims for c in run.claims_named(name)]
    absent = [name for name in ours.claims if not run.claims_named(name)]
    text = "; ".join(f"{c['id']} {SHOWN[c['status']][1]}: {readable(c)}" for c in found)
    statuses = {c["status"] for c in found}
    names = ", ".join(c["id"] for c in found)
    if "failed" in statuses:
        failed = ", ".join(c["id"] for c in found if c["status"] == "failed")
        return {"kind": "not_reproduced", "verdict": f"not reproduced (claim {failed} failed)", "text": text}
    if absent:
        return {"kind": "not_measured", "verdict": f"not yet measured (this run has no claim "
                                                   f"{', '.join(absent)})", "text": text}
    if "not_measured" in statuses:
        return {"kind": "not_measured", "verdict": "not yet measured (" + "; ".join(
            c["reason"].removeprefix("not measured: ") for c in found if c["status"] == "not_measured")
            + ")", "text": text}
    if "straddles" in statuses:
        return {"kind": "undecided", "verdict": "direction undecided (an interval straddles the claim's "
                                                "threshold)", "text": text}
    return {"kind": "reproduced", "verdict": f"reproduced in direction (claims {names} passed)", "text": text}


def evaluate(published: dict, ours: Ours | None, run: RunFiles | None, study: str = "") -> dict:
    """One run's side of a row: {kind, verdict, text[, value, interval, setting]}."""
    def out(kind, verdict, text="—", **more):
        return {"kind": kind, "verdict": verdict, "text": text, **more}

    if ours is None:
        return out("not_measured", f"not yet measured (no mapping for it in hpcdl/studies/{study}/paper.py)")
    if ours.context:
        return out("context", "context, not a result", ours.context)
    if run is None:
        return out("not_measured", "not yet measured (the study did not run: no claims.json)")
    if ours.unreproducible:
        return out("unreproducible", f"not reproducible on this hardware ({ours.unreproducible})")
    if ours.claims:
        return _by_claims(ours, run)
    try:
        got = ours.value(run)
    except (KeyError, ValueError, TypeError, IndexError) as exc:  # a table of an unexpected form: shown
        got = {"missing": f"{ours.source} could not be read: {type(exc).__name__}: {exc}"}
    if got is None:
        return out("not_measured", f"not yet measured (this run has no {ours.source})")
    if "unreproducible" in got:
        return out("unreproducible", f"not reproducible on this hardware ({got['unreproducible']})")
    if "missing" in got:
        return out("not_measured", f"not yet measured ({got['missing']})")
    v = float(got["value"])
    if not math.isfinite(v):
        return out("not_measured", f"not yet measured ({ours.source} is not a finite number)")
    text = _fmt(v) + (" [{}, {}]".format(*map(_fmt, got["interval"])) if got.get("interval") else "")
    # a line read from the run (a claim's own threshold) takes the place of the declared one
    kind, verdict = compare(float(published["value"]), got,
                            replace(ours, line=float(got["line"])) if got.get("line") is not None else ours)
    differs = setting_differences(published.get("setting"), got.get("setting_fields") or {})
    essential = [f"{k} ours {o}, paper {p}" for k, o, p in differs if k in ours.essential]
    essential += [got["setting_differs"]] if got.get("setting_differs") else []
    if got.get("mechanism_differs"):
        kind, verdict = "other_mechanism", f"other mechanism: {got['mechanism_differs']} (was: {verdict})"
    elif essential:
        kind, verdict = "other_setting", f"other setting: {'; '.join(essential)} (was: {verdict})"
    kind, verdict, claims_text = cap_by_claims(kind, verdict, ours.rests_on, run)
    return out(kind, verdict, text + claims_text, value=v, interval=got.get("interval"),
               setting=got.get("setting") or ours.setting,
               differs="; ".join(f"{k}: ours {o}, paper {p}" for k, o, p in differs))


def setting_differences(published, ours: dict) -> list[tuple[str, str, str]]:
    """(key, ours, paper) for each key of the published setting that ours names with another value."""
    if not isinstance(published, dict):
        return []
    return [(k, str(ours[k]), str(published[k])) for k in published
            if k in ours and _norm(ours[k]) != _norm(published[k])]


def _norm(value) -> str:
    return str(value).strip().lower().replace(" ", "")


# A claim status, most severe first: (the kind it caps a row at, the kinds it caps, the verdict's words
# for the cap and for the claim)
CAPS = (("failed", "not_reproduced", (*GREEN, "undecided"), "not reproduced", "failed"),
        ("not_measured", "not_measured", (*GREEN, "undecided"), "not yet measured", "not measured"),
        ("absent", "not_measured", (*GREEN, "undecided"), "not yet measured", "is not in this run"),
        ("straddles", "undecided", GREEN, "undecided", "straddles"))


def cap_by_claims(kind: str, verdict: str, names: tuple[str, ...], run: RunFiles) -> tuple[str, str, str]:
    """The row's kind and verdict capped by the statuses of the claims its number rests on, and those
    statuses as a text to show beside the number."""
    if not names:
        return kind, verdict, ""
    statuses = {name: [c["status"] for c in run.claims_named(name)] or ["absent"] for name in names}
    shown = " (claim: " + "; ".join(
        f"{name} {'/'.join(SHOWN[s][1] if s in SHOWN else 'not in this run' for s in ss)}"
        for name, ss in statuses.items()) + ")"
    for status, capped, over, label, why in CAPS:
        hit = [name for name, ss in statuses.items() if status in ss]
        if hit and kind in over:
            return capped, f"{label} (claim {', '.join(hit)} {why}; the number alone: {verdict})", shown
    return kind, verdict, shown


def _oracle(published: dict, ours: Ours | None, run: RunFiles | None) -> dict | None:
    if ours is None or ours.oracle is None or run is None:
        return None
    try:
        got = ours.oracle(run)
    except (KeyError, ValueError, TypeError, IndexError) as exc:  # a table of an unexpected form: shown
        return {"value": math.nan, "text": f"could not be read: {type(exc).__name__}: {exc}"}
    if not got or not math.isfinite(float(got["value"])):
        return None
    text = f"{_fmt(float(got['value']))} ({got.get('setting', 'model')})"
    if "value" in published:
        text += f"; {_off(float(got['value']), float(published['value']))[1].replace('ours', 'model')}"
    return {"value": float(got["value"]), "text": text}


def _mapping(spec: StudySpec | None, items: list[dict], path) -> dict[str, Ours]:
    mapping = dict(spec.paper()) if spec is not None else {}
    ids = {it["id"]: it for it in items}
    for pid, ours in mapping.items():
        if pid not in ids:
            raise PapersError(f"hpcdl/studies/{spec.name}/paper.py maps {pid!r}, which {path} does not list "
                              f"for {spec.name} (its ids: {', '.join(ids)})")
        if ours.value is not None and "value" not in ids[pid]:
            raise PapersError(f"hpcdl/studies/{spec.name}/paper.py: {pid!r} compares a number, but {path} "
                              "gives it only a qualitative statement")
    return mapping


def study_rows(spec: StudySpec | None, study: str, items: list[dict], study_dir: str | Path | None,
               scale: str = "unknown", records_root: str | Path | None = None,
               path: str | Path = PAPERS, why_absent: str = "") -> list[dict]:
    """A study's rows: one per published result in `items` (load()[study])."""
    mapping = _mapping(spec, items, path)
    run = run_files(study_dir) if study_dir is not None else None
    records = gpu_records.study_records(records_root, study) if records_root is not None else []
    rows = []
    for pub in items:
        ours = mapping.get(pub["id"])
        here = evaluate(pub, ours, run, study)
        if run is None and why_absent and here["kind"] == "not_measured":
            here["verdict"] = f"not yet measured ({why_absent})"
        if run is not None:
            here["where"] = f"{scale} scale, measured on {run.device or 'an unknown device'}"
        gpu, oracles = [], []
        own = _oracle(pub, ours, run)
        if own:
            oracles.append({**own, "label": "this run"})
        for r in records:
            folder = Path(records_root) / r["slug"] / study  # its tables lie flat there
            rec = RunFiles(folder, tuple(r["claims"]), r.get("measured_on", ""))
            got = evaluate(pub, ours, rec, study)
            code = r.get("code_summary", "")
            if r.get("code_state", "current") != "current" and got["kind"] in GREEN:
                got = {**got, "kind": "older_code",
                       "verdict": f"older code, not judged (was: {got['verdict']})"}
            code = f"; {code}" if code else ""
            label = f"recorded on {r['gpu']} ({r['date']}, commit {r['commit'][:7]}{code})"
            gpu.append({"label": label, **got})
            recorded = _oracle(pub, ours, rec)
            if recorded:
                oracles.append({**recorded, "label": f"{r['gpu']} record"})
        rows.append({"study": study, "id": pub["id"], "published": pub, "ours": here, "gpu": gpu,
                     "oracle": oracles[0] if oracles else None, "oracles": oracles,
                     "kind": here["kind"], "verdict": here["verdict"]})
    return rows


def rows(results_dir: str | Path, studies: Iterable[str], path: str | Path = PAPERS, scale: str = "unknown",
         records_root: str | Path | None = None) -> list[dict]:
    """Every published result of papers.yaml, one row each, in its order; `studies`: the ones this run's
    config ran (the others' rows say so)."""
    papers = load(path)
    specs, ran = registered(), set(studies)
    out = []
    for study, items in papers.items():
        if study not in specs:
            raise PapersError(f"{path}: {study!r} is not a registered study ({', '.join(specs)})")
        in_run = study in ran
        out += study_rows(specs[study], study, items, Path(results_dir) / study if in_run else None, scale,
                          records_root, path, "" if in_run else "not in this run's config")
    return out


# ---------------------------------------------------------------------------------------------
# HTML (inline styles only: the landing page embeds it raw)

def _paper_cell(pub: dict) -> str:
    if "value" in pub:
        head = f"<b>{float(pub['value']):g}</b> {_E(pub['unit'])}"
    else:
        head = f"<i>{_E(pub['qualitative'])}</i>"
    setting = pub.get("setting")
    setting = "; ".join(f"{k} {v}" for k, v in setting.items()) if isinstance(setting, dict) else setting
    verbatim = f"<br><q>{_E(pub['verbatim'])}</q>" if pub.get("verbatim") else ""
    return (f"{head}{'<br>' + _E(str(setting)) if setting else ''}<br><small class='paper-source' style="
            f"'color:dimgray'>{_E(pub['source'])}{verbatim}</small>")


def _ours_cell(o: dict) -> str:
    extra = [o[k] for k in ("setting", "where") if o.get(k)]
    extra += [f"differs from the paper's: {o['differs']}"] if o.get("differs") else []
    return _E(o["text"]) + "".join(f"<br><small style='color:dimgray'>{_E(x)}</small>" for x in extra)


def _gpu_cell(gpu: list[dict]) -> str:
    if not gpu:
        return "<span style='color:dimgray'>no GPU record yet</span>"
    return "<br>".join(f"<span class='paper-gpu' style='color:steelblue'>{_E(g['label'])}</span>: "
                       f"{_E(g['text'])} <small style='color:{KINDS[g['kind']]}'>({_E(g['verdict'])})</small>"
                       for g in gpu)


def render(rows: list[dict], heading: str = "Paper vs ours", path: str | Path = PAPERS) -> str:
    """The rows as one table (HTML fragment), or a line saying papers.yaml was not found."""
    if not rows:
        return (f"<p id='hpcdl-paper' style='color:dimgray'><b>{_E(heading)}:</b> no published results "
                f"({_E(str(path))}{' lists none' if Path(path).is_file() else ' not found'}).</p>")
    cell = ("padding:3px 6px;vertical-align:top;text-align:left;overflow-wrap:anywhere;"
            "border-top:1px solid #ccc")
    # fixed widths: with automatic ones the short columns collapse to a word per line
    cols = {"study · result": 11, "paper (number, setting, source)": 29, "ours, this run": 21,
            "ours, GPU records": 13, "oracle's prediction": 12, "verdict": 14}
    parts = [f"<table id='hpcdl-paper' style='border-collapse:collapse;font-size:0.8rem;width:100%;"
             f"table-layout:fixed'><caption style='text-align:left;font-weight:bold'>{_E(heading)}: "
             f"{len(rows)} published results, each beside ours (shown only: no model or threshold is fitted "
             "to them)</caption><colgroup>" + "".join(f"<col style='width:{w}%'>" for w in cols.values())
             + "</colgroup><thead><tr>" + "".join(f"<th style='{cell}'>{c}</th>" for c in cols)
             + "</tr></thead><tbody>"]
    for r in rows:
        oracles = r.get("oracles") or ([r["oracle"]] if r.get("oracle") else [])
        oracle = ("<br>".join(f"{_E(o['label'])}: {_E(o['text'])}" if o.get("label") else _E(o["text"])
                              for o in oracles) or "<span style='color:dimgray'>—</span>")
        cells = (f"{_E(r['study'])}<br><b>{_E(r['id'])}</b>", _paper_cell(r["published"]),
                 _ours_cell(r["ours"]), _gpu_cell(r["gpu"]), oracle,
                 f"<b style='color:{KINDS[r['kind']]}'>{_E(r['verdict'])}</b>")
        parts.append(f"<tr class='paper-row' data-study='{_E(r['study'])}' data-paper='{_E(r['id'])}' "
                     f"data-kind='{r['kind']}'>" + "".join(f"<td style='{cell}'>{c}</td>" for c in cells)
                     + "</tr>")
    return "".join(parts) + "</tbody></table>"
