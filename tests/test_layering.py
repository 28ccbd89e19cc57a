"""The three layers of hpcdl, the platform's two wings and its one door, and the two runtimes
(docs/architecture.md, "Layers"), checked on the imports: studies -> common -> the platform's face ->
the study wing (hpcdl.platform.kit) <- the orchestration wing, never the other way, and no cycle."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hpcdl.platform as face

HPCDL = Path(__file__).resolve().parent.parent / "hpcdl"
STUDIES = sorted(p.parent.name for p in (HPCDL / "studies").glob("*/__init__.py"))
# "module:function" rank targets name a module as surely as an import does
TARGET = re.compile(r"^(hpcdl(?:\.\w+)+):\w+$")
FACE, KIT, ORCHESTRATION = "hpcdl.platform", "hpcdl.platform.kit", "hpcdl.platform.orchestration"
DOOR = "hpcdl.platform.task_app"  # the task apps' and benchmarks' one door


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


def names_from_the_face(folder: Path) -> set[str]:
    """Every name `from hpcdl.platform import ...` brings into the modules under `folder`."""
    return {a.name for f in folder.rglob("*.py") for node in ast.walk(ast.parse(f.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module == FACE and node.level == 0
            for a in node.names}


# -- the import graph --------------------------------------------------------------------------------

def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `package` (a folder under `root`)."""
    out = {}
    for f in sorted((root / package).rglob("*.py")):
        parts = f.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`: they never run, so they cannot close a cycle
    (the face's imports for type checkers, a type named in an annotation)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def import_graph(root: Path, package: str = "hpcdl", type_checking: bool = False) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports, at module level or inside a function alike
    (and under `if TYPE_CHECKING:` with `type_checking`). `from x import y` is an edge to x.y where y
    is a submodule, else to x."""
    modules = module_files(root, package)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = set() if type_checking else _type_checking_only(tree)
        edges = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, up level - 1
                    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                for a in node.names:
                    if f"{base}.{a.name}" in modules:
                        edges.add(f"{base}.{a.name}")
                    elif base in modules:
                        edges.add(base)
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` as [a, b, ..., a], or [] where there is none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


