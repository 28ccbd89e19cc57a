"""The report's front page: the verdict of a run, one table for every study (docs/architecture.md, "Report").

Per study: claims passed / total (from `<study>/claims.json`, hpcdl.platform.kit.claims), each failing or
straddling claim with its measured values, each not-measured claim with its reason, each claim the config was
tuned against (its `tuned` notes), what ran (points ok / failed / skipped) and the run's provenance (the raw
tables' `*.provenance.json` sidecars, hpcdl.platform.kit.results). A study without claims.json is shown as
"not run", never left out. A study's committed GPU records (hpcdl.platform.orchestration.gpu_records) are
shown under it, labelled "recorded on <gpu>", and never counted in this run's claims held / total. A study's
count is red when a claim failed, amber when one straddles or is not measured, green when all passed.

Under the table: every published result beside ours (hpcdl.platform.orchestration.paper_vs_ours), then every
claim in one line with its number and a link to its evidence, under a legend of the words
(hpcdl.platform.orchestration.claim_lines).

Pure: reads the results directory, returns data or HTML; the workflow's `verdict` rule writes
`<results>/verdict.html`, which workflows/report/workflow.rst embeds on the report's landing page.
"""

from __future__ import annotations

import argparse
import html
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from hpcdl.platform.kit.atomic import atomic_write_text
from hpcdl.platform.kit.claims import SHOWN
from hpcdl.platform.kit.sidecars import measured_on
from hpcdl.platform.kit.study_dir import RUN_SUMMARY, StudyDir
from hpcdl.platform.orchestration import claim_lines, gpu_records, paper_vs_ours

PROVENANCE_FIELDS = ("git_commit", "config_hash", "host", "cores")
EVIDENCE_CHARS = 400  # measured values shown on the front page; the full evidence is in claims.html


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def points_ran(study_dir: Path) -> dict:
    """Points ok / failed / skipped, and where the counts come from.

    The task app's run_summary.json is authoritative. Without one, ok / failed are counted from the
    raw tables' `status` column (one row per point in most tables, so a point that returned several
    rows counts several times) and skipped is unknown.
    """
    raw = study_dir / "raw"
    summary = _read_json(raw / RUN_SUMMARY)
    if summary is not None and {"ok", "failed", "skipped", "total"} <= set(summary):
        return {k: int(summary[k]) for k in ("ok", "failed", "skipped", "total")} | {"source": RUN_SUMMARY}
    ok = failed = 0
    tables = []
    for csv in sorted(raw.glob("*.csv")):
        try:
            status = pd.read_csv(csv, usecols=["status"])["status"]
        except (ValueError, OSError, pd.errors.EmptyDataError):  # no status column, or empty
            continue
        tables.append(csv.stem)
        ok += int((status == "ok").sum())
        failed += int((status == "failed").sum())
    if not tables:
        return {"ok": None, "failed": None, "skipped": None, "total": None,
                "source": f"unknown: no {RUN_SUMMARY} and no raw table with a status column"}
    return {"ok": ok, "failed": failed, "skipped": None, "total": ok + failed,
            "source": f"rows of raw/{', raw/'.join(t + '.csv' for t in tables)} by status "
                      f"(no {RUN_SUMMARY}; skipped unknown)"}


def run_provenance(study_dir: Path) -> dict:
    """The run's provenance from the raw tables' sidecars (the derived tables' when there are none).

    Each field lists its distinct values (one, unless the raw tables came from different runs);
    `started` / `ended` span all of them.
    """
    records = StudyDir(study_dir).sidecars()
    prov = {f: sorted({str(r[f]) for r in records if f in r}) for f in PROVENANCE_FIELDS}
    starts = [r["start_time"] for r in records if r.get("start_time")]
    ends = [r["end_time"] for r in records if r.get("end_time")]
    prov["started"] = min(starts) if starts else None  # ISO 8601 UTC: string order is time order
    prov["ended"] = max(ends) if ends else None
    prov["sidecars"] = len(records)
    prov["measured_on"] = measured_on(records)
    return prov


