"""The task runtime: the PyCOMPSs API surface the task apps use (docs/architecture.md, "Runtimes").

Under the COMPSs runtime (runcompss / enqueue_compss) these are the real PyCOMPSs objects; with
HPCDL_RUNTIME=pycompss outside it, the binding's own decorators in its sequential mode (tasks run
inline); otherwise a local backend (hpcdl.platform.orchestration.task_runtime.local) runs tasks in spawned
worker processes. hpcdl.platform.orchestration.task_runtime.backend says how the choice is made.

Nothing is detected when this package is imported: the backend is chosen the first time a task app
asks for one of the names below (`from hpcdl.platform.orchestration.task_runtime import task` does), and
BACKEND_INFO records the choice (provenance).
"""

from __future__ import annotations

from functools import cache

from hpcdl.platform.orchestration.task_runtime.backend import backend_info

API = ("task", "constraint", "on_failure", "compss_wait_on", "compss_barrier", "failure_reason",
       "set_local_cores", "IN", "OUT", "INOUT", "FILE_IN", "FILE_OUT", "FILE_INOUT", "COLLECTION_IN")
__all__ = ["BACKEND", "BACKEND_INFO", *API]


def _compss_api(backend: str) -> dict:
    from pycompss.api import parameter
    from pycompss.api.api import compss_barrier, compss_wait_on
    from pycompss.api.constraint import constraint
    from pycompss.api.on_failure import on_failure
    from pycompss.api.task import task

    def failure_reason(future) -> str | None:
        if backend == "pycompss-sequential":
            return None  # the binding's sequential mode raises a task's exception instead of IGNOREing it
        # COMPSs gives an IGNOREd task's default value without the exception; its job logs have it.
        return "task failed under COMPSs (see the job's .err log in the COMPSs log directory)"

    def set_local_cores(cores) -> None:
        """Worker counts come from the COMPSs resources: nothing to do."""

    directions = {name: getattr(parameter, name) for name in API if name.isupper()}
    return {"task": task, "constraint": constraint, "on_failure": on_failure,
            "compss_wait_on": compss_wait_on, "compss_barrier": compss_barrier,
            "failure_reason": failure_reason, "set_local_cores": set_local_cores, **directions}


def _local_api() -> dict:
    from hpcdl.platform.orchestration.task_runtime import local

    api = {name: getattr(local, name) for name in API if not name.isupper()}
    # The local backend passes arguments by value, so parameter directions only document intent.
    return api | {name: name for name in API if name.isupper()}


@cache
def _api() -> dict:
    backend = backend_info().name
    return _compss_api(backend) if backend in ("compss", "pycompss-sequential") else _local_api()


def __getattr__(name: str):
    if name == "BACKEND_INFO":
        return backend_info()
    if name == "BACKEND":
        return backend_info().name
    if name in API:
        return _api()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
