"""Study declarations: each study says once what it is; the platform derives everything else.

A study is a package `hpcdl/studies/<name>/` whose `__init__.py` defines `SPEC = StudySpec(...)`.
From the registered specs come the list of studies (hpcdl.platform.kit.config.studies), the config
schema's study enum and `$ref`s (hpcdl.platform.kit.config.load_schema), the CLI's choices
(hpcdl.platform.orchestration.cli) and the Snakemake rules (workflows/study.smk: run -> tables ->
figures -> claims for every study). A study's other files follow from its name
(docs/architecture.md, "Adding a study").

A study may also set its results beside the papers' (resources/papers.yaml): `StudySpec.paper` gives,
per published id, an `Ours` saying which of this run's tables or claims holds our number and how to
compare it; hpcdl.platform.orchestration.paper_vs_ours builds the rows. `RunFiles` is what such a
mapping reads.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
# The longest report category (StudySpec.short_title): the menu keeps to a quarter of a 1280 px window.
MENU_CHARS = 40


@dataclass(frozen=True)
class RunFiles:
    """What a paper mapping reads of one run of a study: its derived tables (this run's tables/, or a
    committed GPU record's folder, where they lie flat), its claims and the device it was measured on
    ("GPU: <model>", "CPU: <model> (<n> cores)", or "" where unknown)."""

    tables: Path | None
    claims: tuple[dict, ...] = ()
    device: str = ""

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("GPU")

    def table(self, name: str):
        """The table `<name>.csv` as a DataFrame; empty where the run has none or it does not parse."""
        import pandas as pd

        path = self.tables / f"{name}.csv" if self.tables is not None else None
        if path is None or not path.is_file():
            return pd.DataFrame()
        try:
            return pd.read_csv(path)
        except (OSError, ValueError, pd.errors.EmptyDataError):
            return pd.DataFrame()

    def claims_named(self, name: str) -> list[dict]:
        """The claims with id `name`, where a `{M}` in it stands for any number (as CLAIMS declares)."""
        from hpcdl.platform.kit.claims import declared

        return [c for c in self.claims if declared(c["id"], [name])]

    def claim_measured(self, name: str, key: str):
        """(the first claim named `name`, its measured `key`, or None where it has none); (None, None)
        where the run has no such claim."""
        found = self.claims_named(name)
        if not found:
            return None, None
        return found[0], (found[0].get("measured") or {}).get(key)


@dataclass(frozen=True)
class Ours:
    """How one published result is set beside a run (hpcdl.platform.orchestration.paper_vs_ours).
    Exactly one way:

    `value`    run -> {"value": float[, "interval": (low, high)][, "setting": str]
               [, "setting_fields": {key: value}][, "mechanism_differs": why]} (our number), or
               {"missing": why}, {"unreproducible": why} (this run's hardware cannot), or None (the
               run has nothing of `source`); compared with the paper's value by `tolerance` (within
               N %) and then `line` (the same side of it as the paper's value: the direction; a line
               the baseline itself does not cross: a claim's own threshold, never 1 for a quantity any
               variant exceeds). `setting_fields` name our setting by the keys of the published
               entry's `setting`; where one of `essential` differs, or the run says `setting_differs`
               (e.g. a simulated reference where the paper measured hardware), the row reads "other
               setting", and `mechanism_differs` (e.g. no kernel divided by a micro-batching plan)
               "other mechanism", neither ever green; a `line` read from the run (a claim's own
               threshold) takes the place of the declared one;
    `claims`   a qualitative result: its verdict follows these claims of the run (all passed: reproduced
               in direction; one failed: not reproduced; one straddles: undecided; else not measured);
    `context`  a setting or definition, not a result: what ours is, no verdict.
    `unreproducible` says why no run of this study can reproduce it (e.g. 2048 GPUs). `rests_on` names
    the claims a `value` row's number rests on (in this run and in a GPU record): a failed one caps
    the row at "not reproduced", a straddling one at "undecided", a not-measured one at "not yet
    measured", whatever the number. The comparison is shown, never fed back into a model or a
    threshold.
    """

    source: str                                  # which table / claim / column of a run gives ours
    value: Callable[[RunFiles], dict | None] | None = None
    tolerance: float | None = None               # within N %: |ours / paper - 1| <= tolerance
    line: float | None = None                    # the direction: paper and ours on the same side of it
    better: str | None = None                    # "higher" / "lower": beyond the paper this way is within
    claims: tuple[str, ...] = ()
    context: str = ""
    unreproducible: str = ""
    oracle: Callable[[RunFiles], dict | None] | None = None  # a model's prediction: {"value", "setting"}
    setting: str = ""                            # our setting in words, where `value` gives none
    rests_on: tuple[str, ...] = ()               # the claims the number rests on: their statuses cap it
    essential: tuple[str, ...] = ()              # published setting keys that must match for a verdict

    def __post_init__(self):
        ways = [self.value is not None, bool(self.claims), bool(self.context), bool(self.unreproducible)]
        if sum(ways[:3]) > 1 or not any(ways):
            raise ValueError(f"Ours({self.source!r}): give one of value, claims or context "
                             "(or unreproducible)")
        if self.better not in (None, "higher", "lower"):
            raise ValueError(f"Ours({self.source!r}): better must be 'higher' or 'lower', "
                             f"not {self.better!r}")


@dataclass(frozen=True)
class StudySpec:
    name: str
    title: str                      # the study's full title, heading its about page
    raw_tables: tuple[str, ...]     # written by tasks/<name>.py under raw/
    tables: tuple[str, ...]         # written by the tables stage under tables/
    figures: tuple[str, ...]        # written by the figures stage under figures/, one caption each
    # cfg -> cores each task reserves: an int, or a "$VAR" setting
    # (hpcdl.platform.orchestration.task_runtime.units); `computing_units_of(name)` reads the block's own
    task_units: Callable[[dict], int | str]
    # cfg -> resources of the run rule: mem_mb, runtime (minutes), and for multi-rank studies
    # tasks (the largest rank count) with mpi="srun"
    run_resources: Callable[[dict], dict]
    # The devices its compute code runs on (hpcdl.platform.kit.device): `auto` picks CUDA only where
    # the study has a CUDA path, and `device: cuda` for one without is a config error.
    devices: tuple[str, ...] = ("cpu",)
    # cfg -> GPUs each task holds when the study's device resolves to cuda (0: its tasks use none).
    # A multi-rank task holds one GPU per rank (hpcdl.platform.kit.device: one rank per GPU).
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
    # The report's menu entry (its category): a few words; the full title heads the about page. Empty:
    # the title.
    short_title: str = ""
    # The report's introduction of the study (hpcdl.platform.orchestration.about): the seed's question in one
    # sentence, the figure that answers it (one of `figures`, listed first), and cfg -> this run's
    # sizes in a phrase
    question: str = ""
    headline: str = ""
    setting: Callable[[dict], str] = field(default=lambda cfg: "")
    # () -> {published id: Ours}: how each of the study's published results (resources/papers.yaml) is
    # set beside this run's numbers (hpcdl.platform.orchestration.paper_vs_ours); a callable, so the
    # mapping's module is imported only when a page needs it. None: the `PAPER` of the study's own
    # paper.py, where it has one
    paper: Callable[[], Mapping[str, Ours]] | None = None
    # Which paper figure each of ours re-draws (its about page lists them): our figure name (one of
    # `figures`) -> "<paper>, Fig. N: what it plots; what differs in our axes or setting", or "no direct
    # counterpart identified in <paper>: ..." where the paper's figure is not known (never a guessed
    # number). A key that is not one of `figures` names a paper figure with no counterpart here; its
    # value says why.
    paper_figures: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.paper is None:  # frozen: set once, here
            object.__setattr__(self, "paper", partial(_own_paper, self.name))

    @property
    def category(self) -> str:
        """The study's report category, as the menu lists it: its short title (else its title)."""
        return self.short_title or self.title

    def caption(self, figure: str) -> Path:
        return REPO_ROOT / "workflows" / "report" / self.name / f"{figure}.rst"


