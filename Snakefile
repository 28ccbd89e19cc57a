# hpcdl: regenerate the studies' tables, figures and claims (docs/architecture.md, "Data flow").
#   snakemake --cores 2 --configfile configs/default.yaml      (laptop scale)
#   snakemake --profile slurm --configfile configs/paper.yaml   (cluster, paper scale)
# Every name the workflows/*.smk files use is defined here, before the first include.
import os

from snakemake.utils import min_version, validate

from hpcdl.platform.kit.atomic import json_text
from hpcdl.platform.kit.config import ConfigError, study_config, validate_config, write_full_schema
from hpcdl.platform.kit.study import registered
from hpcdl.platform.orchestration import gpu_records, wiring
from hpcdl.platform.orchestration.slurm import require_slurm_for
from hpcdl.platform.orchestration.verdict import write_verdict

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
# The declarations of the studies this config runs, in its order.
STUDY_SPECS = {name: registered()[name] for name in CONFIG["studies"]}
# What GPU runs measured, committed (hpcdl.platform.orchestration.gpu_records): shown beside this run,
# never in its verdict.
GPU_RECORDS = gpu_records.records_root(CONFIG)
# The config files as given (each study's report page names them as the run's setting).
CONFIG_FILES = wiring.config_files_shown(map(str, workflow.configfiles), os.getcwd())
# Every rule runs in this environment under --use-conda (path relative to workflows/).
CONDA_ENV = "../envs/hpcdl.yaml"
# Task apps import `tasks` and `hpcdl` from this checkout, also inside conda envs and on cluster nodes.
# A prefix replaces Snakemake's default "set -euo pipefail; ", so it is restated: without pipefail a
# task app that dies inside `app | tee log` would leave the rule with tee's exit status 0.
shell.prefix(f"set -euo pipefail; export PYTHONPATH={workflow.basedir}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")


# Under the Slurm executor, fail before any job when Slurm is not reachable (instead of hanging).
onstart:
    require_slurm_for(workflow.executor_plugin.name if workflow.executor_plugin else None)


report: "workflows/report/workflow.rst"


wildcard_constraints:
    study="|".join(STUDY_SPECS) or "none",


include: "workflows/common.smk"
include: "workflows/study.smk"
include: "workflows/verdict.smk"


rule all:
    default_target: True
    input:
        rules.verdict.output,
        [getattr(rules, f"{study}_figures").output for study in STUDY_SPECS],
        [getattr(rules, f"{study}_claims").output for study in STUDY_SPECS],
        [getattr(rules, f"{study}_about").output for study in STUDY_SPECS],
