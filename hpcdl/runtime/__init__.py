"""The PyCOMPSs API surface the task apps use.

Under the COMPSs runtime (runcompss / enqueue_compss) these are the real PyCOMPSs objects; with
HPCDL_RUNTIME=pycompss outside it, the binding's own decorators in its sequential mode (tasks run
inline); otherwise a local backend (hpcdl.runtime.local) runs tasks in spawned worker processes.
hpcdl.runtime.backend says how the choice is made; BACKEND_INFO records it (provenance).
"""

from __future__ import annotations

from hpcdl.runtime.backend import detect

BACKEND_INFO = detect()
BACKEND = BACKEND_INFO.name

if BACKEND in ("compss", "pycompss-sequential"):
    from pycompss.api.api import compss_barrier, compss_wait_on
    from pycompss.api.constraint import constraint
    from pycompss.api.on_failure import on_failure
    from pycompss.api.parameter import (
        COLLECTION_IN,
        FILE_IN,
        FILE_INOUT,
        FILE_OUT,
        IN,
        INOUT,
        OUT,
    )
    from pycompss.api.task import task

    def failure_reason(future) -> str | None:
        if BACKEND == "pycompss-sequential":
            return None  # the binding's sequential mode raises a task's exception instead of IGNOREing it
        # COMPSs gives an IGNOREd task's default value without the exception; its job logs have it.
        return "task failed under COMPSs (see the job's .err log in the COMPSs log directory)"

    def set_local_cores(cores) -> None:
        """Worker counts come from the COMPSs resources: nothing to do."""
else:
    from hpcdl.runtime.local import (
        compss_barrier,
        compss_wait_on,
        constraint,
        failure_reason,
        on_failure,
        set_local_cores,
        task,
    )

    # Parameter directions: the local backend passes arguments by value, so these only document intent.
    IN, OUT, INOUT = "IN", "OUT", "INOUT"
    FILE_IN, FILE_OUT, FILE_INOUT = "FILE_IN", "FILE_OUT", "FILE_INOUT"
    COLLECTION_IN = "COLLECTION_IN"

__all__ = ["BACKEND", "BACKEND_INFO", "task", "constraint", "on_failure", "compss_wait_on",
           "compss_barrier", "failure_reason", "set_local_cores", "IN", "OUT", "INOUT", "FILE_IN",
           "FILE_OUT", "FILE_INOUT", "COLLECTION_IN"]
