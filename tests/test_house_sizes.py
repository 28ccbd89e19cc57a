"""Rooms a newcomer can read (#55): no function over 80 lines in hpcdl/, tasks/, benchmarks/ and envs/,
and no module over 400 lines there. A function's lines run from its `def` to its last line (its
docstring and nested functions included); a module's are all its lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("hpcdl", "tasks", "benchmarks", "envs")
MAX_FUNCTION_LINES, MAX_MODULE_LINES = 80, 400


def too_long(root: Path, folders=FOLDERS) -> tuple[list[str], list[str]]:
    """('path::function (N lines)', ...) and ('path (N lines)', ...) over the limits under `root`."""
    functions, modules = [], []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            source = path.read_text()
            rel = path.relative_to(root)
            if (n := len(source.splitlines())) > MAX_MODULE_LINES:
                modules.append(f"{rel} ({n} lines)")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                        functions.append(f"{rel}::{node.name} ({n} lines)")
    return functions, modules


def test_no_function_over_80_lines_and_no_module_over_400():
    functions, modules = too_long(REPO)
    assert not functions, f"functions over {MAX_FUNCTION_LINES} lines: {functions}"
    assert not modules, f"modules over {MAX_MODULE_LINES} lines: {modules}"


def test_the_size_check_finds_a_long_function_and_a_long_module(tmp_path):
    (tmp_path / "hpcdl").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(80))  # def + 80 lines = 81
    (tmp_path / "hpcdl" / "long.py").write_text(f"def long():\n{body}\n\ndef short():\n    return 1\n")
    (tmp_path / "hpcdl" / "big.py").write_text("x = 1\n" * 401)
    functions, modules = too_long(tmp_path, ("hpcdl",))
    assert functions == ["hpcdl/long.py::long (81 lines)"]
    assert modules == ["hpcdl/big.py (401 lines)"]
    (tmp_path / "hpcdl" / "big.py").write_text("x = 1\n" * 400)
    assert too_long(tmp_path, ("hpcdl",))[1] == []


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_folder_checked_holds_python(folder):
    assert list((REPO / folder).rglob("*.py")), f"{folder}/ has no Python file: the check reads nothing"
