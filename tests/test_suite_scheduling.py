"""`make test`'s scheduling (tests/workflow_run.py): under `--dist loadfile` the modules that read the
test-scale workflow run are one work unit, run first, so the run is made once for the suite.

A real two-worker pytest-xdist run of a small suite in tmp_path, with the plugin loaded as `make
test` loads it and the run itself replaced by its worker's pid (the plugin's scheduling is what is
checked here; tests/test_workflow.py checks the run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from workflow_run import reads_the_run

REPO = Path(__file__).resolve().parent.parent

CONFTEST = '''
import os
import pytest

pytest_plugins = ["workflow_run"]


@pytest.fixture(scope="session")
def test_scale_workflow():
    return os.getpid()
'''
READER = '''
import os, time
from pathlib import Path


def test_{name}(test_scale_workflow):
    time.sleep(0.3)
    with open(Path(__file__).parent / "ran.txt", "a") as f:
        f.write(f"{name} {{os.getpid()}} {{test_scale_workflow}} {{time.monotonic()}}\\n")
'''
OTHER = '''
import os, time
from pathlib import Path


def test_{name}():
    time.sleep(0.3)
    with open(Path(__file__).parent / "ran.txt", "a") as f:
        f.write(f"{name} {{os.getpid()}} - {{time.monotonic()}}\\n")
'''


def test_reads_the_run_means_a_test_taking_the_run_as_an_argument(tmp_path):
    taker = tmp_path / "test_taker.py"
    taker.write_text("def test_x(tmp_path, test_scale_workflow):\n    pass\n")
    mention = tmp_path / "test_mention.py"  # named, but neither a test nor an argument of one
    mention.write_text("NAME = 'test_scale_workflow'\n\ndef helper(test_scale_workflow):\n    pass\n")
    assert reads_the_run(taker) and not reads_the_run(mention)
    readers = {p.name for p in (REPO / "tests").glob("test_*.py") if reads_the_run(p)}
    assert {"test_workflow.py", "test_report.py", "test_slurm.py"} <= readers
    assert "test_suite_scheduling.py" not in readers


def test_two_workers_make_the_run_once_and_run_its_readers_first(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name in ("b_other", "c_other", "d_other", "e_other"):
        (tmp_path / f"test_{name}.py").write_text(OTHER.format(name=name))
    for name in ("f_reader", "g_reader"):
        (tmp_path / f"test_{name}.py").write_text(READER.format(name=name))
    # conftest.py has put tests/ on PYTHONPATH: the small suite's conftest finds workflow_run there
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadfile", "--no-loadscope-reorder", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in (tmp_path / "ran.txt").read_text().splitlines()]
    assert len(rows) == 6
    readers = [r for r in rows if r[0].endswith("reader")]
    # both readers on one worker, from one run of the fixture
    assert len({r[1] for r in readers}) == 1 and {r[2] for r in readers} == {readers[0][1]}
    # ... and first on that worker, though their modules come last in the collection
    on_that_worker = sorted((float(r[3]), r[0]) for r in rows if r[1] == readers[0][1])
    assert [name for _, name in on_that_worker[:2]] == ["f_reader", "g_reader"]
    assert len({r[1] for r in rows}) == 2  # the other worker ran the rest
