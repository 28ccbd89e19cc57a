"""pytest plugin (registered in conftest.py): one real test-scale Snakemake run, shared by the suite.

`test_scale_workflow` (session scope) runs `snakemake --cores 2` with configs/test.yaml in a fresh
directory and then `--report` with the report's stylesheet (as `make report`), once per session:
tests/test_workflow.py checks the outputs and the report's embedded data, tests/test_report.py
renders the same report in Chromium, tests/test_slurm.py compares its Slurm run with it. Under
pytest-xdist (`make test`: two workers, `--dist loadfile`) the modules that read the run are one
work unit, so one worker makes the run and the other never waits for it or runs it again (each
run took ~300 s of the suite's two cores); every other module stays a unit of its own. That unit
goes first, as the longest (with `--no-loadscope-reorder`; else xdist orders units by test count).
The processes' results are returned, not asserted, so each test fails with snakemake's own output.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from xdist.scheduler import LoadFileScheduling

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


WORKFLOW_GROUP = "test-scale-workflow"


@functools.cache
def reads_the_run(module: Path) -> bool:
    """Whether a test module has a test that takes `test_scale_workflow` as an argument. Read from its
    source, so that the xdist controller, which collects no tests, decides as the workers do."""
    tree = ast.parse(module.read_text(), str(module))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")
               and any(arg.arg == "test_scale_workflow" for arg in node.args.args)
               for node in ast.walk(tree))


def pytest_collection_modifyitems(config, items):
    """The modules that read the run first (module docstring), each module's tests kept together."""
    items.sort(key=lambda item: not reads_the_run(item.path))  # stable


class _OneRunScheduling(LoadFileScheduling):
    """--dist loadfile, but with every module that reads the run in one work unit. (Not xdist_group
    marks with --dist loadgroup: with pytest 9.2 and xdist 3.8 they group nothing, pytest-xdist#1386.)"""

    def _split_scope(self, nodeid: str) -> str:
        module = super()._split_scope(nodeid)
        path = self.config.rootpath / module
        return WORKFLOW_GROUP if path.suffix == ".py" and reads_the_run(path) else module


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown where it is not loaded
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadfile":
        return _OneRunScheduling(config, log)
    return None


@pytest.fixture(scope="session")
def test_scale_workflow(tmp_path_factory) -> WorkflowRun:
    workdir = tmp_path_factory.mktemp("workflow")
    studies = yaml.safe_load(TEST_CONFIG.read_text())["studies"]
    run = snakemake(workdir, "--cores", "2")
    report = workdir / "results" / "report.html"
    made = snakemake(workdir, "--report", str(report), "--report-stylesheet", str(REPORT_CSS)) \
        if run.returncode == 0 else None
    return WorkflowRun(workdir, studies, run, report, made)
