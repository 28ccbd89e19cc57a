"""Study declarations (hpcdl/platform/kit/study.py): every registered study is complete, nothing drifts from
its declaration, and a new study needs only its own files."""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcdl.platform.kit.config import load_config, load_schema, studies
from hpcdl.platform.kit.procenv import child_env
from hpcdl.platform.kit.study import StudySpec, registered

REPO = Path(__file__).resolve().parent.parent
SPECS = registered()


def test_the_studies_are_the_declared_ones():
    # Every package that declares a study is registered (a new study adds itself; no list to edit here).
    declaring = sorted(p.parent.name for p in (REPO / "hpcdl" / "studies").glob("*/__init__.py")
                       if "StudySpec(" in p.read_text())
    assert list(studies()) == list(SPECS) == declaring
    assert {"checkpoint", "hpo", "shuffle", "spatial"} <= set(studies())  # none of today's lost
    schema = load_schema()
    assert schema["properties"]["studies"]["items"]["enum"] == list(studies())
    for name in studies():
        assert schema["properties"][name]["$ref"].endswith(f"configs/schema/{name}.yaml")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_registered_study_has_all_its_files(name):
    spec = SPECS[name]
    assert isinstance(spec, StudySpec) and spec.name == name and spec.title
    assert (REPO / "configs" / "schema" / f"{name}.yaml").is_file()
    assert (REPO / "tasks" / f"{name}.py").is_file()
    assert (REPO / "tests" / f"test_{name}.py").is_file(), "every study has a test module"
    for stage, entry in (("tables", "write"), ("figures", "draw"), ("claims", "judge")):
        tree = ast.parse((REPO / "hpcdl" / "studies" / name / f"{stage}.py").read_text())
        assert entry in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, (stage, entry)
    for kind in ("raw_tables", "tables", "figures"):
        names = getattr(spec, kind)
        assert names and len(set(names)) == len(names), (kind, names)
    for config in ("default", "paper", "test"):
        assert name in yaml.safe_load((REPO / "configs" / f"{config}.yaml").read_text()), config


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_study_declares_its_question_headline_and_setting(name):
    spec = SPECS[name]
    assert spec.question.endswith("?") and len(spec.question.split()) >= 10, spec.question
    assert spec.headline in spec.figures, spec.headline
    for config in ("default", "paper", "test"):
        cfg = load_config(REPO / "configs" / f"{config}.yaml")
        assert len(spec.setting(cfg).split()) >= 4, (config, spec.setting(cfg))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_figure_has_a_caption_and_no_caption_is_orphaned(name):
    spec = SPECS[name]
    for figure in spec.figures:
        caption = spec.caption(figure)
        assert caption.is_file() and caption.read_text().strip(), f"{name}: figure {figure} has no caption"
    assert (REPO / "workflows" / "report" / name / "claims.rst").read_text().strip()
    on_disk = {p.stem for p in (REPO / "workflows" / "report" / name).glob("*.rst")}
    assert on_disk == {*spec.figures, "claims"}, f"captions without a figure: {on_disk - set(spec.figures)}"


def test_the_figures_stage_names_no_figure_the_spec_does_not_declare():
    """Static check on the figure file names each figures stage writes (the workflow test checks
    the files)."""
    for name, spec in SPECS.items():
        tree = ast.parse((REPO / "hpcdl" / "studies" / name / "figures.py").read_text())
        # literal names only: a formatted name (f"{kind}_scaling.png") is checked by the workflow test
        in_fstrings = {id(c) for j in ast.walk(tree) if isinstance(j, ast.JoinedStr) for c in j.values}
        written = {node.value.removesuffix(".png") for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)
                   and node.value.endswith(".png") and id(node) not in in_fstrings}
        assert written <= set(spec.figures), (name, written - set(spec.figures))


