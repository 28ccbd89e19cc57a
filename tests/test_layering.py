"""The three layers of hpcdl and the two runtimes (docs/architecture.md, "Layers"), checked on the
imports: studies -> common -> the platform's pure parts, never the other way."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

HPCDL = Path(__file__).resolve().parent.parent / "hpcdl"
STUDIES = sorted(p.parent.name for p in (HPCDL / "studies").glob("*/__init__.py"))
# "module:function" rank targets name a module as surely as an import does
TARGET = re.compile(r"^(hpcdl(?:\.\w+)+):\w+$")
# What compute code and shared code may use of the platform: no task runtime, no workflow-facing parts.
PLATFORM_PURE = ("hpcdl.platform.config", "hpcdl.platform.results", "hpcdl.platform.claims",
                 "hpcdl.platform.intervals", "hpcdl.platform.points", "hpcdl.platform.stages",
                 "hpcdl.platform.study", "hpcdl.platform.device", "hpcdl.platform.rank_runtime",
                 "hpcdl.platform.procenv")


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


def imports_under(folder: Path) -> dict[str, set[str]]:
    return {str(f.relative_to(HPCDL)): {n for n in imported(f) if n.split(".")[0] == "hpcdl"}
            for f in sorted(folder.rglob("*.py"))}


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_platform_imports_no_study_and_nothing_shared():
    for file, names in imports_under(HPCDL / "platform").items():
        bad = sorted(n for n in names if _within(n, ("hpcdl.studies", "hpcdl.common")))
        assert not bad, f"hpcdl/{file} imports {bad}"


def test_shared_code_imports_no_study_and_only_the_platforms_pure_parts():
    for file, names in imports_under(HPCDL / "common").items():
        bad = sorted(n for n in names if not _within(n, ("hpcdl.common", *PLATFORM_PURE)))
        assert not bad, f"hpcdl/{file} imports {bad}"


@pytest.mark.parametrize("study", STUDIES)
def test_a_study_imports_itself_shared_code_and_the_platforms_pure_parts_only(study):
    own = f"hpcdl.studies.{study}"
    for file, names in imports_under(HPCDL / "studies" / study).items():
        bad = sorted(n for n in names if not _within(n, (own, "hpcdl.common", *PLATFORM_PURE)))
        assert not bad, f"hpcdl/{file} imports {bad}"


def test_the_oracle_reads_layer_shapes_never_the_rest_of_its_study():
    for file, names in imports_under(HPCDL / "studies" / "spatial" / "perfmodel").items():
        bad = sorted(n for n in names if _within(n, ("hpcdl.studies",))
                     and not _within(n, ("hpcdl.studies.spatial.perfmodel",)))
        assert not bad, f"hpcdl/{file} imports {bad}"
    for file, names in imports_under(HPCDL / "common").items():
        assert not [n for n in names if "perfmodel" in n], file


def test_the_library_never_imports_the_workflow_or_pycompss_outside_the_task_runtime():
    for file in sorted(HPCDL.rglob("*.py")):
        rel = file.relative_to(HPCDL)
        names = imported(file)
        assert not {n for n in names if n.split(".")[0] in ("snakemake", "tasks", "workflows")}, rel
        if rel.parts[:2] != ("platform", "task_runtime"):
            assert not {n for n in names if n.split(".")[0] == "pycompss"}, rel


def test_the_rank_runtime_knows_nothing_of_tasks():
    # it may place ranks by the device mechanism and build their environment (pure: no tasks, no workflow)
    for file, names in imports_under(HPCDL / "platform" / "rank_runtime").items():
        allowed = ("hpcdl.platform.rank_runtime", "hpcdl.platform.device", "hpcdl.platform.procenv")
        bad = sorted(n for n in names if not _within(n, allowed))
        assert not bad, f"hpcdl/{file} imports {bad}"


def test_importing_a_study_loads_no_task_backend():
    """Every module of every study imported in one fresh interpreter: no part of the task runtime
    (backend detection, the local pool, the PyCOMPSs binding) is loaded."""
    modules = [f"hpcdl.studies.{s}" + ("" if f.stem == "__init__" else f".{f.stem}")
               for s in STUDIES for f in sorted((HPCDL / "studies" / s).glob("*.py"))
               # _preload: a forkserver preamble that ties the importing process to its parent
               if f.stem == "__init__" or not f.stem.startswith("_")]
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(n for n in sys.modules if n.startswith(('hpcdl.platform.task_runtime', "
            "'pycompss', 'hpcdl.platform.cli', 'snakemake')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=HPCDL.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    assert len(modules) > 8 * 5  # every study's stages and compute were imported, not just a few


def test_the_code_cites_the_design_inside_the_project():
    """Modules cite docs/architecture.md by section, and every section they cite exists."""
    repo = HPCDL.parent
    headings = set(re.findall(r"^## (.+)$", (repo / "docs" / "architecture.md").read_text(), re.M))
    sources = [*HPCDL.rglob("*.py"), *(repo / "workflows").rglob("*.smk"), repo / "Snakefile"]
    cited = {m for p in sources for m in re.findall(r'docs/architecture\.md, "([^"]+)"', p.read_text())}
    assert cited and cited <= headings, f"cited sections that do not exist: {cited - headings}"
    outside = [str(p.relative_to(repo)) for p in sources if "DESIGN.md" in p.read_text()]
    assert not outside, f"modules citing a design document outside the project: {outside}"
