# Helpers the rules share (functions only): the cores a run rule may take.
from snakemake.exceptions import WorkflowError


def all_cores(default=2):
    """--cores locally; a fixed count under a cluster executor, where --cores is not given."""
    try:
        return workflow.cores
    except WorkflowError:
        return default
