"""The report's front page (DESIGN.md §4 "The report opens on the verdict").

- hpcdl.verdict on synthetic results: claims passed / total, failing claims with their measured
  values, not-measured claims with their reason, a study without claims.json as "not run", what ran
  from run_summary.json or (without one) from the raw tables' status column, provenance.
- The real report of the test-scale workflow rendered in headless Chromium (slow).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from hpcdl.claims import claim, not_measured, write_claims
from hpcdl.verdict import EVIDENCE_CHARS, RUN_SUMMARY, main, render_html, verdict

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
    failed = re.search(r"<tr class='claim failed' data-claim='a2'>.*?</tr>", alpha, re.S).group(0)
    assert "bandwidth within 2x of the ceiling" in failed and "&quot;ratio&quot;: 3.7" in failed
    nm = re.search(r"<tr class='claim not_measured' data-claim='a3'>.*?</tr>", alpha, re.S).group(0)
    assert "NOT MEASURED" in nm and "point dcp-2 failed: rank 1 died" in nm
    assert "data-claim='a1'" not in alpha  # passing claims are counted, not listed
    # A study's title links to its report category through the report app.
    assert "href='javascript:app.showCategory(&quot;Alpha study&quot;)'" in alpha

    beta = _tbody(page, "beta")
    assert "color:green'>1/1</b>" in beta and "ok 4 · failed 1 · skipped ?" in beta
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
    assert page.startswith("<table id='hpcdl-verdict'") and "Alpha study" in page
    assert "data-study='gamma'" in page and "data-study='beta'" not in page