def test_run_rule_resources_follow_the_config():
    cfg = load_config(REPO / "configs" / "test.yaml")
    cfg["checkpoint"]["dcp_ranks"] = [1, 4]
    cfg["checkpoint"]["sizes"]["max_params"] = 64 * 2**20 // 4 * 8  # 512 MiB of fp32
    res = SPECS["checkpoint"].run_resources(cfg)
    assert res == {"mem_mb": 2560, "runtime": 60, "tasks": 4, "mpi": "srun"}
    cfg["shuffle"]["grids"] = [{"world_sizes": [2, 8], "qs": [0], "partitionings": ["random"]}]
    assert SPECS["shuffle"].run_resources(cfg)["tasks"] == 8
    assert SPECS["shuffle"].task_units(cfg) == 8
    cfg["spatial"]["strong"]["layouts"] = [[1, 1, 1], [1, 2, 2]]
    cfg["spatial"]["threads_per_rank"] = 2
    assert SPECS["spatial"].run_resources(cfg)["tasks"] == 4
    assert SPECS["spatial"].task_units(cfg) == 8
    cfg["hpo"]["grid"]["workers"], cfg["hpo"]["workers"] = [1, 3], 2
    assert SPECS["hpo"].run_threads(cfg) == 3 and SPECS["checkpoint"].run_threads(cfg) is None
    cfg["hpo"]["computing_units"] = "$SLURM_CPUS_PER_TASK"
    assert SPECS["hpo"].task_units(cfg) == "$SLURM_CPUS_PER_TASK"