def computing_units_of(study: str) -> Callable[[dict], int | str]:
    """A `task_units` that gives the study block's `computing_units` setting: an int, or a "$VAR"
    string the task runtime reads where the tasks run."""
    def units(cfg: dict) -> int | str:
        value = cfg[study]["computing_units"]
        return int(value) if str(value).isdigit() else value

    return units


def _own_paper(study: str) -> Mapping[str, Ours]:
    """The `PAPER` mapping of hpcdl/studies/<study>/paper.py; {} for a study without one."""
    try:
        module = importlib.import_module(f"hpcdl.studies.{study}.paper")
    except ModuleNotFoundError as exc:
        if exc.name not in (f"hpcdl.studies.{study}", f"hpcdl.studies.{study}.paper"):
            raise  # the module exists and fails to import: say so
        return {}
    return module.PAPER


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
        if len(spec.category) > MENU_CHARS:
            raise TypeError(f"hpcdl/studies/{info.name}/__init__.py: the report menu lists the study as "
                            f"{spec.category!r}, over {MENU_CHARS} characters: set SPEC.short_title")
        same = [s.name for s in specs.values() if s.category == spec.category]
        if same:
            raise TypeError(f"hpcdl/studies/{info.name}/__init__.py: study {same[0]} has the same report "
                            f"category {spec.category!r}: give each a short_title of its own")
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
