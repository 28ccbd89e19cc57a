"""Subprocess environments keep the caller's PYTHONPATH (#42, defect 2).

On the GPU image the packages `make gpu-carry` brings live on PYTHONPATH; a task app started with
PYTHONPATH replaced by the repository had no jsonschema. Every place that starts a child builds its
environment through hpcdl.platform.kit.procenv.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.platform.kit.procenv import PACKAGE_ROOT, child_env, pythonpath

REPO = Path(__file__).resolve().parent.parent


def test_prepended_entries_come_first_and_the_callers_stay_in_order_without_repeats(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert pythonpath(a, base=os.pathsep.join([b, a, "", b])) == os.pathsep.join([a, b])
    assert pythonpath(base="") == ""
    assert pythonpath(a, base=b, drop=[b]) == a


def test_child_env_keeps_every_other_variable_and_refuses_to_replace_pythonpath(tmp_path):
    base = {"PATH": "/bin", "PYTHONPATH": str(tmp_path / "site"), "KEEP": "1"}
    env = child_env(REPO, base=base, OMP_NUM_THREADS=2)
    assert env == {"PATH": "/bin", "KEEP": "1", "OMP_NUM_THREADS": "2",
                   "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "site")])}
    assert base["PYTHONPATH"] == str(tmp_path / "site")   # the caller's mapping is not touched
    with pytest.raises(ValueError, match="prepended"):
        child_env(base=base, PYTHONPATH=str(REPO))
    assert "PYTHONPATH" not in child_env(base={"PATH": "/bin"})


def test_a_child_started_through_the_helper_imports_the_carried_packages_and_hpcdl(tmp_path):
    """The GPU image's situation: a package only on the caller's PYTHONPATH (a carried site dir)."""
    site = tmp_path / "carried-site"
    site.mkdir()
    (site / "carried_probe.py").write_text("VALUE = 42\n")
    caller = child_env(site, base={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    code = "import carried_probe, hpcdl.platform.kit.procenv as p; print(carried_probe.VALUE, p.PACKAGE_ROOT)"
    out = subprocess.run([sys.executable, "-c", code], env=child_env(PACKAGE_ROOT, base=caller),
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["42", str(PACKAGE_ROOT)]


def _replacements(path: Path) -> list[str]:
    """Places that set PYTHONPATH to a value not built by procenv: a dict entry, a keyword argument,
    or an item assignment whose value is anything but a pythonpath()/child_env() call."""
    def built_by_helper(value: ast.AST) -> bool:
        return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id in ("pythonpath", "child_env"))

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            found += [f"{path}:{k.lineno}" for k, v in zip(node.keys, node.values, strict=True)
                      if isinstance(k, ast.Constant) and k.value == "PYTHONPATH" and not built_by_helper(v)]
        elif isinstance(node, ast.keyword) and node.arg == "PYTHONPATH":
            found.append(f"{path}:{node.value.lineno}")
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if (isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                        and t.slice.value == "PYTHONPATH" and not built_by_helper(node.value)):
                    found.append(f"{path}:{node.lineno}")
    return found


def test_no_code_of_the_project_replaces_pythonpath_by_hand():
    files = [f for d in ("hpcdl", "tasks", "tests", "benchmarks", "envs")
             for f in sorted((REPO / d).rglob("*.py"))]
    bad = [hit for f in files if f.name not in ("test_procenv.py", "procenv.py") for hit in _replacements(f)]
    assert not bad, f"PYTHONPATH set without hpcdl.platform.kit.procenv (prepend, never replace): {bad}"
