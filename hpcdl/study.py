"""Study declarations: each study says once what it is; the platform derives everything else.

A study is a package `hpcdl/<name>/` whose `__init__.py` defines `SPEC = StudySpec(...)`. From
the registered specs come the list of studies (hpcdl.config.STUDIES), the config schema's study
enum and `$ref`s (hpcdl.config.full_schema), the CLI's choices (hpcdl.cli) and the Snakemake rules
(workflows/study.smk: run -> aggregate -> plot -> claims for every study). A study's other files
follow from its name: tasks/<name>.py, configs/schema/<name>.yaml, hpcdl/<name>/analysis.py,
workflows/report/<name>/<figure>.rst and claims.rst (captions), tests/test_<name>.py, and a
`<name>:` block in each config.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class StudySpec:
    name: str
    title: str                      # the report category
    raw_tables: tuple[str, ...]     # written by tasks/<name>.py under raw/
    tables: tuple[str, ...]         # written by analysis.aggregate under tables/
    figures: tuple[str, ...]        # written by analysis.plot under figures/, one caption each
    # cfg -> cores each task reserves: an int, or a "$VAR" setting (hpcdl.runtime.units)
    task_units: Callable[[dict], int | str]
    # cfg -> resources of the run rule: mem_mb, runtime (minutes), and for multi-rank studies
    # tasks (the largest rank count) with mpi="srun"
    run_resources: Callable[[dict], dict]
    # cfg -> threads of the run rule; None: every core Snakemake has
    run_threads: Callable[[dict], int | None] = field(default=lambda cfg: None)

    def caption(self, figure: str) -> Path:
        return REPO_ROOT / "workflows" / "report" / self.name / f"{figure}.rst"


def _discover() -> dict[str, StudySpec]:
    import hpcdl

    specs = {}
    for info in sorted(pkgutil.iter_modules(hpcdl.__path__), key=lambda i: i.name):
        init = Path(hpcdl.__path__[0]) / info.name / "__init__.py"
        # Import only packages that declare a study (others, e.g. hpcdl.models, load torch).
        if not info.ispkg or "StudySpec(" not in init.read_text():
            continue
        spec = getattr(importlib.import_module(f"hpcdl.{info.name}"), "SPEC", None)
        if spec is None:
            continue
        if not isinstance(spec, StudySpec) or spec.name != info.name:
            raise TypeError(f"hpcdl/{info.name}/__init__.py: SPEC must be a StudySpec named {info.name!r}")
        specs[spec.name] = spec
    return specs


@cache
def registered() -> dict[str, StudySpec]:
    """Every declared study, by name, in name order."""
    return _discover()


def spec(name: str) -> StudySpec:
    specs = registered()
    if name not in specs:
        raise KeyError(f"no study named {name!r}; registered: {', '.join(specs)}")
    return specs[name]
