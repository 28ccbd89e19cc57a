"""The page that opens each study's category in the report (docs/architecture.md, "Report"):
the study's published results beside ours (hpcdl.platform.paper_vs_ours: its rows of
resources/papers.yaml, through the study's declared mapping), then three sentences from the study's
declaration and this run's provenance, rendered by the platform.

    the seed's question (StudySpec.question);
    this run's setting: the config files, the sizes (StudySpec.setting) and the device measured on;
    which figure answers the question (StudySpec.headline, listed first after this page).

Under them, each committed GPU record of the study (hpcdl.platform.gpu_records) as a table of its
claims, headed "recorded on <gpu> (<date>, commit <sha>)": what a GPU measured, beside this run.

`report_label` orders a category's entries: this page, the headline figure, the other figures,
the claims (the report sorts entries by their labels).
"""

from __future__ import annotations

import html
from pathlib import Path

from hpcdl.platform import gpu_records, paper_vs_ours
from hpcdl.platform.claims import SHOWN
from hpcdl.platform.results import atomic_write_text, study_measured_on
from hpcdl.platform.study import StudySpec

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


def sentences(spec: StudySpec, cfg: dict, study_dir: str | Path, config_files: list[str]) -> list[str]:
    """The three sentences (plain text) that introduce a study's run."""
    device = study_measured_on(study_dir) or "an unknown device (no provenance sidecars)"
    files = ", ".join(config_files) or "the config given to the task app"
    sizes = spec.setting(cfg)
    question = spec.question or f"{spec.title}: the study declares no question (StudySpec.question)."
    setting = f"This run: {files} (results in {cfg['results_dir']}); {sizes + '; ' if sizes else ''}" \
              f"measured on {device}."
    if spec.headline:
        answer = (f"The figure '{spec.headline.replace('_', ' ')}' answers it: it comes first below, "
                  "then the other figures and the claims, each with what to look for.")
    else:
        answer = "The study names no headline figure (StudySpec.headline): its figures follow."
    return [question, setting, answer]


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
               gpu_records_root: str | Path | None, papers: str | Path = paper_vs_ours.PAPERS) -> str:
    """The study's paper-vs-ours table (HTML), or a line saying why there is none."""
    items = paper_vs_ours.load(papers).get(spec.name, []) if Path(papers).is_file() else []
    rows = paper_vs_ours.study_rows(spec, spec.name, items, study_dir, paper_vs_ours.scale_of(config_files),
                                    gpu_records_root, papers)
    return paper_vs_ours.render(rows, f"{spec.name}: paper vs ours", papers)


def render(spec: StudySpec, cfg: dict, study_dir: str | Path, config_files: list[str],
           records: list[dict] = (), paper: str = "") -> str:
    """The page; `paper`: the study's paper-vs-ours table (`paper_rows`), which opens it."""
    question, setting, answer = (html.escape(s) for s in sentences(spec, cfg, study_dir, config_files))
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(spec.title)}</title></head>"
            "<body style='font-family:sans-serif;max-width:60em;line-height:1.5'>"
            f"<h2>{html.escape(spec.title)}</h2>{paper}"
            f"<p class='question'><b>Question.</b> {question}</p>"
            f"<p class='setting'><b>Setting.</b> {setting}</p>"
            f"<p class='answer'><b>Answer.</b> {answer}</p>{gpu_tables(records)}</body></html>\n")


def write(spec: StudySpec, cfg: dict, study_dir: str | Path, config_files: list[str],
          gpu_records_root: str | Path | None = None, papers: str | Path = paper_vs_ours.PAPERS) -> Path:
    """about.html; `gpu_records_root`: the committed GPU records (default: the config's,
    `gpu_records.records_root`); `papers`: the published results (resources/papers.yaml)."""
    root = gpu_records_root if gpu_records_root is not None else gpu_records.records_root(cfg)
    page = render(spec, cfg, study_dir, config_files, gpu_records.study_records(root, spec.name),
                  paper_rows(spec, study_dir, config_files, root, papers))
    return atomic_write_text(Path(study_dir) / f"{ABOUT}.html", page)
