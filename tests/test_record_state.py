"""Whether a GPU record measured today's code, and which studies a device call records first
(hpcdl.platform.orchestration.record_state, envs/gpu_run.py's studies step and `make gpu-plan`).

Every repository and record here is HAND-MADE in tmp_path (a real git repository, real files); no GPU
measured any duration in them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.platform.orchestration import record_state
from hpcdl.platform.orchestration.record_state import (
    blob_id,
    commit_fingerprint,
    config_block,
    plan,
    plan_text,
    state_of,
    tree_fingerprint,
)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "envs"))
import gpu_run  # noqa: E402  (envs/ is not a package)

GPU_YAML = """\
# the file's own comment
results_dir: results-gpu
foo:  # one GPU: the foo study
  device: cuda
  repeats: 3   # trimmed from 5 for the call's time

  sizes: [1, 2]
bar:
  device: cuda
  note: "a # inside quotes is no comment"
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", message)
    return _git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A hand-made repository with the layout a fingerprint reads: study foo's package, the kit, its
    task app and configs/gpu.yaml."""
    root = tmp_path / "repo"
    for rel, text in {"hpcdl/studies/foo/compute.py": "x = 1\n", "hpcdl/studies/foo/claims.py": "y = 2\n",
                      "hpcdl/platform/kit/points.py": "z = 3\n", "tasks/foo.py": "main = 0\n",
                      "tasks/bar.py": "other = 0\n", "configs/gpu.yaml": GPU_YAML}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    _git(root, "init", "-q")
    _commit(root, "first")
    return root


def test_a_config_block_leaves_out_comments_and_blank_lines_and_other_studies():
    assert config_block(GPU_YAML, "foo") == "foo:\n  device: cuda\n  repeats: 3\n  sizes: [1, 2]"
    assert config_block(GPU_YAML, "bar").endswith('note: "a # inside quotes is no comment"')
    assert config_block(GPU_YAML, "baz") == ""


def test_the_blob_id_is_git_s_own(repo):
    data = (repo / "tasks" / "foo.py").read_bytes()
    assert blob_id(data) == _git(repo, "hash-object", "tasks/foo.py").strip()


def test_a_tree_and_its_commit_have_one_fingerprint(repo):
    head = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "hpcdl" / "studies" / "foo" / "__pycache__").mkdir()
    (repo / "hpcdl" / "studies" / "foo" / "__pycache__" / "compute.cpython-311.pyc").write_bytes(b"\0")
    tree = tree_fingerprint(repo, "foo")
    assert tree == commit_fingerprint(repo, head, "foo")
    assert sorted(tree["files"]) == ["hpcdl/platform/kit/points.py", "hpcdl/studies/foo/claims.py",
                                     "hpcdl/studies/foo/compute.py", "tasks/foo.py"]  # not bar's app
    assert commit_fingerprint(repo, "f" * 40, "foo") is None  # a commit git does not have


def test_a_record_of_today_s_code_is_current_and_a_comment_does_not_change_that(repo):
    run = {"commit": _git(repo, "rev-parse", "HEAD").strip(), "fingerprint": tree_fingerprint(repo, "foo")}
    (repo / "configs" / "gpu.yaml").write_text(GPU_YAML.replace("# trimmed from 5", "# trimmed from 6"))
    (repo / "tasks" / "bar.py").write_text("other = 1\n")  # another study's app
    _commit(repo, "comments and another study")
    assert state_of("foo", run, repo).text() == "current"


def test_a_record_of_older_code_names_the_files_and_counts_the_commits(repo):
    run = {"commit": _git(repo, "rev-parse", "HEAD").strip(), "fingerprint": tree_fingerprint(repo, "foo")}
    (repo / "hpcdl" / "studies" / "foo" / "compute.py").write_text("x = 2\n")
    _commit(repo, "one")
    (repo / "hpcdl" / "platform" / "kit" / "points.py").write_text("z = 4\n")
    (repo / "hpcdl" / "studies" / "foo" / "new.py").write_text("w = 0\n")
    (repo / "configs" / "gpu.yaml").write_text(GPU_YAML.replace("repeats: 3", "repeats: 2"))
    _commit(repo, "two")
    _commit(repo, "three, touching none of foo's files")  # not counted
    st = state_of("foo", run, repo)
    assert st.state == "older code" and st.commits == 2
    assert st.changed == ("hpcdl/platform/kit/points.py", "hpcdl/studies/foo/compute.py",
                          "hpcdl/studies/foo/new.py", "configs/gpu.yaml (foo block)")
    assert st.text() == ("older code (2 commits; these files changed: hpcdl/platform/kit/points.py, "
                         "hpcdl/studies/foo/compute.py, hpcdl/studies/foo/new.py, "
                         "configs/gpu.yaml (foo block))")


def test_without_git_the_state_still_names_the_files(tmp_path, repo):
    run = {"commit": "0" * 40, "fingerprint": tree_fingerprint(repo, "foo")}
    (repo / "tasks" / "foo.py").write_text("main = 1\n")
    st = state_of("foo", run, repo)
    assert st.commits is None and st.text() == "older code (these files changed: tasks/foo.py)"


def test_missing_and_unfingerprinted_records():
    assert state_of("foo", None, REPO).text() == "missing"
    assert state_of("foo", {"commit": "abc"}, REPO).text() == "unknown code (the record has no fingerprint)"


def test_the_plan_spends_the_call_on_missing_then_stale_then_current_shortest_first(repo):
    today = {s: tree_fingerprint(repo, s) for s in ("foo", "bar")}
    older = {**today["bar"], "config": "another block"}
    record = {"studies": {"foo": {"duration_s": 50.0, "fingerprint": today["foo"]},
                          "bar": {"duration_s": 100.0, "fingerprint": older}}}
    estimates = {"foo": 10, "bar": 10, "new": 30, "huge": 500}
    rows = plan(["foo", "bar", "new", "huge"], record, repo, 200, estimates)
    assert [(r.study, r.state.state, r.needs_s, r.runs) for r in rows] == [
        ("new", "missing", 30, True),        # never recorded: its estimate
        ("huge", "missing", 500, False),     # does not fit the 170 s left: not started
        ("bar", "older code", 100, True),    # its last measured duration, not the estimate
        ("foo", "current", 50, True)]        # 70 s left covers it
    text = plan_text(rows, 200, "h200")
    assert "records new         never recorded, estimate 30 s" in text
    assert "skips   huge" in text
    assert "records bar         100 s last time" in text and "older code (these files changed: " \
        "configs/gpu.yaml (bar block))" in text


def test_make_gpu_plan_prints_what_the_call_records_from_the_committed_records():
    proc = subprocess.run(["make", "--no-print-directory", "gpu-plan", "GPU_STEPS=setup,studies",
                           "GPU_STUDIES=hpo hetmem"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("studies on "))
    assert "480 s for studies in this call" in lines[head]   # 540 s less setup's 60
    studies = [line.split()[1] for line in lines[head + 1:]]
    assert sorted(studies) == ["hetmem", "hpo"]  # the subset asked for, and only it


def test_the_studies_step_refuses_an_unknown_study_by_name():
    with pytest.raises(SystemExit, match=r"--studies: unknown \['shufle'\]"):
        gpu_run.study_plan("hpo shufle", 100, None)


def test_gpu_run_writes_each_started_study_s_fingerprint(tmp_path):
    out = tmp_path / "records" / "hpo" / "fingerprint.json"
    record_state.write_fingerprint(REPO, "hpo", out)
    assert json.loads(out.read_text()) == tree_fingerprint(REPO, "hpo")