def test_a_bad_declaration_is_refused(tmp_path, monkeypatch):
    pkg = tmp_path / "hpcdl_fake"
    (pkg / "wrong").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "wrong" / "__init__.py").write_text(
        "from hpcdl.platform import StudySpec\nSPEC = StudySpec(\n"
        "    'other', 't', ('r',), ('t',), ('f',), lambda c: 1, lambda c: {})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import hpcdl.platform.kit.study as study
    import hpcdl.studies

    monkeypatch.setattr(hpcdl.studies, "__path__", [str(pkg)])
    monkeypatch.setitem(sys.modules, "hpcdl.studies.wrong", None)
    monkeypatch.delitem(sys.modules, "hpcdl.studies.wrong")
    with pytest.raises(TypeError, match=r"hpcdl/studies/wrong/__init__.py: SPEC must be a StudySpec "
                                        r"named 'wrong'"):
        study._discover()
    # A headline that is not one of the study's figures.
    (pkg / "wrong" / "__init__.py").write_text(
        "from hpcdl.platform import StudySpec\nSPEC = StudySpec(\n"
        "    'wrong', 't', ('r',), ('t',), ('f',), lambda c: 1, lambda c: {}, headline='g')\n")
    monkeypatch.delitem(sys.modules, "hpcdl.studies.wrong")
    with pytest.raises(TypeError, match=r"SPEC.headline 'g' is not one of its figures \('f',\)"):
        study._discover()


# A toy study written only into its own files, in a copy of the repository.
TOY_FILES = {
    "hpcdl/studies/toy/__init__.py": '''"""Toy study: squares of the configured numbers."""
from hpcdl.platform import StudySpec

SPEC = StudySpec(name="toy", title="Toy study", raw_tables=("points",), tables=("squares",),
                 figures=("squares",), task_units=lambda cfg: 1,
                 run_resources=lambda cfg: {"mem_mb": 500, "runtime": 5})
''',
    "hpcdl/studies/toy/tables.py": '''from pathlib import Path

from hpcdl.platform import read_table, write_table


def write(cfg, study_dir):
    df = read_table(Path(study_dir) / "raw" / "points.csv")
    write_table(df.sort_values("x"), Path(study_dir) / "tables" / "squares.csv", cfg, 0.0)
''',
    "hpcdl/studies/toy/figures.py": '''from pathlib import Path

from hpcdl.platform import pyplot, read_table, save_figure


def draw(cfg, study_dir):
    df = read_table(Path(study_dir) / "tables" / "squares.csv")
    fig, ax = pyplot().subplots()
    ax.plot(df["x"], df["y"], "o-")
    save_figure(fig, Path(study_dir) / "figures" / "squares.png")
''',
    "hpcdl/studies/toy/claims.py": '''from pathlib import Path

from hpcdl.platform import claim, deterministic, read_table

CLAIMS = ("squares_grow",)
CONFIRMATION = {"squares_grow": deterministic("y = x^2 of the configured xs: no seed decides it")}


def judge(cfg, study_dir):
    df = read_table(Path(study_dir) / "tables" / "squares.csv")
    grows = bool(df["y"].is_monotonic_increasing)
    return [claim("squares_grow", "y = x^2 grows with x", grows, y=df["y"].tolist())]
''',
    "tasks/toy.py": '''"""Toy study as a PyCOMPSs application."""
import pandas as pd

from hpcdl.platform.task_app import compss_wait_on, start_app, study_task, write_table


@study_task("toy", gpus=False)
def square(x):
    return {"x": x, "y": x * x}


def main(argv=None):
    run = start_app("toy", argv, __doc__)
    rows = compss_wait_on([square(x) for x in run.cfg["toy"]["xs"]])
    write_table(pd.DataFrame(rows), run.raw / "points.csv", run.cfg, run.started)
    run.write_summary({"ok": len(rows), "failed": 0, "skipped": 0, "total": len(rows)})


if __name__ == "__main__":
    main()
''',
    "configs/schema/toy.yaml": '''$schema: "https://json-schema.org/draft/2020-12/schema"
type: object
default: {}
additionalProperties: false
properties:
  runtime: {enum: [local, compss], default: local}
  xs: {type: array, items: {type: integer}, default: [1, 2, 3]}
''',
    "workflows/report/toy/squares.rst": "y = x squared: the curve rises.\n",
    "workflows/report/toy/claims.rst": "The toy study's claims.\n",
    "tests/test_toy.py": "def test_nothing_to_see():\n    assert 2 * 2 == 4\n",
}


@pytest.mark.slow
def test_a_new_study_needs_only_its_own_files(tmp_path):
    """Copy the tree, add the toy study's files and a config block: the workflow runs it."""
    copy = tmp_path / "repo"
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, tracked):
        if (REPO / rel).is_file():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, copy / rel)
    # Two toy studies, so a rule that ran another study's command would show.
    for name in ("toy", "toy2"):
        for rel, text in TOY_FILES.items():
            target = copy / rel.replace("toy", name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text.replace('"toy"', f'"{name}"').replace("TOY_UNITS", f"{name.upper()}_UNITS")
                              .replace("Toy study", f"{name} study"))
    config = tmp_path / "toy.yaml"
    config.write_text(f"results_dir: {tmp_path / 'results'}\nstudies: [toy, toy2]\ntoy: {{xs: [3, 1, 2]}}\n"
                      "toy2: {xs: [5, 4]}\n")
    env = child_env(copy, drop=[REPO], HPCDL_PROGRESS="0",
                    PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    # 2 cores, as `make figures` here: the two toy studies' jobs run side by side
    run = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(copy / "Snakefile"), "--directory",
                          str(copy), "--cores", "2", "--configfile", str(config)], cwd=copy, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    toy = tmp_path / "results" / "toy"
    assert (toy / "figures" / "squares.png").read_bytes()[:4] == b"\x89PNG"
    doc = json.loads((toy / "claims.json").read_text())
    assert [c["id"] for c in doc["claims"]] == ["squares_grow"] and doc["claims"][0]["status"] == "passed"
    table = (toy / "tables" / "squares.csv").read_text().split()
    assert table == ["x,y", "1,1", "2,4", "3,9"]
    toy2 = tmp_path / "results" / "toy2"
    assert (toy2 / "tables" / "squares.csv").read_text().split() == ["x,y", "4,16", "5,25"]
    assert json.loads((toy2 / "claims.json").read_text())["study"] == "toy2"
    cli = subprocess.run([sys.executable, "-m", "hpcdl", "toy", "figures", "--config", str(config)],
                         cwd=copy, env=env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_caption_is_clean_restructuredtext(name, tmp_path):
    """Snakemake renders captions with Jinja2, then docutils: a stray |word| is a substitution reference,
    and the report then prints an error in place of the sentence. A figure's caption includes the run's
    part, written by the figures stage (hpcdl.platform.orchestration.captions): rendered here as the
    report renders it, with that part written for this study."""
    from docutils import nodes
    from docutils.core import publish_doctree
    from jinja2 import Environment

    from hpcdl.platform.orchestration import captions

    results = tmp_path / "results"
    cfg = {"results_dir": str(results), name: load_config(REPO / "configs" / "test.yaml")[name]}
    captions.write(SPECS[name], cfg, results / name, ["configs/test.yaml"])
    snakemake = type("Snakemake", (), {"config": {"results_dir": str(results)}})
    for path in sorted((REPO / "workflows" / "report" / name).glob("*.rst")):
        text = Environment(trim_blocks=True, lstrip_blocks=True).from_string(path.read_text()).render(
            snakemake=snakemake)
        tree = publish_doctree(text, settings_overrides={
            "report_level": 2, "halt_level": 5, "warning_stream": io.StringIO()})
        # parse and transform messages (an undefined substitution is found by a transform)
        messages = [*tree.findall(nodes.system_message), *tree.transform_messages]
        problems = [m.astext() for m in messages if m["level"] >= 2]
        assert not problems, f"{path.relative_to(REPO)}: {problems}"


# --------------------------------------------------------------- captions follow the run (#31)
# A caption says what to look at; an outcome comes from this run's claims and figures. These are the
# ways a caption has stated an outcome fixed before the run.
OUTCOME_PHRASES = (r"\bthe reader should see\b", r"\busually\b", r"\bshould sit\b",
                   r"\balways (wins|beats)\b", r"\bstays? (about )?level\b", r"\bsits? on (the|every)\b",
                   r"\bis close to global\b",
                   # the run's setting stated as fixed: its device, cores and scale are the run's (#41)
                   r"\b(on|under|with) \d+ (cpu )?cores\b", r"\b(laptop|paper|test) scale\b",
                   r"\bsingle memory tier\b", r"\bthis machine has\b",
                   # a measured quantity written in: a number with the unit of an outcome
                   r"(?<![\w.])\d+(\.\d+)?\s?(x|×)\s+(more|fewer|faster|slower|speedup|larger|smaller)\b",
                   r"(?<![\w.])\d+(\.\d+)?\s?%\s+(faster|slower|more|less|fewer|error|of the)\b",
                   r"(?<![\w.])\d+(\.\d+)?\s?(ms|s|seconds|minutes|MB/s|GB/s|MiB/s)\s+(per|faster|slower|"
                   r"saved|lost)\b")


def _captions(name: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((REPO / "workflows" / "report" / name).glob("*.rst"))}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_claims_caption_names_every_claim_the_study_can_emit(name):
    import importlib
    import re

    ids = importlib.import_module(f"hpcdl.studies.{name}.claims").CLAIMS
    text = _captions(name)["claims.rst"]
    absent = [c for c in ids if f"``{c}``" not in text]
    assert not absent, f"workflows/report/{name}/claims.rst does not name {absent}"
    others = {c for s in SPECS if s != name
              for c in importlib.import_module(f"hpcdl.studies.{s}.claims").CLAIMS}
    named = set(re.findall(r"``([^`]+)``", text))
    assert not named & others, f"{name}'s claims caption names another study's claims {named & others}"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_no_caption_states_an_outcome_or_quotes_a_threshold(name):
    import re

    cfg = load_config(REPO / "configs" / "default.yaml")[name]
    thresholds = [v for v in (cfg.get("claims") or {}).values()
                  if isinstance(v, float) and not float(v).is_integer()]
    for file, text in _captions(name).items():
        flat = " ".join(text.split())
        for phrase in OUTCOME_PHRASES:
            assert not re.search(phrase, flat, re.I), f"{name}/{file} states an outcome: {phrase}"
        for v in thresholds:  # the threshold is the config's: a caption quoting it goes stale
            shown = [f"{v:g}"] + ([f"{100 * v:g} %", f"{100 * v:g}%"] if v < 1 else [])
            quoted = [s for s in shown if re.search(rf"(?<![\d.]){re.escape(s)}(?![\d])", flat)]
            assert not quoted, f"{name}/{file} quotes the threshold {v:g} of {name}.claims as {quoted}"


def test_adding_a_study_lists_exactly_the_fields_of_studyspec():
    """docs/architecture.md, "Adding a study", is the one description of a study's declaration: its
    field table names every StudySpec field, and nothing else."""
    import dataclasses
    import re

    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index("## Adding a study"):]
    section = section[:section.find("\n## ", 5)] if "\n## " in section[5:] else section
    documented = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert documented == [f.name for f in dataclasses.fields(StudySpec)]
    readme = (REPO / "README.md").read_text()
    assert "## Adding a study" not in readme and "docs/architecture.md" in readme
