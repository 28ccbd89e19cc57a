"""A study task's PyCOMPSs decorator stack in one line: `@study_task("offload")`.

Every task of a study holds the same resources, named by environment variables the runtime reads
when it starts (units.units_var, gpus.gpus_var): its computing units and, for a study with a CUDA
path, its GPUs. A failing task is IGNOREd and returns None, so the app writes the point as failed
and goes on. The stack is the binding's own decorators, applied in the order they would be stacked
by hand (task innermost), so tests/test_pycompss_conformance.py checks it against the vendored
binding as it checks a hand-written stack.
"""

from __future__ import annotations

from collections.abc import Callable

from hpcdl.platform.orchestration import task_runtime
from hpcdl.platform.orchestration.task_runtime.gpus import gpus_var
from hpcdl.platform.orchestration.task_runtime.units import units_var


def study_task(study: str, *, cpu_units: str | None = None, gpus: bool = True,
               on_failure: str = "IGNORE", returns: int = 1) -> Callable:
    """The task decorator of one of `study`'s tasks.

    cpu_units: the CPU computing units, default the study's variable ("$HPCDL_<STUDY>_UNITS");
    gpus: whether the task also holds the study's GPUs ("$HPCDL_<STUDY>_GPUS"), for studies with a
    CUDA path; on_failure: the binding's management, IGNORE (returns None) or FAIL (stops the app)."""
    cpu = cpu_units or f"${units_var(study)}"
    if gpus:
        resources = task_runtime.constraint(processors=[
            {"processorType": "CPU", "computingUnits": cpu},
            {"processorType": "GPU", "computingUnits": f"${gpus_var(study)}"}])
    else:
        resources = task_runtime.constraint(computing_units=cpu)
    if on_failure == "IGNORE":
        failure = task_runtime.on_failure(management="IGNORE", returns=None)
    else:  # stated: the binding's default would be RETRY
        failure = task_runtime.on_failure(management=on_failure)

    def decorate(function: Callable) -> Callable:
        return failure(resources(task_runtime.task(returns=returns)(function)))
    return decorate
