"""A real Snakemake run of every study at test scale, then the HTML report."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run([*SNAKEMAKE, "--directory", str(workdir),
                           "--configfile", str(REPO / "configs" / "test.yaml"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_whole_workflow_and_report(tmp_path):
    studies = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())["studies"]
    run = snakemake(tmp_path, "--cores", "2")
    assert run.returncode == 0, run.stderr[-4000:]
    for study in studies:
        study_dir = tmp_path / "results" / study
        claims = json.loads((study_dir / "claims.json").read_text())
        assert claims["study"] == study and claims["total"] >= 1, claims
        tables = list((study_dir / "tables").glob("*.csv"))
        assert tables, f"{study} wrote no tables"
        for table in tables:
            assert table.with_name(table.stem + ".provenance.json").exists(), table
        figures = list((study_dir / "figures").glob("*.png"))
        assert figures and all(f.stat().st_size > 5000 for f in figures), figures

    # A second run has nothing to do: outputs are complete and up to date.
    again = snakemake(tmp_path, "--cores", "2", "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    report = tmp_path / "results" / "report.html"
    made = snakemake(tmp_path, "--report", str(report))
    assert made.returncode == 0, made.stderr[-3000:]
    html = report.read_text(errors="replace")
    assert len(html) > 100_000
    for study in studies:
        assert f"{study}" in html


def test_lint_is_clean(tmp_path):
    run = snakemake(tmp_path, "--lint")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Lints for" not in run.stdout, run.stdout[-3000:]