def study_verdict(results_dir: str | Path, study: str, title: str | None = None,
                  gpu_records_root: str | Path | None = None) -> dict:
    """A study's verdict on this run; `gpu_records`: its committed GPU records (shown apart, never
    counted in `passed` / `total`)."""
    study_dir = Path(results_dir) / study
    files = StudyDir(study_dir)
    doc = _read_json(files.claims_json)
    verdict = {"study": study, "title": title or study, "ran": points_ran(study_dir),
               "provenance": run_provenance(study_dir),
               "gpu_records": gpu_records.study_records(gpu_records_root, study),
               "claims_page": str(files.claims_html), "about_page": str(files.about_html)}
    if doc is None:
        return verdict | {"state": "not run", "passed": None, "total": None, "failed": [],
                          "straddles": [], "not_measured": [], "tuned": [], "claims": []}
    claims = doc.get("claims", [])
    return verdict | {
        "state": "ran",
        "claims": claims,
        "passed": sum(c["status"] == "passed" for c in claims),
        "total": len(claims),
        "failed": [c for c in claims if c["status"] == "failed"],
        "straddles": [c for c in claims if c["status"] == "straddles"],
        "not_measured": [c for c in claims if c["status"] == "not_measured"],
        "tuned": [c for c in claims if c.get("tuned")],
    }


def verdict(results_dir: str | Path, studies: Iterable[str] | Mapping[str, str],
            gpu_records_root: str | Path | None = None) -> list[dict]:
    """One entry per study, in the given order; `studies` may map each name to its report title;
    `gpu_records_root`: the committed GPU records to show beside this run (none where None)."""
    titles = studies if isinstance(studies, Mapping) else dict.fromkeys(studies)
    return [study_verdict(results_dir, s, t, gpu_records_root) for s, t in titles.items()]


# ---------------------------------------------------------------------------------------------
# HTML (embedded raw in the report's landing page, so inline styles only)

_E = html.escape
# Not <code>: the report's typography styles wrap code in backticks.
_MONO = "<span style='font-family:monospace'>{}</span>"


def _evidence(measured: dict) -> str:
    """Measured values, the failing items of an every-X claim first, cut to EVIDENCE_CHARS."""
    measured = dict(measured)
    lead = ""
    holds = measured.pop("holds", None)
    if isinstance(holds, dict):
        misses = [x for x, ok in holds.items() if not ok]
        lead = f"misses for {', '.join(misses)}; " if misses else ""
    text = lead + json.dumps(measured, separators=(", ", ": "))
    return text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS - 1] + "…"


def _count(n) -> str:
    return "?" if n is None else str(n)


def _ran_line(ran: dict) -> str:
    line = f"ok {_count(ran['ok'])} · failed {_count(ran['failed'])} · skipped {_count(ran['skipped'])}"
    if ran["source"] != RUN_SUMMARY:
        line += f"<br><small style='color:dimgray'>{_E(ran['source'])}</small>"
    return line


def _prov_line(prov: dict) -> str:
    if not prov["sidecars"]:
        return "provenance: none (no table sidecars)"

    def field(name, width=None):
        values = [v[:width] if width else v for v in prov[name]]
        return " / ".join(values) or "?"

    when = (prov["started"] or "?").replace("T", " ").replace("+00:00", " UTC")
    dirty = " (dirty)" if any(v.endswith("-dirty") for v in prov["git_commit"]) else ""
    return (f"commit {_E(field('git_commit', 12))}{dirty}"
            f" · config {_E(field('config_hash', 12))} · host {_E(field('host'))}"
            f" ({_E(field('cores'))} cores) · started {_E(when)}")


def _wall_time(prov: dict) -> str:
    """The run's wall time, from its first sidecar's start to its last one's end."""
    if not (prov["started"] and prov["ended"]):
        return "?"
    seconds = (pd.Timestamp(prov["ended"]) - pd.Timestamp(prov["started"])).total_seconds()
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _gpu_lines(e: dict) -> str:
    """One line per committed GPU record of the study: its claims held / total on that GPU, apart
    from this run's."""
    lines = []
    for r in e.get("gpu_records", []):
        color = "green" if r["passed"] == r["total"] else "firebrick"
        attrs = f"data-gpu='{_E(r['slug'])}' data-passed='{r['passed']}' data-total='{r['total']}'"
        lines.append(f"<div class='gpu-record' {attrs} style='color:steelblue'>"
                     f"{_E(gpu_records.label(r))}: <b style='color:{color}'>{r['passed']}/{r['total']}</b>"
                     " claims held there <small style='color:dimgray'>(not this run: its claims are on the "
                     "study's about page)</small></div>")
    return "".join(lines)


