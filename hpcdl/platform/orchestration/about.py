"""The page that opens each study in the report (docs/architecture.md, "Report"), rendered by the
platform from the study's declaration and this run's files:

    the study's full title (the menu lists its short title, StudySpec.category);
    the question (StudySpec.question);
    the answer: one sentence computed from this run's claims (claims.json), naming the scale and
    the device, and one from its paper-vs-ours rows (how many published results reproduced);
    the headline figure (StudySpec.headline), embedded, with its caption (the run's part and what to
    look at, hpcdl.platform.orchestration.captions);
    this run's setting: config files and scale, the sizes (StudySpec.setting), the seeds and device;
    this run's claims, one row each as the landing page's claim lines show them
    (hpcdl.platform.orchestration.claim_lines): the status word with the TUNED mark, its number, its
    confirmation (on which seeds it was judged, unseen or not, or why no seed decides it) and each
    `tuned` note (the config key and why);
    which paper figure each of ours re-draws, and what differs (StudySpec.paper_figures), and the
    paper figures declared to have no counterpart here, with why;
    the study's published results beside ours (hpcdl.platform.orchestration.paper_vs_ours: its rows
    of resources/papers.yaml, through the study's declared mapping);
    each committed GPU record of the study (hpcdl.platform.orchestration.gpu_records) as a table of its
    claims, headed "recorded on <gpu> (<date>, commit <sha>)": what a GPU measured, beside this run.

The page is self-contained (the report shows it in an iframe from a data: URI, where a relative link
to the figure resolves nowhere), so the figure is embedded as a data: URI too. Its stylesheet keeps
the text to a readable measure and lets the figure take the frame's width.

`report_label` orders a category's entries: this page, the headline figure, the other figures,
the claims (the report sorts entries by their labels).
"""

from __future__ import annotations

import base64
import html
import json
import struct
from pathlib import Path

from hpcdl.platform.kit.atomic import atomic_write_text
from hpcdl.platform.kit.claims import SHOWN, _tuned_html
from hpcdl.platform.kit.study import StudySpec
from hpcdl.platform.kit.study_dir import StudyDir
from hpcdl.platform.orchestration import captions, gpu_records, paper_vs_ours
from hpcdl.platform.orchestration.claim_lines import AMBER, TUNED, UNSEEN, _confirmation, readable

ABOUT = "about"  # <study_dir>/about.html
CLAIMS = "claims"  # <study_dir>/claims.html


def report_label(spec: StudySpec, item: str) -> str:
    """The label of a study's report entry (`item`: ABOUT, CLAIMS or a figure name); the report
    lists a category's entries in label order."""
    if item == ABOUT:
        return "0 · about this study"
    if item == CLAIMS:
        return "3 · claims"
    if item not in spec.figures:
        raise ValueError(f"study {spec.name} has no figure {item!r}; figures: {', '.join(spec.figures)}")
    return f"{1 if item == spec.headline else 2} · {item.replace('_', ' ')}"


def claims_of(study_dir: str | Path) -> dict | None:
    """This run's claims.json, or None where the claims stage has not written one."""
    try:
        return json.loads(StudyDir(study_dir).claims_json.read_text())
    except (OSError, ValueError):
        return None


# how the answer names the claims that did not pass, in this order
NOT_PASSED = (("failed", "failed"), ("straddles", "undecided (the interval straddles the threshold)"),
              ("not_measured", "not measured"))


def claims_answer(doc: dict | None, scale: str, device: str) -> str:
    """One sentence from this run's claims: how many hold, which, and which did not and how."""
    if doc is None or not isinstance(doc.get("claims"), list):
        return "No answer from this run yet: the study has no claims.json (its claims stage has not run)."
    claims = doc["claims"]
    ids = {status: [c["id"] for c in claims if c.get("status") == status]
           for status in ("passed", *(s for s, _ in NOT_PASSED))}
    held = f"On this run ({scale}, {device}) {len(ids['passed'])} of {len(claims)} claims hold"
    parts = [f"{held}: {', '.join(ids['passed'])}" if ids["passed"] else held]
    parts += [f"{word}: {', '.join(ids[status])}" for status, word in NOT_PASSED if ids[status]]
    return "; ".join(parts) + "."


# paper-vs-ours verdict kinds, as the answer counts them (context rows are settings, not results)
PAPER_WORDS = (("within", "reproduced within its tolerance"), ("reproduced", "reproduced in direction"),
               ("undecided", "undecided"), ("not_reproduced", "not reproduced"),
               ("unreproducible", "not reproducible on this hardware"), ("not_measured", "not yet measured"))


def paper_answer(rows: list[dict]) -> str:
    """One sentence from the study's paper-vs-ours rows: how the published results fared."""
    results = [r for r in rows if r["kind"] != "context"]
    if not results and rows:
        return (f"Its papers state {len(rows)} setting(s) or scope(s) but no result to compare with ours "
                "(the table below).")
    if not results:
        return "The study's papers publish no result to set beside ours (resources/papers.yaml)."
    counts = [f"{n} {word}" for kind, word in PAPER_WORDS if (n := sum(r["kind"] == kind for r in results))]
    return f"Of its papers' {len(results)} published results: {', '.join(counts)} (the table below)."