@pytest.mark.parametrize("type_checking", [False, True], ids=["run", "type-checking-too"])
def test_hpcdl_has_no_import_cycle(type_checking):
    """None at run time, and none where a type checker follows the imports under TYPE_CHECKING too."""
    graph = import_graph(HPCDL.parent, type_checking=type_checking)
    assert len(graph) > 150 and sum(map(len, graph.values())) > 200  # the whole package was read
    cycle = find_cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    """The check above can fail: a -> b (module level), b -> c (`from pkg import c`, a submodule),
    c -> a (inside a function) is found and printed; the same package without c's import is clean."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import thing\n")
    (pkg / "b.py").write_text("from pkg import c\nthing = 1\n")
    (pkg / "c.py").write_text("def f():\n    from pkg.a import thing\n    return thing\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from pkg.a import x\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.d"] == set()
    assert import_graph(tmp_path, "pkg", type_checking=True)["pkg.d"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(tmp_path, "pkg")) == []


# -- the face and the two wings ----------------------------------------------------------------------

def test_studies_and_shared_code_reach_the_platform_only_through_its_face():
    for folder in (HPCDL / "studies", HPCDL / "common"):
        for file, names in imports_under(folder).items():
            bad = sorted(n for n in names if _within(n, (FACE,)) and n != FACE)
            assert not bad, f"hpcdl/{file} imports {bad}: use `from hpcdl.platform import ...`"


def test_the_face_exports_exactly_what_studies_and_shared_code_use_from_the_study_wing():
    used = names_from_the_face(HPCDL / "studies") | names_from_the_face(HPCDL / "common")
    assert set(face.__all__) == set(face.EXPORTS) == used
    for name, (module, attr) in face.EXPORTS.items():
        assert _within(module, (KIT,)), f"hpcdl.platform.{name} comes from {module}, not the study wing"
        assert getattr(face, name) is getattr(__import__(module, fromlist=[attr]), attr)
    # type checkers see the same names from the same modules
    checked = {}
    for node in ast.walk(ast.parse((HPCDL / "platform" / "__init__.py").read_text())):
        if isinstance(node, ast.ImportFrom) and _within(node.module, (KIT,)):
            checked |= {a.asname or a.name: (node.module, a.name) for a in node.names}
    assert checked == face.EXPORTS
    with pytest.raises(AttributeError, match="has no attribute 'task_app_command'"):
        face.task_app_command  # noqa: B018  (the orchestration wing is not behind the door)


def test_the_study_wing_never_imports_the_orchestration_wing():
    for file, names in imports_under(HPCDL / "platform" / "kit").items():
        bad = sorted(n for n in names if not _within(n, (KIT,)))
        assert not bad, f"hpcdl/{file} imports {bad}: the study wing uses only itself"


def test_the_platform_imports_no_study_and_nothing_shared():
    for file, names in imports_under(HPCDL / "platform").items():
        bad = sorted(n for n in names if _within(n, ("hpcdl.studies", "hpcdl.common")))
        assert not bad, f"hpcdl/{file} imports {bad}"


def test_shared_code_imports_no_study():
    for file, names in imports_under(HPCDL / "common").items():
        bad = sorted(n for n in names if not _within(n, ("hpcdl.common",)) and n != FACE)
        assert not bad, f"hpcdl/{file} imports {bad}"


@pytest.mark.parametrize("study", STUDIES)
def test_a_study_imports_itself_shared_code_and_the_face_only(study):
    own = f"hpcdl.studies.{study}"
    for file, names in imports_under(HPCDL / "studies" / study).items():
        bad = sorted(n for n in names if not _within(n, (own, "hpcdl.common")) and n != FACE)
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
        if rel.parts[:3] != ("platform", "orchestration", "task_runtime"):
            assert not {n for n in names if n.split(".")[0] == "pycompss"}, rel


def test_the_rank_runtime_knows_nothing_of_tasks():
    # it may place ranks by the device mechanism and build their environment (no tasks, no workflow)
    allowed = (f"{KIT}.rank_runtime", f"{KIT}.device", f"{KIT}.procenv")
    for file, names in imports_under(HPCDL / "platform" / "kit" / "rank_runtime").items():
        bad = sorted(n for n in names if not _within(n, allowed))
        assert not bad, f"hpcdl/{file} imports {bad}"


def test_importing_a_study_loads_no_task_backend():
    """Every module of every study imported in one fresh interpreter: nothing of the orchestration
    wing (the task runtime's backend detection and local pool, the CLI), PyCOMPSs or Snakemake."""
    modules = [f"hpcdl.studies.{s}" + ("" if f.stem == "__init__" else f".{f.stem}")
               for s in STUDIES for f in sorted((HPCDL / "studies" / s).glob("*.py"))
               # _preload: a forkserver preamble that ties the importing process to its parent
               if f.stem == "__init__" or not f.stem.startswith("_")]
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted(n for n in sys.modules if n.startswith(({ORCHESTRATION!r}, "
            "'pycompss', 'snakemake')))))")
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


def _task_bodies(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        decorators = node.decorator_list if isinstance(node, ast.FunctionDef) else []
        if any(isinstance(d, ast.Call) and getattr(d.func, "id", None) in ("task", "study_task")
               for d in decorators):
            yield node


def _called_studies_functions(body: ast.FunctionDef) -> set[str]:
    """Module attributes a task body calls or hands to its slot (slot.run(module.f, ...))."""
    used = set()
    for node in ast.walk(body):
        if isinstance(node, ast.Call):
            for target in [node.func, *node.args[:1]]:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id not in ("slot", "self"):
                    used.add(target.value.id)
    return used


def test_every_task_body_calls_its_studys_compute_module_only():
    """docs/architecture.md, "Adding a study": each task body calls one function of compute.py."""
    tasks = sorted((HPCDL.parent / "tasks").glob("*.py"))
    bodies = {(t.name, b.name): _called_studies_functions(b) for t in tasks for b in _task_bodies(t)}
    assert bodies, "no @task bodies found"
    bad = {k: v for k, v in bodies.items() if v - {"compute"}}
    assert not bad, f"task bodies calling other modules than compute: {bad}"


# -- the task apps' door -----------------------------------------------------------------------------

def test_task_apps_and_benchmarks_reach_the_platform_through_one_door():
    import hpcdl.platform.task_app as door

    repo = HPCDL.parent
    used = set()
    for folder in ("tasks", "benchmarks"):
        for f in sorted((repo / folder).glob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                deep = [n for n in names if _within(n, ("hpcdl.platform",)) and n != DOOR]
                assert not deep, f"{folder}/{f.name} imports {deep}: use `from {DOOR} import ...`"
                if isinstance(node, ast.ImportFrom) and node.module == DOOR:
                    used |= {a.name for a in node.names}
    assert used == set(door.EXPORTS), f"the door exports what nobody uses: {set(door.EXPORTS) - used}"
    assert door.__all__ == sorted(door.EXPORTS)
    checked = {}
    for node in ast.walk(ast.parse((HPCDL / "platform" / "task_app.py").read_text())):
        if isinstance(node, ast.ImportFrom) and _within(node.module, (KIT, ORCHESTRATION)):
            checked |= {a.asname or a.name: (node.module, a.name) for a in node.names}
    assert checked == door.EXPORTS  # type checkers see the same names from the same modules
    for name, (module, attr) in door.EXPORTS.items():
        if name != "BACKEND":  # asking for it chooses the backend; the door's own test is test_runtime's
            assert getattr(door, name) is getattr(__import__(module, fromlist=[attr]), attr)
    with pytest.raises(AttributeError, match="has no attribute 'task'"):
        door.task  # noqa: B018  (a task app decorates with study_task)