def _gpu_count_line(entries: list[dict]) -> str:
    """How many studies have a GPU record of today's code, and which are missing or on older code
    (nothing where no study has a record: a run without committed records says nothing of them)."""
    if not any(e.get("gpu_records") for e in entries):
        return ""
    current = [e["study"] for e in entries
               if any(r.get("code_state") == "current" for r in e.get("gpu_records", []))]
    stale = [e["study"] for e in entries if e["study"] not in current and e.get("gpu_records")]
    missing = [e["study"] for e in entries if not e.get("gpu_records")]
    rest = ([f"on older code: {', '.join(stale)}"] if stale else []) + \
        ([f"never recorded: {', '.join(missing)}"] if missing else [])
    return (f"<p id='gpu-records-count' data-current='{len(current)}' data-studies='{len(entries)}' "
            f"style='margin:0 0 4px 0;color:steelblue'>GPU records: <b>{len(current)} of {len(entries)}"
            f"</b> studies recorded on a GPU at today's code{' (' + '; '.join(rest) + ')' if rest else ''}"
            "</p>")


def _claim_details(e: dict) -> str:
    """The failing, straddling and not-measured claims of a study, folded under a summary line."""
    items = []
    for status, lead in (("failed", "measured"), ("straddles", "the interval straddles the line")):
        color, word = SHOWN[status]
        for c in e[status]:
            measured = _MONO.format(_E(_evidence(c.get("measured", {}))))
            items.append(f"<div class='claim {status}' data-claim='{_E(c['id'])}'><b style='color:{color}'>"
                         f"{word}</b> {_E(c['statement'])}<br><small>{lead}: {measured}</small></div>")
    for c in e["not_measured"]:
        items.append(f"<div class='claim not_measured' data-claim='{_E(c['id'])}' style='color:dimgray'>"
                     f"<b>NOT MEASURED</b> {_E(c['statement'])}<br>"
                     f"<small><i>{_E(c.get('reason', ''))}</i></small></div>")
    for c in e.get("tuned", []):
        color, word = SHOWN[c["status"]]
        notes = "; ".join(f"{_MONO.format(_E(n['key']))}: {_E(n['why'])}" for n in c["tuned"])
        items.append(f"<div class='claim tuned' data-claim='{_E(c['id'])}'><b>TUNED</b> "
                     f"{_MONO.format(_E(c['id']))} (<span style='color:{color}'>{word}</span>) was seen "
                     f"when the config chose: {notes}</div>")
    if not items:
        return ""
    what = [f"{len(e['failed'])} failing"] if e["failed"] else []
    what += [f"{len(e['straddles'])} straddling"] if e["straddles"] else []
    what += [f"{len(e['not_measured'])} not measured"] if e["not_measured"] else []
    what += [f"{len(e['tuned'])} tuned after seeing it"] if e.get("tuned") else []
    tail = ", or what was tuned" if e.get("tuned") else ""
    return (f"<details><summary>{' and '.join(what)}: what was measured, or why not{tail}</summary>"
            + "".join(items) + "</details>")


# Snakemake's landing page puts this page in a narrow column (max-w-lg) beside the workflow graph,
# inside a pane that centres its content (items-center justify-center): a wide table loses its left
# edge under the navigation, and the navigation is as wide as its longest category title
# (min-w-fit). These rules, scoped by :has() to the page while it shows the verdict, give the
# verdict the pane's width, put the graph below it and let long category titles wrap in a navigation
# of a fifth of the window (a hidden navigation, w-0, has no min-w-fit and stays hidden).
LAYOUT_CSS = (
    "body:has(#hpcdl-verdict) nav.min-w-fit { min-width: 0; width: min(20%, 22rem); flex-shrink: 0; }"
    " body:has(#hpcdl-verdict) nav.min-w-fit * { white-space: normal; }"
    " body:has(#hpcdl-verdict) nav.min-w-fit svg { flex-shrink: 0; }"
    " div.h-screen:has(#hpcdl-verdict) { align-items: flex-start; justify-content: flex-start; }"
    " div.flex.gap-3:has(#hpcdl-verdict) { flex-direction: column; width: 100%; min-width: 0; }"
    " div.py-2:has(#hpcdl-verdict), div.prose:has(#hpcdl-verdict) { max-width: none; width: 100%; }"
    " #hpcdl-verdict { width: 100%; }"
    " #hpcdl-verdict details > summary { cursor: pointer; }"
    " #hpcdl-verdict div.claim { margin: 4px 0 4px 1em; }"
)
COLUMNS = ("study", "claims held / total", "what ran (points)", "measured on", "wall time")


