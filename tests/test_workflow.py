"""A real Snakemake run of every study at test scale, then the HTML report."""

import base64
import html
import json
import os
import re
from pathlib import Path

import pytest
from workflow_run import REPO, snakemake

from hpcdl.platform.kit.claims import SHOWN
from hpcdl.platform.kit.study import registered
from hpcdl.platform.kit.study_dir import StudyDir


@pytest.mark.slow
def test_whole_workflow_and_report(test_scale_workflow):
    # One run and report per session (tests/workflow_run.py), also rendered by tests/test_report.py.
    tmp_path, studies, run = test_scale_workflow.workdir, test_scale_workflow.studies, test_scale_workflow.run
    assert run.returncode == 0, run.stderr[-4000:]
    for study in studies:
        study_dir = tmp_path / "results" / study
        claims = json.loads((study_dir / "claims.json").read_text())
        assert claims["study"] == study and claims["total"] >= 1, claims
        tables = list((study_dir / "tables").glob("*.csv"))
        # Exactly what the study declares (its SPEC): nothing more, nothing less.
        spec = registered()[study]
        assert sorted(p.stem for p in (study_dir / "raw").glob("*.csv")) == sorted(spec.raw_tables), study
        assert sorted(p.stem for p in tables) == sorted(spec.tables), study
        assert sorted(p.stem for p in (study_dir / "figures").glob("*.png")) == sorted(spec.figures), study
        for table in tables:
            assert table.with_name(table.stem + ".provenance.json").exists(), table
        figures = list((study_dir / "figures").glob("*.png"))
        assert figures and all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures), figures

    # A second run has nothing to do: outputs are complete and up to date.
    again = snakemake(tmp_path, "--cores", "2", "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    report, made = test_scale_workflow.report, test_scale_workflow.made
    assert made.returncode == 0, made.stderr[-3000:]
    results = _report_results(report.read_text())
    for study in studies:
        study_dir, spec = tmp_path / "results" / study, registered()[study]
        shown = {Path(k).name: v for k, v in results.items() if study in Path(k).parts}
        for figure in (study_dir / "figures").glob("*.png"):
            entry = shown[figure.name]
            assert _decoded(entry) == figure.read_bytes(), figure
            # The caption opens with the run's part: this run's scale, device and seeds, or "Model".
            run_part = figure.with_name(f"{figure.stem}.run.rst")
            words = run_part.read_text()
            assert words.startswith(("**This run:** test scale",
                                     "**Model, not measured:** computed at test scale")), (figure, words)
            device = StudyDir(study_dir).measured_on()
            assert "configs/test.yaml" in words and device in words, (figure, words)
            _assert_caption(entry, REPO / "workflows" / "report" / study / f"{figure.stem}.rst", run_part)
        entry = shown["claims.html"]
        _assert_caption(entry, REPO / "workflows" / "report" / study / "claims.rst")
        table = _decoded(entry).decode()
        doc = json.loads((study_dir / "claims.json").read_text())
        assert f"{doc['passed']}/{doc['total']} claims hold on this run" in table
        # Claims and the study's opening page say the device from the run's provenance.
        assert doc["measured_on"].startswith("CPU: ") and html.escape(doc["measured_on"]) in table
        about = shown["about.html"]
        _assert_caption(about, REPO / "workflows" / "report" / "about.rst")
        page = _decoded(about).decode()
        assert html.escape(spec.question) in page and html.escape(doc["measured_on"]) in page, page
        assert "configs/test.yaml" in page and spec.headline.replace("_", " ") in page, page
        word = {status: shown_as for status, (_, shown_as) in SHOWN.items()}
        for c in doc["claims"]:
            row = re.search(f"<tr class='{c['status']}'><td>{re.escape(c['id'])}</td>(.*?)</tr>", table)
            assert row and f"<b>{word[c['status']]}</b>" in row.group(1), (c["id"], c["status"])


def _planned_jobs(dry_run_output: str) -> dict[str, int]:
    """Rule -> job count from a dry run's job stats table."""
    stats = dry_run_output.split("Job stats:", 1)[-1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", stats, re.M)
            if m.group(1) != "total"}


@pytest.mark.slow
def test_a_changed_raw_file_reruns_the_stages_that_read_it_and_the_verdict(test_scale_workflow):
    """Every file a rule reads is its input: a newer raw table (or run summary, or provenance sidecar)
    makes Snakemake rerun that study's tables, figures and claims and the verdict, and nothing else."""
    run = test_scale_workflow.run
    assert run.returncode == 0, run.stderr[-4000:]
    study = test_scale_workflow.studies[0]
    raw = test_scale_workflow.results / study / "raw"
    spec = registered()[study]
    for touched in (raw / f"{spec.raw_tables[0]}.csv", raw / "run_summary.json",
                    raw / f"{spec.raw_tables[-1]}.provenance.json"):
        before, content = touched.stat(), touched.read_bytes()
        # Newer than everything derived from it, and changed: Snakemake 9 reruns on a newer input
        # only when its checksum differs from the one recorded.
        touched.write_bytes(content + b"\n")
        try:
            dry = snakemake(test_scale_workflow.workdir, "--cores", "2", "-n")
        finally:
            touched.write_bytes(content)
            os.utime(touched, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert dry.returncode == 0, dry.stderr[-3000:]
        jobs = _planned_jobs(dry.stdout + dry.stderr)
        expected = {f"{study}_tables", f"{study}_figures", f"{study}_claims", f"{study}_about", "verdict",
                    "all"}
        assert set(jobs) == expected, (touched.name, jobs)
    again = snakemake(test_scale_workflow.workdir, "--cores", "2", "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


def _report_results(page: str) -> dict:
    """The report's embedded result list: path -> caption (HTML), data URI, ... (Snakemake's JSON)."""
    found = re.search(r"var results = (\{.*?\});\n", page)
    assert found, "no embedded results in the report"
    return json.loads(found.group(1))


def _decoded(entry: dict) -> bytes:
    header, _, data = entry["data_uri"].partition(",")
    assert header.endswith(";base64"), header
    return base64.b64decode(data)


def _assert_caption(entry: dict, rst: Path, run_part: Path | None = None) -> None:
    """The caption shown is the figure's caption file (its first words after the line that includes the
    run's part, markup removed), under the run's part as the figures stage wrote it (`run_part`)."""
    lines = [ln for ln in rst.read_text().splitlines() if not ln.startswith(".. include::")]
    words = re.sub(r"[`*]", "", "\n".join(lines)).split()[:12]
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", entry["caption"])).split())
    text = re.sub(r" ([,.;:])", r"\1", text)   # a tag removed before punctuation left a space
    assert " ".join(words) in text, (rst.name, text[:300])
    if run_part is not None:
        shown = " ".join(re.sub(r"[`*\\]", "", run_part.read_text()).split())
        assert text.startswith(shown), (rst.name, shown, text[:300])


def test_lint_is_clean(tmp_path):
    run = snakemake(tmp_path, "--lint")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Lints for" not in run.stdout, run.stdout[-3000:]
