"""pytest plugin (registered in conftest.py): one real test-scale Snakemake run, shared by the suite.

`test_scale_workflow` (session scope) runs `snakemake --cores 2` with configs/test.yaml in a fresh
directory and then `--report` with the report's stylesheet (as `make report`), once per session (per
pytest-xdist worker: `make test` runs two, and a worker's tests never read a run another worker's
tests change): tests/test_workflow.py checks the outputs and the report's embedded data,
tests/test_report.py renders the same report in Chromium. The processes' results are returned, not
asserted, so each test fails with snakemake's own output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
TEST_CONFIG = REPO / "configs" / "test.yaml"
REPORT_CSS = REPO / "workflows" / "report" / "report.css"  # as the Makefile's `report` target gives it


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run([*SNAKEMAKE, "--directory", str(workdir), "--configfile", str(TEST_CONFIG), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


@dataclass(frozen=True)
class WorkflowRun:
    workdir: Path
    studies: list[str]
    run: subprocess.CompletedProcess
    report: Path
    made: subprocess.CompletedProcess | None  # the --report call; None when the run failed

    @property
    def results(self) -> Path:
        return self.workdir / "results"


@pytest.fixture(scope="session")
def test_scale_workflow(tmp_path_factory) -> WorkflowRun:
    workdir = tmp_path_factory.mktemp("workflow")
    studies = yaml.safe_load(TEST_CONFIG.read_text())["studies"]
    run = snakemake(workdir, "--cores", "2")
    report = workdir / "results" / "report.html"
    made = snakemake(workdir, "--report", str(report), "--report-stylesheet", str(REPORT_CSS)) \
        if run.returncode == 0 else None
    return WorkflowRun(workdir, studies, run, report, made)