def render_html(entries: list[dict], paper_rows: list[dict] | None = None,
                papers: str | Path = paper_vs_ours.PAPERS) -> str:
    """The verdict table: one <tbody> per study, whose first row is the study at a glance (claims
    held / total, what ran, device, time) and whose second has its provenance and, folded, its
    failing, straddling and not-measured claims. Under it, `paper_rows` (paper_vs_ours.rows; none
    where None), the legend and every claim in one line.

    `data-*` attributes carry the counts for machine checks; the visible text says the same.
    """
    ran_all = [e for e in entries if e["state"] == "ran"]
    passed = sum(e["passed"] for e in ran_all)
    total = sum(e["total"] for e in ran_all)
    cell = "padding:2px 6px;vertical-align:top;text-align:left"
    parts = [
        f"<style>{LAYOUT_CSS}</style>",
        _gpu_count_line(entries),
        "<table id='hpcdl-verdict' style='border-collapse:collapse;font-size:0.85rem;margin:0'>",
        f"<caption style='text-align:left;font-weight:bold'>Verdict: {passed}/{total} claims hold on "
        f"this run ({len(ran_all)} of {len(entries)} studies ran)</caption>",
        "<thead><tr>" + "".join(f"<th style='{cell}'>{c}</th>" for c in COLUMNS) + "</tr></thead>",
    ]
    for e in entries:
        ran, prov = e["ran"], e["provenance"]
        attrs = {"data-study": e["study"], "data-state": e["state"],
                 "data-passed": _count(e["passed"]), "data-total": _count(e["total"]),
                 "data-ok": _count(ran["ok"]), "data-failed": _count(ran["failed"]),
                 "data-skipped": _count(ran["skipped"])}
        parts.append("<tbody class='study' " + " ".join(f"{k}='{_E(v)}'" for k, v in attrs.items()) + ">")
        # The report app's own navigation: opens the study's category and its about page.
        name = (claim_lines.study_link(e["title"], e["about_page"], e["title"]) if e["title"] != e["study"]
                else _E(e["study"]))
        if e["state"] == "not run":
            claims = "<b style='color:dimgray'>not run</b> (no claims.json)"
        else:
            color = claim_lines.worst_color(c["status"] for c in e.get("claims", []))
            claims = f"<b class='claims' style='color:{color}'>{e['passed']}/{e['total']}</b>"
            extra = [f"{len(e['failed'])} failed"] if e["failed"] else []
            extra += [f"{len(e['straddles'])} straddle"] if e["straddles"] else []
            extra += [f"{len(e['not_measured'])} not measured"] if e["not_measured"] else []
            extra += [f"{len(e['tuned'])} tuned"] if e.get("tuned") else []
            claims += f" ({', '.join(extra)})" if extra else ""
        cells = (f"{name} {_MONO.format(_E(e['study']))}", claims, _ran_line(ran),
                 _E(prov.get("measured_on") or "?"), _wall_time(prov))
        parts.append("<tr class='study-row' style='border-top:2px solid #999'>"
                     + "".join(f"<td style='{cell}'>{c}</td>" for c in cells) + "</tr>")
        parts.append(f"<tr class='more'><td colspan='{len(COLUMNS)}' style='{cell}'>"
                     f"<small class='provenance' style='color:dimgray'>{_prov_line(prov)}</small>"
                     f"{_gpu_lines(e)}{_claim_details(e)}</td></tr>")
        parts.append("</tbody>")
    parts.append("</table>")
    if paper_rows is not None:
        parts.append(paper_vs_ours.render(paper_rows, "Paper vs ours", papers))
    parts += [claim_lines.render_legend(), claim_lines.render_lines(entries)]
    return "\n".join(parts) + "\n"


def write_verdict(results_dir: str | Path, studies: Iterable[str] | Mapping[str, str],
                  out: str | Path, gpu_records_root: str | Path | None = None,
                  papers: str | Path = paper_vs_ours.PAPERS, config_files: Iterable[str] = ()) -> Path:
    """verdict.html; `papers`: the published results set beside this run (no section where the file
    is absent), `config_files`: the run's config files (its scale)."""
    entries = verdict(results_dir, studies, gpu_records_root)
    rows = paper_vs_ours.rows(results_dir, [e["study"] for e in entries], papers,
                              paper_vs_ours.scale_of(config_files), gpu_records_root) \
        if Path(papers).is_file() else []
    return atomic_write_text(out, render_html(entries, rows, papers))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcdl verdict", description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu-records", default=None,
                    help="committed GPU records to show beside this run (e.g. resources/gpu-records)")
    ap.add_argument("--papers", default=str(paper_vs_ours.PAPERS),
                    help="published results to set beside this run (default resources/papers.yaml)")
    ap.add_argument("--config-files", nargs="*", default=[], help="the run's config files (its scale)")
    ap.add_argument("studies", nargs="+", help="study names, or name=title")
    args = ap.parse_args(argv)
    studies = dict(s.split("=", 1) if "=" in s else (s, None) for s in args.studies)
    write_verdict(args.results_dir, studies, args.out, args.gpu_records, args.papers, args.config_files)
    return 0
