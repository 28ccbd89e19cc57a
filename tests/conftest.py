"""Shared fixtures: repository paths and a writer for tiny configs under tmp_path."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcdl.platform.kit.config import validate_config
from hpcdl.platform.kit.procenv import child_env, pythonpath

REPO = Path(__file__).resolve().parent.parent
# The test-scale workflow run, once per session (tests/workflow_run.py).
pytest_plugins = ["workflow_run"]
os.environ.setdefault("MPLBACKEND", "Agg")
# Ranks and task workers started by the tests import helper modules from tests/ (rank_probes, ...).
os.environ["PYTHONPATH"] = pythonpath(REPO / "tests")


def _cuda_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` need a real GPU: without one they skip, saying so (never faked on the CPU)."""
    if not any(item.get_closest_marker("cuda") for item in items) or _cuda_visible():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
                                   "run `pytest -m cuda` on a GPU machine (make gpu)")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def test_config():
    """The test-scale config as a dict (configs/test.yaml)."""
    return yaml.safe_load((REPO / "configs" / "test.yaml").read_text())


@pytest.fixture
def study_config(tmp_path, test_config):
    """study_config(study) -> the validated test-scale config running only `study`, results under tmp_path."""
    def make(study: str) -> dict:
        cfg = copy.deepcopy(test_config)
        cfg["results_dir"] = str(tmp_path / "results")
        cfg["studies"] = [study]
        return validate_config(cfg)
    return make


@pytest.fixture
def write_config(tmp_path, test_config):
    """write_config(studies=[...], **overrides) -> path of a config whose results go under tmp_path."""
    def write(name: str = "config.yaml", **overrides) -> Path:
        cfg = dict(test_config)
        cfg["results_dir"] = str(tmp_path / "results")
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(cfg.get(key), dict):
                cfg[key] = {**cfg[key], **value}
            else:
                cfg[key] = value
        path = tmp_path / name
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path
    return write


@pytest.fixture
def run_task_app():
    """run_task_app(study, cfg, path) -> cfg written to `path` as YAML, then `python -m tasks.<study>
    --config <path>` run to its end from the repository root, progress off, its output captured as text."""
    def run(study: str, cfg: dict, path: Path, timeout: float = 300):
        path.write_text(yaml.safe_dump(cfg))
        return subprocess.run([sys.executable, "-m", f"tasks.{study}", "--config", str(path)], cwd=REPO,
                              env=child_env(REPO, HPCDL_PROGRESS="0"), capture_output=True, text=True,
                              timeout=timeout)
    return run
