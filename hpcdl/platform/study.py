"""Study declarations: each study says once what it is; the platform derives everything else.

A study is a package `hpcdl/studies/<name>/` whose `__init__.py` defines `SPEC = StudySpec(...)`.
From the registered specs come the list of studies (hpcdl.platform.config.STUDIES), the config
schema's study enum and `$ref`s (hpcdl.platform.config.full_schema), the CLI's choices
(hpcdl.platform.cli) and the Snakemake rules (workflows/study.smk: run -> tables -> figures ->
claims for every study). A study's other files follow from its name (docs/architecture.md,
"Adding a study").
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class StudySpec:
    name: str
    title: str                      # the report category
    raw_tables: tuple[str, ...]     # written by tasks/<name>.py under raw/
    tables: tuple[str, ...]         # written by the tables stage under tables/
    figures: tuple[str, ...]        # written by the figures stage under figures/, one caption each
    # cfg -> cores each task reserves: an int, or a "$VAR" setting (hpcdl.platform.task_runtime.units)
    task_units: Callable[[dict], int | str]
    # cfg -> resources of the run rule: mem_mb, runtime (minutes), and for multi-rank studies
    # tasks (the largest rank count) with mpi="srun"
    run_resources: Callable[[dict], dict]
    # The devices its compute code runs on (hpcdl.platform.device): `auto` picks CUDA only where
    # the study has a CUDA path, and `device: cuda` for one without is a config error.
    devices: tuple[str, ...] = ("cpu",)
    # cfg -> GPUs each task holds when the study's device resolves to cuda (0: its tasks use none).
    # A multi-rank task holds one GPU per rank (hpcdl.platform.device: one rank per GPU).
    task_gpus: Callable[[dict], int] = field(default=lambda cfg: 0)
    # cfg -> GPUs its run job needs at once on CUDA, where GPU tasks run side by side (the HPO
    # study's concurrent trials); None: one GPU task at a time, task_gpus
    job_gpus: Callable[[dict], int] | None = None
    # cfg -> threads of the run rule; None: every core Snakemake has
    run_threads: Callable[[dict], int | None] = field(default=lambda cfg: None)
    # cfg -> files besides the raw tables that the task app writes and a later stage reads
    # (e.g. an Optuna journal the figures load): outputs of the run rule, inputs of the stages
    run_files: Callable[[dict], tuple[str, ...]] = field(default=lambda cfg: ())
    # cfg -> files no rule makes that the stages read (e.g. a committed GPU calibration), relative to
    # the workflow's directory: inputs of the stages, so adding or changing one reruns them
    stage_files: Callable[[dict], tuple[str, ...]] = field(default=lambda cfg: ())
    # The report's introduction of the study (hpcdl.platform.about): the seed's question in one
    # sentence, the figure that answers it (one of `figures`, listed first), and cfg -> this run's
    # sizes in a phrase
    question: str = ""
    headline: str = ""
    setting: Callable[[dict], str] = field(default=lambda cfg: "")

    def caption(self, figure: str) -> Path:
        return REPO_ROOT / "workflows" / "report" / self.name / f"{figure}.rst"


def _discover() -> dict[str, StudySpec]:
    # By name, not by import statement: the platform knows no study (docs/architecture.md, "Layers").
    studies = importlib.import_module("hpcdl.studies")
    specs = {}
    for info in sorted(pkgutil.iter_modules(studies.__path__), key=lambda i: i.name):
        init = Path(studies.__path__[0]) / info.name / "__init__.py"
        if not info.ispkg or "StudySpec(" not in init.read_text():
            continue
        spec = getattr(importlib.import_module(f"hpcdl.studies.{info.name}"), "SPEC", None)
        if spec is None:
            continue
        if not isinstance(spec, StudySpec) or spec.name != info.name:
            raise TypeError(f"hpcdl/studies/{info.name}/__init__.py: SPEC must be a StudySpec "
                            f"named {info.name!r}")
        if spec.headline and spec.headline not in spec.figures:
            raise TypeError(f"hpcdl/studies/{info.name}/__init__.py: SPEC.headline {spec.headline!r} is "
                            f"not one of its figures {spec.figures}")
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
