"""envs/hpcdl.yaml (used under --use-conda) pins exactly what requirements.txt pins."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)$")


def pins(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        m = PIN.match(line.strip())
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def test_conda_env_matches_requirements():
    env = yaml.safe_load((REPO / "envs" / "hpcdl.yaml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    required = pins((REPO / "requirements.txt").read_text().splitlines())
    assert required, "requirements.txt has no pins"
    assert pins(pip_section) == required


def test_conda_env_python_matches_project():
    env = yaml.safe_load((REPO / "envs" / "hpcdl.yaml").read_text())
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert python == "python=3.11"