def setting_text(spec: StudySpec, cfg: dict, facts: dict) -> str:
    """This run's setting in one sentence: config files and scale, sizes, seeds, device."""
    sizes = spec.setting(cfg)
    return (f"{facts['scale']}, results in {cfg.get('results_dir', '?')}; {sizes + '; ' if sizes else ''}"
            f"seeds: {facts['seeds']}; measured on {facts['device']}.")


def _figure_width(png: bytes) -> str:
    """The headline figure's CSS width in the page (the report's frame, about three quarters of the
    window beside the menu): the frame's width where the figure then fits 85 % of its height, else
    no less than 82 % of it (over 60 % of the window) and otherwise as wide as fits that height. A
    PNG's size is in its IHDR chunk, bytes 16-24."""
    width, height = struct.unpack(">II", png[16:24]) if png[:8] == b"\x89PNG\r\n\x1a\n" else (4, 3)
    return f"min(100%, max(82vw, calc(85vh * {width / max(1, height):.3f})))"


def headline_figure(spec: StudySpec, study_dir: str | Path) -> str:
    """The headline figure, embedded (a data: URI), with its caption; or why it is not shown."""
    if not spec.headline:
        return "<p class='headline-missing'>The study names no headline figure (StudySpec.headline).</p>"
    png = Path(study_dir) / "figures" / f"{spec.headline}.png"
    if not png.is_file():
        return (f"<p class='headline-missing'>The headline figure {html.escape(spec.headline)} has not been "
                "drawn (the figures stage has not run).</p>")
    raw = png.read_bytes()
    data = base64.b64encode(raw).decode("ascii")
    return (f"<figure class='headline' data-figure='{html.escape(spec.headline)}'>"
            f"<img src='data:image/png;base64,{data}' alt='{html.escape(spec.headline.replace('_', ' '))}' "
            f"style='width:{_figure_width(raw)}'>"
            f"<figcaption>{captions.html_caption(spec, study_dir, spec.headline)}</figcaption></figure>")


# the landing line's mark of a claim the config was tuned against (claim_lines.render_lines)
TUNED_MARK = " <b title='tuned after seeing it'>· TUNED</b>"


def claims_table(doc: dict | None) -> str:
    """This run's claims (claims.json), one row each as the landing page's claim lines show them: the
    status word with the TUNED mark, the claim (its statement on hover), its number
    (claim_lines.readable) with its confirmation under it (claim_lines' line of
    hpcdl.platform.kit.confirmation.describe) and each `tuned` note, the key and why (as the claims
    page words it); "" where the run has no claims."""
    if doc is None or not isinstance(doc.get("claims"), list) or not doc["claims"]:
        return ""
    e = html.escape
    rows = []
    for c in doc["claims"]:
        color, word = SHOWN[c["status"]]
        color = AMBER if c["status"] == "not_measured" else color
        rows.append(f"<tr class='run-claim {c['status']}' data-run-claim='{e(c['id'])}' "
                    f"data-status='{c['status']}'>"
                    f"<td style='color:{color};white-space:nowrap'><b>{word}</b>"
                    f"{TUNED_MARK if c.get('tuned') else ''}</td>"
                    f"<td title='{e(c.get('statement', ''))}'>{e(c['id'])}</td>"
                    f"<td>{e(readable(c))}{_confirmation(c)}{_tuned_html(c)}</td></tr>")
    return ("<h2 id='run-claims'>This run's claims</h2>"
            "<table class='run-claims' border='1' cellpadding='4' style='border-collapse:collapse'>"
            "<tr><th>result</th><th>claim</th><th>measured; where it was confirmed</th></tr>"
            + "".join(rows) + "</table>"
            f"<p class='claims-legend'><small><b>TUNED</b>: {e(TUNED)}. <b>confirmed on unseen seeds</b>: "
            f"{e(UNSEEN)}.</small></p>")


def paper_figures(spec: StudySpec) -> str:
    """Which paper figure each of the study's figures re-draws, and what differs (StudySpec.paper_figures),
    one row per figure, in the order of `figures`; then the paper figures declared to have no
    counterpart here, with why."""
    e = html.escape
    declared = dict(spec.paper_figures)
    rows = "".join(
        f"<tr class='figure-source' data-our-figure='{e(f)}'><td>{e(f.replace('_', ' '))}</td>"
        f"<td>{e(declared.get(f) or 'not declared (StudySpec.paper_figures)')}</td></tr>"
        for f in spec.figures)
    unmatched = [k for k in declared if k not in spec.figures]
    none_here = ("<p>Paper figures with no counterpart here:</p><ul class='paper-figures-unmatched'>"
                 + "".join(f"<li data-paper-figure='{e(k)}'><b>{e(k)}</b>: {e(declared[k])}</li>"
                           for k in unmatched) + "</ul>") if unmatched else ""
    return ("<h2 id='paper-figures'>Figures and the paper figures they re-draw</h2>"
            "<table class='paper-figures' border='1' cellpadding='4' style='border-collapse:collapse'>"
            "<tr><th>our figure</th><th>paper figure; what differs in our axes or setting</th></tr>"
            f"{rows}</table>{none_here}")


