"""The report's front page (docs/architecture.md, "Report").

- hpcdl.platform.orchestration.verdict on synthetic results: claims passed / total, failing claims with their
measured values, not-measured claims with their reason, a study without claims.json as "not run", what ran
  from run_summary.json or (without one) from the raw tables' status column, provenance.
- The real report of the test-scale workflow rendered in headless Chromium (slow).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from chromium import Chromium, chromium_or_skip

from hpcdl.platform.kit.claims import STATUSES, claim, not_measured, write_claims
from hpcdl.platform.kit.study import registered
from hpcdl.platform.orchestration.about import ABOUT, CLAIMS, report_label
from hpcdl.platform.orchestration.verdict import EVIDENCE_CHARS, RUN_SUMMARY, main, render_html, verdict

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _sidecar(path: Path, *, start: str, end: str, commit: str = COMMIT, host: str = "node7",
             cores: int = 2, cfg_hash: str = "c0ffee" * 10) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"git_commit": commit, "config_hash": cfg_hash, "host": host,
                                "cores": cores, "start_time": start, "end_time": end}))


@pytest.fixture
def results(tmp_path) -> Path:
    """alpha: 1 pass, 1 fail, 1 not measured, a run summary; beta: all pass, no run summary, two
    raw tables with a status column and one without; gamma: configured but never ran."""
    res = tmp_path / "results"
    write_claims(res / "alpha", "alpha", [
        claim("a1", "async blocks less than sync", True, ratio=0.2, threshold=1.0),
        claim("a2", "bandwidth within 2x of the ceiling", False, ratio=3.7, threshold=2.0),
        not_measured("a3", "DCP scales to 2 ranks", "point dcp-2 failed: rank 1 died"),
    ])
    (res / "alpha" / "raw").mkdir(parents=True)
    (res / "alpha" / "raw" / RUN_SUMMARY).write_text(
        json.dumps({"ok": 7, "failed": 1, "skipped": 4, "total": 12}))
    _sidecar(res / "alpha" / "raw" / "io.provenance.json",
             start="2026-01-02T10:00:00+00:00", end="2026-01-02T10:05:00+00:00")
    _sidecar(res / "alpha" / "raw" / "resume.provenance.json",
             start="2026-01-02T09:59:00+00:00", end="2026-01-02T10:06:00+00:00")

    write_claims(res / "beta", "beta", [claim("b1", "partial-0.1 within 1 pt of global", True, gap=0.3)])
    raw = res / "beta" / "raw"
    raw.mkdir()
    pd.DataFrame({"point": ["p0", "p1", "p2"], "status": ["ok", "failed", "ok"]}).to_csv(
        raw / "points.csv", index=False)
    pd.DataFrame({"run": ["r0", "r1"], "status": ["ok", "ok"]}).to_csv(raw / "runs.csv", index=False)
    pd.DataFrame({"epoch": [0, 1], "acc": [0.5, 0.6]}).to_csv(raw / "epochs.csv", index=False)
    _sidecar(raw / "points.provenance.json", start="2026-01-03T08:00:00+00:00",
             end="2026-01-03T08:01:00+00:00", host="laptop", cores=4)
    return res


def test_counts_claims_and_points(results):
    alpha, beta, gamma = verdict(results, ["alpha", "beta", "gamma"])
    assert (alpha["state"], alpha["passed"], alpha["total"]) == ("ran", 1, 3)
    assert [c["id"] for c in alpha["failed"]] == ["a2"]
    assert [c["id"] for c in alpha["not_measured"]] == ["a3"]
    assert alpha["ran"] == {"ok": 7, "failed": 1, "skipped": 4, "total": 12, "source": RUN_SUMMARY}
    assert (beta["passed"], beta["total"], beta["failed"], beta["not_measured"]) == (1, 1, [], [])
    # No run summary: 4 ok + 1 failed rows over the two tables that have a status column.
    assert {k: beta["ran"][k] for k in ("ok", "failed", "skipped", "total")} == \
        {"ok": 4, "failed": 1, "skipped": None, "total": 5}
    assert "raw/points.csv" in beta["ran"]["source"] and "raw/runs.csv" in beta["ran"]["source"]
    assert "epochs" not in beta["ran"]["source"]
    assert gamma["state"] == "not run" and gamma["passed"] is None and gamma["ran"]["ok"] is None


def test_provenance_spans_the_raw_sidecars(results):
    alpha, beta, gamma = verdict(results, ["alpha", "beta", "gamma"])
    prov = alpha["provenance"]
    assert prov["git_commit"] == [COMMIT] and prov["host"] == ["node7"] and prov["cores"] == ["2"]
    assert (prov["started"], prov["ended"]) == ("2026-01-02T09:59:00+00:00", "2026-01-02T10:06:00+00:00")
    assert beta["provenance"]["host"] == ["laptop"] and beta["provenance"]["cores"] == ["4"]
    assert gamma["provenance"]["sidecars"] == 0


def _tbody(page: str, study: str) -> str:
    found = re.search(rf"<tbody class='study' data-study='{study}'.*?</tbody>", page, re.S)
    assert found, f"no row group for {study}"
    return found.group(0)


def test_html_table(results):
    page = render_html(verdict(results, {"alpha": "Alpha study", "beta": None, "gamma": "Gamma"}))
    assert "Verdict: 2/4 claims hold on this run (2 of 3 studies ran)" in page
    alpha = _tbody(page, "alpha")
    assert "data-passed='1' data-total='3'" in alpha
    assert "<b class='claims' style='color:firebrick'>1/3</b> (1 failed, 1 not measured)" in alpha
    assert "ok 7 · failed 1 · skipped 4" in alpha
    assert "commit 0123456789ab" in alpha and "host node7 (2 cores)" in alpha
    assert "started 2026-01-02 09:59:00 UTC" in alpha
    # The failing claim: statement and measured values; the not-measured one: statement and reason.
    failed = re.search(r"<div class='claim failed' data-claim='a2'>.*?</div>", alpha, re.S).group(0)
    assert "bandwidth within 2x of the ceiling" in failed and "&quot;ratio&quot;: 3.7" in failed
    nm = re.search(r"<div class='claim not_measured' data-claim='a3'[^>]*>.*?</div>", alpha, re.S).group(0)
    assert "NOT MEASURED" in nm and "point dcp-2 failed: rank 1 died" in nm
    # Folded under one line that says how many of each.
    assert "<details><summary>1 failing and 1 not measured: what was measured, or why not</summary>" in alpha
    # At a glance: the device from the sidecars (no cpu_model in these: an older run) and the wall time.
    row = re.search(r"<tr class='study-row'.*?</tr>", alpha, re.S).group(0)
    assert ">CPU: unknown model (2 cores)</td>" in row
    assert ">7.0 min</td>" in row
    assert "data-claim='a1'" not in alpha  # passing claims are counted, not listed
    # A study's title opens its report category and its about page through the report app, in one
    # state update (its category alone where the report has no such page).
    link = re.search(r"<a href='(javascript:[^']*)' data-about='([^']*)'>Alpha study</a>", alpha)
    assert link and link.group(2) == str(results / "alpha" / "about.html")
    js = html.unescape(link.group(1))
    assert js.count("app.setView(") == 1 and "category:\"Alpha study\"" in js and "content:'html'" in js
    assert js.endswith(":app.showCategory(\"Alpha study\"))")

    beta = _tbody(page, "beta")
    assert "color:green'>1/1</b>" in beta and "ok 4 · failed 1 · skipped ?" in beta
    assert "<details>" not in beta and ">1.0 min</td>" in beta  # nothing to unfold
    assert "no run_summary.json; skipped unknown" in beta

    gamma = _tbody(page, "gamma")
    assert "data-state='not run'" in gamma and "not run</b> (no claims.json)" in gamma
    assert "ok ? · failed ? · skipped ?" in gamma and "provenance: none" in gamma


def test_every_claim_names_its_misses_and_long_evidence_is_cut(tmp_path):
    res = tmp_path / "results"
    write_claims(res / "s", "s", [
        claim("e", "every format within 2x", False, holds={"torch": True, "npz": False, "hdf5": False},
              missing={}, trace=list(range(500)))])
    page = render_html(verdict(res, ["s"]))
    shown = re.search(r"measured: <span style='font-family:monospace'>(.*?)</span>", page).group(1)
    assert shown.startswith("misses for hdf5, npz; ")  # claims.json sorts keys
    assert shown.endswith("…") and len(shown.replace("&quot;", '"')) == EVIDENCE_CHARS


def test_cli_writes_the_page(results, tmp_path):
    out = tmp_path / "verdict.html"
    main(["--results-dir", str(results), "--out", str(out), "alpha=Alpha study", "gamma"])
    page = out.read_text()
    assert page.startswith("<style>") and "<table id='hpcdl-verdict'" in page and "Alpha study" in page
    assert "data-study='gamma'" in page and "data-study='beta'" not in page


# ---------------------------------------------------------------------------------------------
# The real report in a real browser

# The verdict rows as rendered, once the report app has run (null until then).
VERDICT_ROWS = """(() => {
  const table = document.querySelector('#hpcdl-verdict');
  if (!table || typeof app === 'undefined' || !app) return null;
  return {
    top: table.getBoundingClientRect().top,
    rows: [...table.querySelectorAll('tbody.study')].map(b => ({
      study: b.dataset.study, text: b.textContent, shown: b.querySelector('tr.study-row').innerText,
      failing: [...b.querySelectorAll('div.claim.failed')].map(r => r.dataset.claim),
      unmeasured: [...b.querySelectorAll('div.claim.not_measured')].map(r => r.dataset.claim)})),
  };
})()"""

# Where the landing page puts the verdict, the report's navigation and the workflow graph.
LAYOUT = """(() => {
  const box = el => { if (!el) return null; const b = el.getBoundingClientRect();
                      return {left: b.left, right: b.right, top: b.top, bottom: b.bottom, width: b.width}; };
  const table = document.querySelector('#hpcdl-verdict');
  return {table: box(table), pane: box(table.closest('div.h-screen')),
          nav: box(document.querySelector('nav')), graph: box(document.querySelector('#rulegraph')),
          window: window.innerWidth};
})()"""

# The results listed in the navbar after a category is opened: [path, ...] (null until shown).
LISTED = """(() => {
  const rows = [...document.querySelectorAll('table.table-auto tbody tr')];
  return rows.length ? rows.map(r => r.querySelector('td').innerText.trim()) : null;
})()"""


@pytest.fixture(scope="session")
def chromium_exe() -> str:
    return chromium_or_skip()


def _expected_points(study_dir: Path) -> str:
    summary = study_dir / "raw" / RUN_SUMMARY
    if summary.exists():
        n = json.loads(summary.read_text())
        return f"ok {n['ok']} · failed {n['failed']} · skipped {n['skipped']}"
    statuses = [pd.read_csv(f)["status"] for f in (study_dir / "raw").glob("*.csv")
                if "status" in pd.read_csv(f, nrows=0).columns]
    ok = sum(int((s == "ok").sum()) for s in statuses)
    failed = sum(int((s == "failed").sum()) for s in statuses)
    return f"ok {ok} · failed {failed} · skipped ?"


@pytest.mark.slow
def test_report_opens_on_the_verdict_in_chromium(chromium_exe, test_scale_workflow, tmp_path):
    """chromium_exe first: without a browser the test skips before the workflow runs."""
    wf = test_scale_workflow
    assert wf.run.returncode == 0, wf.run.stderr[-4000:]
    assert wf.made.returncode == 0, wf.made.stderr[-3000:]
    browser = Chromium(chromium_exe, tmp_path / "profile")
    try:
        browser.navigate(wf.report.as_uri())
        page = browser.wait_for(VERDICT_ROWS, what="the report app and its verdict table")
        shot = browser.screenshot(wf.results / "report.png")

        # The first thing on the landing page, in view without scrolling, every study in order.
        assert 0 <= page["top"] < 200, page["top"]
        assert [r["study"] for r in page["rows"]] == wf.studies
        for row in page["rows"]:
            study_dir = wf.results / row["study"]
            doc = json.loads((study_dir / "claims.json").read_text())
            # One line at a glance: claims held / total, what ran, the device and the wall time.
            assert f"{doc['passed']}/{doc['total']}" in row["shown"], row
            assert _expected_points(study_dir) in row["shown"], row
            assert doc["measured_on"] in row["shown"] and re.search(r"\d+(\.\d)? (s|min)$", row["shown"]), row
            ids = {s: [c["id"] for c in doc["claims"] if c["status"] == s] for s in STATUSES[1:]}
            assert (row["failing"], row["unmeasured"]) == (ids["failed"], ids["not_measured"]), row
            for c in doc["claims"]:
                if c["status"] == "failed":
                    assert c["statement"] in row["text"], c["id"]
                if c["status"] == "not_measured":
                    assert c["reason"] in row["text"], c["id"]
            prov = json.loads(next((study_dir / "raw").glob("*.provenance.json")).read_text())
            assert f"commit {prov['git_commit'][:12]}" in row["text"], row
            assert f"host {prov['host']} ({prov['cores']} cores)" in row["text"], row

        # Each study's link opens its category: its about page, its headline figure, the other figures,
        # its claims, in that order; each figure shows.
        embedded = browser.evaluate("results")
        for study in wf.studies:
            spec = registered()[study]
            browser.navigate(wf.report.as_uri())
            browser.wait_for(VERDICT_ROWS, what="the verdict table")
            browser.evaluate(f"document.querySelector('tbody.study[data-study=\"{study}\"] a').click()")
            listed = browser.wait_for(LISTED, what=f"the results of {study}'s category")
            figures = sorted(p.stem for p in (wf.results / study / "figures").glob("*.png"))
            assert figures, study
            others = sorted(report_label(spec, f) for f in figures if f != spec.headline)
            assert listed[:2] == [report_label(spec, ABOUT), report_label(spec, spec.headline)], listed
            assert listed[-1] == report_label(spec, CLAIMS) and sorted(listed[2:-1]) == others, listed
            paths = {entry["labels"]["item"]: path for path, entry in embedded.items()
                     if f"/{study}/" in path}
            for label in listed:
                path = paths[label]
                if not path.endswith(".png"):
                    continue
                browser.evaluate(f"""[...document.querySelectorAll('table.table-auto tbody tr')]
                    .find(r => r.querySelector('td').innerText.trim() === {json.dumps(label)})
                    .querySelector('a').click()""")
                browser.wait_for(f"""[...document.images].some(img => img.complete && img.naturalWidth > 0
                    && img.src === results[{json.dumps(path)}].data_uri)""", timeout=20,
                                 what=f"{path} displayed")
    finally:
        browser.close()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 1920])
def test_the_verdict_uses_the_page_width_beside_the_navigation(chromium_exe, test_scale_workflow, tmp_path,
                                                                 width):
    """At the widths a reader's screen has, the verdict takes the content pane's width, starts right
    of the report's navigation, and the workflow graph comes below it; a screenshot of each width is
    kept beside the report."""
    wf = test_scale_workflow
    assert wf.made is not None and wf.made.returncode == 0, wf.run.stderr[-3000:]
    browser = Chromium(chromium_exe, tmp_path / "profile", width=width, height=1000)
    try:
        browser.navigate(wf.report.as_uri())
        browser.wait_for(VERDICT_ROWS, what="the report app and its verdict table")
        shot = browser.screenshot(wf.report.with_name(f"report-{width}.png"))
        layout = browser.evaluate(LAYOUT)
    finally:
        browser.close()
    table, pane, nav, graph = layout["table"], layout["pane"], layout["nav"], layout["graph"]
    assert layout["window"] == width, layout
    # The navigation keeps to a fifth of the window; the verdict fills what is left beside it.
    assert nav["width"] <= 0.25 * width, layout
    assert table["width"] >= 0.8 * pane["width"] and table["width"] >= 0.8 * (width - nav["right"]), layout
    assert table["left"] >= nav["right"] and table["right"] <= width, layout
    assert graph is not None and graph["top"] >= table["bottom"], layout
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_tuned_claim_is_shown_with_its_key_and_why(tmp_path):
    res = tmp_path / "results"
    notes = [{"key": "kakurenbo.world_size", "claims": ["k"], "why": "2 -> 1 after seeing it fail"}]
    write_claims(res / "s", "s", [claim("k", "saves time", True, saving=0.1), claim("o", "other", True)],
                 ["k", "o"], notes)
    doc = json.loads((res / "s" / "claims.json").read_text())
    assert doc["claims"][0]["tuned"] == [{"key": "kakurenbo.world_size",
                                          "why": "2 -> 1 after seeing it fail"}]
    assert "tuned" not in doc["claims"][1]
    shown = (res / "s" / "claims.html").read_text()
    assert "after seeing this claim: <code>kakurenbo.world_size</code>" in shown
    page = render_html(verdict(res, ["s"]))
    assert "2/2</b> (1 tuned)" in page
    assert re.search(r"class='claim tuned' data-claim='k'.*kakurenbo\.world_size.*2 -&gt; 1 after", page)
    with pytest.raises(ValueError, match="'tuned\\[0\\].claims': 'nope' is not a claim of the study"):
        write_claims(res / "s", "s", [claim("k", "saves time", True)], ["k"],
                     [{**notes[0], "claims": ["nope"]}])
