"""Atomic writes and provenance sidecars (claims files: tests/test_claims.py)."""

import json
import os
import platform
import socket
import subprocess
import time
from datetime import datetime

import pandas as pd
import pytest

from hpcdl.platform.kit.atomic import atomic_write_text
from hpcdl.platform.kit.results import config_hash, git_commit, read_table, save_figure, write_table
from hpcdl.platform.kit.sidecars import provenance_path


def test_atomic_write_leaves_no_temp_and_keeps_old_file_on_error(tmp_path, monkeypatch):
    path = tmp_path / "a.txt"
    atomic_write_text(path, "first")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(path, "second")
    assert path.read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def _git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def test_table_has_provenance_sidecar(tmp_path, repo):
    df = pd.DataFrame({"size_bytes": [1, 2], "time_s": [0.5, 1.0]})
    cfg = {"results_dir": str(tmp_path), "x": 1}
    heads = {_git(repo, "rev-parse", "HEAD")}
    started = time.time() - 2.5
    path = write_table(df, tmp_path / "tables" / "t.csv", cfg, started_at=started)
    finished = time.time()
    heads.add(_git(repo, "rev-parse", "HEAD"))  # a commit may land in between in a shared checkout
    assert read_table(path).equals(df)
    meta = json.loads(provenance_path(path).read_text())
    assert meta["config_hash"] == config_hash(cfg) != config_hash({**cfg, "x": 2})
    assert meta["git_commit"].removesuffix("-dirty") in heads
    assert (meta["table"], meta["rows"], meta["columns"]) == ("t.csv", 2, ["size_bytes", "time_s"])
    assert meta["packages"]["pandas"] == pd.__version__
    assert meta["packages"]["python"] == platform.python_version()
    assert meta["host"] == socket.gethostname() and meta["cores"] == len(os.sched_getaffinity(0))
    start, end = (datetime.fromisoformat(meta[k]).timestamp() for k in ("start_time", "end_time"))
    assert start == int(started)                                  # ISO seconds of the given start
    assert start <= end <= finished
    assert meta["duration_s"] == pytest.approx(end - started, abs=1.0) and meta["duration_s"] >= 2.5


def test_git_commit_is_head_and_marks_a_dirty_tree(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "f.txt").write_text("a")
    _git(tmp_path, "add", "f.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert git_commit(tmp_path) == head
    (tmp_path / "f.txt").write_text("b")
    assert git_commit(tmp_path) == head + "-dirty"
    assert git_commit(tmp_path / "nowhere") == "unknown"


def test_config_hash_ignores_key_order():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_read_table_missing_names_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        read_table(tmp_path / "nope.csv")


def test_save_figure_writes_a_png_atomically_and_closes_it(tmp_path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 4, 9])
    path = save_figure(fig, tmp_path / "figs" / "f.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    assert not plt.fignum_exists(fig.number)
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.png"]
