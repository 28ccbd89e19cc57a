"""The files and commands of every study's rules, as plain functions of the results directory and
the study's declaration (docs/architecture.md, "Data flow"). workflows/*.smk only wire them.

Each rule lists every file its command reads, so Snakemake reruns it when one of them changes:

    <s>_run      config.json                        -> raw tables + their sidecars + run_summary.json
                                                       + device.json (the device, resolved once)
    <s>_tables   config.json + everything of _run   -> tables + their sidecars
    <s>_figures  config.json + raw + tables         -> figures + the run's part of each caption
    <s>_claims   config.json + raw + tables         -> claims.json, claims.html
    <s>_about    config.json + raw (+ claims, tables, the headline figure and its caption, in the rule)
                                                    -> about.html (the page opening the study)
    verdict      every study's claims.json + raw    -> verdict.html
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from hpcdl.platform.kit.study import StudySpec
from hpcdl.platform.kit.study_dir import StudyDir
from hpcdl.platform.orchestration import about, captions


def run_dir(results: str, study: str) -> StudyDir:
    """A study's run folder as the workflow names it, under `results` as given (relative where it is:
    Snakemake matches paths as written; a task app's own is absolute, hpcdl.platform.kit.config)."""
    return StudyDir(Path(results) / study)


def _strs(paths) -> list[str]:
    return [str(p) for p in paths]


def study_config_path(results: str, study: str) -> str:
    """The study's block of the validated config, the one file its app and stages read."""
    return str(run_dir(results, study).config)


def raw_files(results: str, spec: StudySpec, config: dict) -> list[str]:
    """What the task app writes (StudyDir.run_outputs): each raw table with its provenance sidecar,
    the run summary, the device record and the other files the study declares (StudySpec.run_files)."""
    return _strs(run_dir(results, spec.name).run_outputs(spec, config))


def table_files(results: str, spec: StudySpec) -> list[str]:
    """What the tables stage writes: each derived table with its provenance sidecar."""
    return _strs(run_dir(results, spec.name).table_outputs(spec))


def figure_files(results: str, spec: StudySpec) -> list[str]:
    return _strs(run_dir(results, spec.name).figure_outputs(spec))


def caption_files(results: str, spec: StudySpec) -> list[str]:
    """The run's part of each figure's caption, written by the figures stage
    (hpcdl.platform.orchestration.captions)."""
    return [str(captions.run_caption(run_dir(results, spec.name).root, f)) for f in spec.figures]


def headline_files(results: str, spec: StudySpec) -> list[str]:
    """What the about page shows of the headline figure: the PNG, the run's part of its caption and
    its caption file (what to look at, in this checkout); none where the study names no headline."""
    if not spec.headline:
        return []
    i = spec.figures.index(spec.headline)
    return [figure_files(results, spec)[i], caption_files(results, spec)[i], str(spec.caption(spec.headline))]


def stage_inputs(results: str, spec: StudySpec, config: dict, stage: str) -> list[str]:
    """Every file a stage may read (StudyDir.stage_inputs): the tables and about stages read the
    run's files, the figures and claims stages read those and the tables (a claim may need a raw
    column the tables left out)."""
    return _strs(run_dir(results, spec.name).stage_inputs(spec, config, stage))


def verdict_inputs(results: str, specs: list[StudySpec], config: dict) -> list[str]:
    """The verdict shows each study's claims, what ran (run summary) and provenance (sidecars)."""
    return [f for s in specs
            for f in (str(run_dir(results, s.name).claims_json), *raw_files(results, s, config))]


def config_files_shown(paths, workdir: str) -> list[str]:
    """The config files a workflow was given, each once (Snakemake lists the Snakefile's default
    both as given and resolved), relative to the working directory where they lie under it."""
    shown = {}
    for p in paths:
        resolved = os.path.realpath(os.path.join(workdir, p))
        rel = os.path.relpath(resolved, workdir)
        shown.setdefault(resolved, resolved if rel.startswith("..") else rel)
    return list(shown.values())


def about_file(results: str, spec: StudySpec) -> str:
    return str(run_dir(results, spec.name).about_html)


def report_label(spec: StudySpec, item: str) -> dict:
    """The report `labels` of a study's entry, which order its category
    (hpcdl.platform.orchestration.about)."""
    return {"item": about.report_label(spec, item)}


def stage_command(study: str, stage: str, config_path: str, config_files: list[str] = ()) -> str:
    """The shell command of one analysis stage (the rule adds its log redirect); the figures and about
    stages also name the config files the workflow was given (the run's scale, in captions and on the
    about page)."""
    shown = stage in ("figures", "about") and config_files
    extra = ["--config-files", *map(str, config_files)] if shown else []
    return shlex.join(["python", "-m", "hpcdl", study, stage, "--config", config_path, *extra])


GPU_PARTITION_VAR = "HPCDL_SLURM_GPU_PARTITION"


def run_gpus(spec: StudySpec, config: dict, environ=None) -> int:
    """GPUs the study's run rule asks the cluster for: its tasks' GPUs at once (StudySpec.job_gpus,
    else task_gpus) where its device is `cuda`, or `auto` with a GPU partition named
    ($HPCDL_SLURM_GPU_PARTITION: the jobs run where GPUs are); 0 for `cpu`, and for `auto` without a
    GPU partition. The host that submits the jobs is never asked: the device is resolved where the app
    runs (StudyRun.device), and a request decided from the submitting host would guess it."""
    from hpcdl.platform.kit.device import requested

    environ = os.environ if environ is None else environ
    want = requested(config, spec.name)
    if "cuda" not in spec.devices or want == "cpu":
        return 0
    if want == "auto" and not environ.get(GPU_PARTITION_VAR):
        return 0
    return int(spec.job_gpus(config) if spec.job_gpus else spec.task_gpus(config))


def run_resources(spec: StudySpec, config: dict, environ=None) -> dict:
    """The run rule's resources: the study's declaration, plus `gpu` (the Slurm plugin's --gpus) and
    the GPU partition ($HPCDL_SLURM_GPU_PARTITION, where set) when it runs on GPUs (`run_gpus`)."""
    environ = os.environ if environ is None else environ
    resources = dict(spec.run_resources(config))
    gpus = run_gpus(spec, config, environ)
    if gpus:
        resources["gpu"] = gpus
        if environ.get(GPU_PARTITION_VAR):
            resources["slurm_partition"] = environ[GPU_PARTITION_VAR]
    return resources


def task_app(study: str, config_path: str, config: dict) -> str:
    """The shell command running the study's PyCOMPSs app (local backend or runcompss)."""
    from hpcdl.platform.orchestration.task_runtime.compss import task_app_command

    return task_app_command(study, config_path, config)
