# hpcdl: regenerate the studies' tables, figures and claims.
#   snakemake --cores 2 --configfile configs/default.yaml      (laptop scale)
#   snakemake --profile slurm --configfile configs/paper.yaml   (cluster, paper scale)
from snakemake.utils import min_version, validate

from hpcdl.config import ConfigError, validate_config, write_full_schema
from hpcdl.study import registered
from hpcdl.runtime.cluster import require_slurm_for

min_version("9.0")


configfile: "configs/default.yaml"


# Our validator first: its message names the key, the value and what is allowed.
try:
    CONFIG = validate_config(config)
except ConfigError as exc:
    raise ValueError(f"invalid configuration: {exc}") from None
# Snakemake's own check, on the schema completed from the study declarations.
validate(config, write_full_schema(f"{workflow.basedir}/.snakemake/hpcdl/schema.yaml"))
RESULTS = CONFIG["results_dir"]
# Task apps import `tasks` and `hpcdl` from this checkout, also inside conda envs and on cluster nodes.
# A prefix replaces Snakemake's default "set -euo pipefail; ", so it is restated: without pipefail a
# task app that dies inside `app | tee log` would leave the rule with tee's exit status 0.
shell.prefix(f"set -euo pipefail; export PYTHONPATH={workflow.basedir}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")


# Under the Slurm executor, fail before any job when Slurm is not reachable (instead of hanging).
onstart:
    require_slurm_for(workflow.executor_plugin.name if workflow.executor_plugin else None)


report: "workflows/report/workflow.rst"


include: "workflows/common.smk"


wildcard_constraints:
    study="|".join(CONFIG["studies"]) or "none",


# The study's slice of the validated config, as the file its app reads. Snakemake reruns a
# study when its params (its block) change, and only that study.
rule study_config:
    output:
        f"{RESULTS}/{{study}}/config.json",
    params:
        block=lambda wc: study_config(CONFIG, wc.study),
    log:
        f"{RESULTS}/{{study}}/logs/config.log",
    localrule: True
    conda:
        "envs/hpcdl.yaml"
    run:
        atomic_write_json(output[0], params.block)


STUDY_SPECS = registered()


include: "workflows/study.smk"


# ---- report front page (DESIGN.md §4): the verdict, embedded by workflows/report/workflow.rst ----
from hpcdl.verdict import write_verdict


# Each study's claims.json is downstream of its raw tables, run summary and sidecars, so depending on
# the claims alone reruns the verdict whenever anything it shows changes.
rule verdict:
    input:
        [f"{RESULTS}/{study}/claims.json" for study in CONFIG["studies"]],
    output:
        f"{RESULTS}/verdict.html",
    params:
        studies={study: STUDY_SPECS[study].title for study in CONFIG["studies"]},
    log:
        f"{RESULTS}/logs/verdict.log",
    localrule: True
    conda:
        "envs/hpcdl.yaml"
    run:
        write_verdict(RESULTS, params.studies, output[0])


# ---- end of the report front page ----


rule all:
    default_target: True
    input:
        rules.verdict.output,
        [getattr(rules, f"{study}_plot").output for study in CONFIG["studies"]],
        [getattr(rules, f"{study}_claims").output for study in CONFIG["studies"]],
