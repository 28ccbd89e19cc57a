"""Atomic writes, provenance sidecars and claims files."""

import json
import os

import pandas as pd
import pytest

from hpcdl.io import (
    atomic_write_text,
    claim,
    config_hash,
    provenance_path,
    read_table,
    save_figure,
    write_claims,
    write_table,
)


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


def test_table_has_provenance_sidecar(tmp_path):
    df = pd.DataFrame({"size_bytes": [1, 2], "time_s": [0.5, 1.0]})
    cfg = {"results_dir": str(tmp_path), "x": 1}
    path = write_table(df, tmp_path / "tables" / "t.csv", cfg, started_at=0.0)
    assert read_table(path).equals(df)
    meta = json.loads(provenance_path(path).read_text())
    assert meta["config_hash"] == config_hash(cfg)
    assert meta["rows"] == 2 and meta["columns"] == ["size_bytes", "time_s"]
    assert meta["packages"]["pandas"] == pd.__version__
    assert meta["cores"] >= 1 and meta["host"]
    assert meta["git_commit"]
    assert meta["start_time"].startswith("1970-01-01")


def test_config_hash_ignores_key_order():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_claims_json_and_html(tmp_path):
    claims = [claim("fast", "x is fast", True, speedup=2.0), claim("small", "y < 1", False, y=3)]
    json_path, html_path = write_claims(tmp_path, "demo", claims)
    doc = json.loads(json_path.read_text())
    assert doc["passed"] == 1 and doc["total"] == 2
    assert doc["claims"][1]["measured"] == {"y": 3}
    page = html_path.read_text()
    assert "PASS" in page and "FAIL" in page and "x is fast" in page


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
