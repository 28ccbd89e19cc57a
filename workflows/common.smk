# Wiring shared by every study's rules (functions only). workflows/study.smk generates, for each
# registered study <s> (hpcdl/<s>/__init__.py SPEC), four rules with a log, threads, resources and
# `conda: CONDA_ENV`:
#   <s>_run        input {RESULTS}/<s>/config.json (from the Snakefile's study_config rule);
#                  shell "{params.app} 2>&1 | tee {log}" (progress on the terminal and in the log),
#                  params app=task_app("<s>"); output the raw tables under {RESULTS}/<s>/raw/
#   <s>_aggregate  params cmd=cli_step("aggregate", "<s>") -> tables/*.csv
#   <s>_plot       params cmd=cli_step("plot", "<s>") -> figures/*.png, each wrapped in
#                  report(path, category=<study title>, caption="report/<s>/<figure>.rst")
#   <s>_claims     params cmd=cli_step("claims", "<s>") -> claims.json, claims.html (in the report)
from snakemake.exceptions import WorkflowError

from hpcdl.config import study_config
from hpcdl.results import atomic_write_json

# Every rule runs in this environment under --use-conda (path relative to workflows/).
CONDA_ENV = "../envs/hpcdl.yaml"


def study_cfg_path(study):
    return f"{RESULTS}/{study}/config.json"


def task_app(study):
    """Shell command running the study's PyCOMPSs app (local backend or runcompss)."""
    from hpcdl.runtime.compss import task_app_command

    return task_app_command(study, study_cfg_path(study), CONFIG)


def all_cores(default=2):
    """--cores locally; a fixed count under a cluster executor, where --cores is not given."""
    try:
        return workflow.cores
    except WorkflowError:
        return default


def cli_step(step, study):
    """The analysis command of one step (a rule's params: its shell adds the log redirect)."""
    return f"python -m hpcdl.cli {step} {study} --config {study_cfg_path(study)}"
