"""The PyCOMPSs API surface the task apps use.

Under the COMPSs runtime (runcompss / enqueue_compss) these are the real PyCOMPSs objects;
otherwise a local backend (hpcdl.runtime.local) runs tasks in spawned worker processes.
Set HPCDL_RUNTIME=local to force the local backend even where PyCOMPSs is importable.
"""

from __future__ import annotations

import os


def _under_compss() -> bool:
    if os.environ.get("HPCDL_RUNTIME", "").lower() == "local":
        return False
    try:
        from pycompss.util.context import in_pycompss
    except ImportError:
        return False
    return bool(in_pycompss())


BACKEND = "compss" if _under_compss() else "local"

if BACKEND == "compss":
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
        # COMPSs gives an IGNOREd task's default value without the exception; its job logs have it.
        return "task failed under COMPSs (see the job's .err log in the COMPSs log directory)"

    def set_local_cores(cores) -> None:
        """Worker counts come from the COMPSs resources under runcompss: nothing to do."""
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

__all__ = ["BACKEND", "task", "constraint", "on_failure", "compss_wait_on", "compss_barrier",
           "failure_reason", "set_local_cores", "IN", "OUT", "INOUT", "FILE_IN", "FILE_OUT",
           "FILE_INOUT", "COLLECTION_IN"]
