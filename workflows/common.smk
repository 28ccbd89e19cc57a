# What every study shares: its config file, and the cores a run rule may take.
# Uses (from the Snakefile): CONFIG, RESULTS, CONDA_ENV, wiring, study_config, atomic_write_json.
from snakemake.exceptions import WorkflowError


def all_cores(default=2):
    """--cores locally; a fixed count under a cluster executor, where --cores is not given."""
    try:
        return workflow.cores
    except WorkflowError:
        return default


# The study's slice of the validated config, as the file its app and stages read. Snakemake reruns
# a study when its params (its block) change, and only that study.
rule study_config:
    output:
        wiring.study_config_path(RESULTS, "{study}"),
    params:
        block=lambda wc: study_config(CONFIG, wc.study),
    log:
        f"{RESULTS}/{{study}}/logs/config.log",
    localrule: True
    conda:
        CONDA_ENV
    run:
        atomic_write_json(output[0], params.block)
