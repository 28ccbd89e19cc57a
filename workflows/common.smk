# Wiring shared by every study's workflow.
#
# A study <s> declares in workflows/<s>.smk:
#   rule <s>_run:       input  f"{RESULTS}/<s>/config.json"  (made by rule study_config below)
#                       shell  "{params.app} > {log} 2>&1" with params: app=task_app("<s>")
#                       output the raw tables under {RESULTS}/<s>/raw/
#   rule <s>_aggregate: shell  cli_step("aggregate", "<s>")  -> tables/*.csv
#   rule <s>_plot:      shell  cli_step("plot", "<s>")       -> figures/*.png, each wrapped in
#                       report(path, category=<study title>, caption="report/<s>/<figure>.rst")
#   rule <s>_claims:    shell  cli_step("claims", "<s>")     -> claims.json, claims.html (report())
from hpcdl.config import study_config
from hpcdl.io import atomic_write_json


wildcard_constraints:
    study="|".join(CONFIG["studies"]) or "none",


def study_cfg_path(study):
    return f"{RESULTS}/{study}/config.json"


def task_app(study):
    """Shell command running the study's PyCOMPSs app (local backend or runcompss)."""
    from hpcdl.runtime.compss import task_app_command

    return task_app_command(study, study_cfg_path(study), CONFIG)


def cli_step(step, study):
    return f"python -m hpcdl.cli {step} {study} --config {study_cfg_path(study)} > {{log}} 2>&1"


# The study's slice of the validated config, as the file its app reads. Snakemake reruns a
# study when its params (its block) change, and only that study.
rule study_config:
    output:
        f"{RESULTS}/{{study}}/config.json",
    params:
        block=lambda wc: study_config(CONFIG, wc.study),
    localrule: True
    run:
        atomic_write_json(output[0], params.block)