def gpu_tables(records: list[dict]) -> str:
    """One table per recorded GPU run of the study (`gpu_records.study_records`): id, status and
    measured values of each claim, under its label."""
    parts = []
    for r in records:
        rows = []
        for c in r["claims"]:
            color, word = SHOWN[c["status"]]
            rows.append(f"<tr class='{c['status']}' data-claim='{html.escape(c['id'])}'>"
                        f"<td>{html.escape(c['id'])}</td><td style='color:{color}'><b>{word}</b></td>"
                        f"<td><small>{html.escape(gpu_records.measured_text(c))}</small></td></tr>")
        parts.append(f"<h3 class='gpu-record' data-gpu='{html.escape(r['slug'])}'>"
                     f"{html.escape(gpu_records.label(r))}</h3>"
                     f"<p>{r['passed']}/{r['total']} claims held on that GPU: a committed record "
                     "(resources/gpu-records), not part of this run's verdict.</p>"
                     "<table border='1' cellpadding='4' style='border-collapse:collapse'>"
                     "<tr><th>claim</th><th>result</th><th>measured</th></tr>" + "".join(rows) + "</table>")
    return "".join(parts)


def paper_rows(spec: StudySpec, study_dir: str | Path, config_files: list[str],
               gpu_records_root: str | Path | None,
               papers: str | Path = paper_vs_ours.PAPERS) -> list[dict] | None:
    """The study's paper-vs-ours rows (paper_vs_ours.study_rows); None where papers.yaml is absent (the
    page then has no such section)."""
    if not Path(papers).is_file():
        return None
    items = paper_vs_ours.load(papers).get(spec.name, [])
    return paper_vs_ours.study_rows(spec, spec.name, items, study_dir, paper_vs_ours.scale_of(config_files),
                                    gpu_records_root, papers)


# The page's own style: text at a readable measure, the figure as wide as the frame.
STYLE = ("body{font-family:sans-serif;line-height:1.5;margin:0.6rem 1rem;color:#1e293b}"
         "h1{font-size:1.35rem;margin:0.2rem 0 0.6rem}"
         "p.question,p.answer,p.setting,figcaption{max-width:62rem}"
         "figure.headline{margin:0.8rem 0;width:100%}"
         "figure.headline img{display:block;height:auto;border:1px solid #e2e8f0}"
         "figcaption{font-size:0.85rem;color:#334155}figcaption p{margin:0.3rem 0}"
         "table{max-width:100%}table.run-claims,table.paper-figures{font-size:0.85rem;max-width:62rem}"
         "table.run-claims td,table.paper-figures td{vertical-align:top;overflow-wrap:anywhere}"
         "h2{font-size:1.1rem;margin:1rem 0 0.4rem}")


def render(spec: StudySpec, cfg: dict, study_dir: str | Path, config_files: list[str],
           records: list[dict] = (), rows: list[dict] | None = None,
           papers: str | Path = paper_vs_ours.PAPERS) -> str:
    """The page; `rows`: the study's paper-vs-ours rows (`paper_rows`; None: no such section)."""
    facts = captions.facts(spec, cfg, study_dir, config_files)
    scale = f"{paper_vs_ours.scale_of(config_files)} scale"
    question = spec.question or f"{spec.title}: the study declares no question (StudySpec.question)."
    doc = claims_of(study_dir)
    answer = claims_answer(doc, scale, facts["device"])
    if rows is not None:
        answer += " " + paper_answer(rows)
    paper = paper_vs_ours.render(rows, f"{spec.name}: paper vs ours", papers) if rows is not None else ""
    e = html.escape
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{e(spec.title)}</title><style>{STYLE}</style></head><body>"
            f"<h1 class='study-title' data-study='{e(spec.name)}'>{e(spec.title)}</h1>"
            f"<p class='question'><b>Question.</b> {e(question)}</p>"
            f"<p class='answer'><b>Answer.</b> {e(answer)}</p>"
            f"{headline_figure(spec, study_dir)}"
            f"<p class='setting'><b>Setting.</b> {e(setting_text(spec, cfg, facts))}</p>"
            f"{claims_table(doc)}{paper_figures(spec)}{paper}{gpu_tables(records)}</body></html>\n")


def write(spec: StudySpec, cfg: dict, study_dir: str | Path, config_files: list[str],
          gpu_records_root: str | Path | None = None, papers: str | Path = paper_vs_ours.PAPERS) -> Path:
    """about.html; `gpu_records_root`: the committed GPU records (default: the config's,
    `gpu_records.records_root`); `papers`: the published results (resources/papers.yaml)."""
    root = gpu_records_root if gpu_records_root is not None else gpu_records.records_root(cfg)
    page = render(spec, cfg, study_dir, config_files, gpu_records.study_records(root, spec.name),
                  paper_rows(spec, study_dir, config_files, root, papers), papers)
    return atomic_write_text(Path(study_dir) / f"{ABOUT}.html", page)
