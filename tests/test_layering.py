"""Dependencies between hpcdl packages point one way (DESIGN.md §1), checked on the imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

HPCDL = Path(__file__).resolve().parent.parent / "hpcdl"
# "module:function" rank targets name a module as surely as an import does
TARGET = re.compile(r"^(hpcdl(?:\.\w+)+):\w+$")


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and TARGET.match(node.value):
            names.add(TARGET.match(node.value).group(1))
    return names


def imports_of(package: str) -> dict[str, set[str]]:
    root = HPCDL / package if (HPCDL / package).is_dir() else HPCDL / f"{package}.py"
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    return {str(f.relative_to(HPCDL)): imported(f) for f in files}


@pytest.mark.parametrize("package, forbidden", [
    ("perfmodel", ("hpcdl.spatial",)),           # the model reads layer shapes, never the study
    ("layers", ("hpcdl.spatial", "hpcdl.perfmodel")),
])
def test_one_way_dependencies(package, forbidden):
    for file, names in imports_of(package).items():
        bad = sorted(n for n in names if n.startswith(forbidden))
        assert not bad, f"hpcdl/{file} imports {bad}"


def test_the_library_never_imports_the_workflow_or_pycompss_outside_the_runtime():
    for file in sorted(HPCDL.rglob("*.py")):
        rel = file.relative_to(HPCDL)
        names = imported(file)
        assert not {n for n in names if n.split(".")[0] in ("snakemake", "tasks", "workflows")}, rel
        if rel.parts[0] != "runtime":
            assert not {n for n in names if n.split(".")[0] == "pycompss"}, rel
