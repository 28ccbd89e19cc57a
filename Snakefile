# hpcdl: regenerate the studies' tables, figures and claims.
#   snakemake --cores 2 --configfile configs/default.yaml      (laptop scale)
#   snakemake --profile slurm --configfile configs/paper.yaml   (cluster, paper scale)
from pathlib import Path

from snakemake.utils import min_version, validate

from hpcdl.config import ConfigError, validate_config

min_version("9.0")


configfile: "configs/default.yaml"


# Our validator first: its message names the key, the value and what is allowed.
try:
    CONFIG = validate_config(config)
except ConfigError as exc:
    raise ValueError(f"invalid configuration: {exc}") from None
validate(config, "configs/schema.yaml")
RESULTS = CONFIG["results_dir"]


report: "workflows/report/workflow.rst"


include: "workflows/common.smk"


for _study in CONFIG["studies"]:

    include: f"workflows/{_study}.smk"


rule all:
    default_target: True
    input:
        [f"{RESULTS}/{study}/claims.json" for study in CONFIG["studies"]],
