"""Local task backend: the PyCOMPSs task semantics the project uses, on concurrent.futures.

Tasks run in spawned worker processes (forking after torch is loaded can deadlock). A task
starts only when its argument futures are resolved and enough cores are free for its
`computing_units`; a task asking for more units than the machine has runs alone.

GPUs, as COMPSs's worker binds them: a task whose constraint lists a GPU processor
(`processors=[..., {"processorType": "GPU", "computingUnits": g}]`,
hpcdl.platform.orchestration.task_runtime.gpus) waits for g GPUs of the pool to be free and runs with
CUDA_VISIBLE_DEVICES set to those ids, which no other running task holds. CUDA reads that variable
once per process, so GPU tasks run in a worker of their own per set of ids; the worker is kept for
the next task given the same ids (its torch import, CUDA context and data already loaded: an HPO
chunk of a few seconds would otherwise pay as much again to start) and replaced when a task needs
ids overlapping its own, so no two workers hold one GPU. After each task the worker returns its
cached GPU memory to the driver. A task asking for more GPUs than the pool has runs, as with cores,
with the whole pool (the rank runtime then refuses more ranks than GPUs unless the study shares
them: hpcdl.platform.kit.device); with an empty pool it is an error at submission. A task without GPUs
keeps the environment it was started with, as under COMPSs.

This module is the API the task apps get (task, constraint, on_failure, compss_wait_on, ...); the
scheduler is local_pool, what runs in a worker local_worker, the futures local_futures.
"""

from __future__ import annotations

import os
import sys

from hpcdl.platform.orchestration.task_runtime.local_futures import ItemFuture, resolve
from hpcdl.platform.orchestration.task_runtime.local_pool import backend, current, set_local_cores
from hpcdl.platform.orchestration.task_runtime.local_worker import IN_WORKER_ENV

# set_local_cores is the pool's, and part of this API (hpcdl.platform.orchestration.task_runtime.API)
__all__ = ["task", "constraint", "on_failure", "compss_wait_on", "compss_barrier", "failure_reason",
           "set_local_cores", "failures", "processor_units", "LocalTask"]

_MANAGEMENTS = ("IGNORE", "RETRY", "FAIL", "CANCEL_SUCCESSORS")
DEFAULT_MANAGEMENT = "RETRY"


class LocalTask:
    """What @task returns locally: calling it submits the function and returns a future."""

    def __init__(self, fn, returns=1, **task_kwargs):
        self.__wrapped__ = fn
        self.name = fn.__qualname__
        self.returns = returns
        self.task_kwargs = task_kwargs
        # the CPU and GPU computingUnits values of its constraint, resolved at each submission
        self.cpu_units, self.gpu_units = getattr(fn, "_hpcdl_processors", (("1",), ()))
        # PyCOMPSs' default: a task without @on_failure is retried, then fails the application.
        self.management = getattr(fn, "_hpcdl_management", DEFAULT_MANAGEMENT)
        self.failure_returns = getattr(fn, "_hpcdl_failure_returns", None)
        self.__doc__, self.__module__, self.__qualname__ = fn.__doc__, fn.__module__, fn.__qualname__

    def import_path(self) -> tuple[str, str]:
        module = self.__wrapped__.__module__
        if module == "__main__":  # `python -m tasks.x`: workers import it by its real name
            spec = getattr(sys.modules["__main__"], "__spec__", None)
            if spec is None:
                raise RuntimeError(f"task {self.name}: the local backend needs tasks defined in an "
                                   "importable module; run the app with `python -m package.module`")
            module = spec.name
        return module, self.__wrapped__.__qualname__

    def __call__(self, *args, **kwargs):
        if os.environ.get(IN_WORKER_ENV):  # a task calling a task: run it inline
            return self.__wrapped__(*args, **kwargs)
        fut = backend().submit(self, args, kwargs)
        n = self.returns if isinstance(self.returns, int) else len(self.returns)
        return tuple(ItemFuture(fut, i) for i in range(n)) if n > 1 else fut


def task(returns=1, **kwargs):
    def deco(fn):
        return LocalTask(fn, returns=returns, **kwargs)
    return deco


# The fields of a COMPSs @Processor (COMPSs manual, "Constraints"); the local backend reads the first two.
PROCESSOR_FIELDS = ("processorType", "computingUnits", "name", "speed", "architecture", "propertyName",
                    "propertyValue", "internalMemorySize")


def processor_units(computing_units=None, processors=None) -> tuple[tuple, tuple]:
    """(CPU, GPU) computingUnits values of a constraint, unresolved, summed per type as COMPSs does.

    Without `processors`, the task's cores are `computing_units` (default "1"). With it, a listed CPU
    gives them, or COMPSs's default of one; `computing_units` beside a listed CPU would be added to
    it by COMPSs, so it is refused here rather than doubled.
    """
    if processors is None:
        return (computing_units if computing_units is not None else "1",), ()
    if not isinstance(processors, (list, tuple)) or not all(isinstance(p, dict) for p in processors):
        raise TypeError(f"constraint processors= must be a list of dicts with the fields "
                        f"{', '.join(PROCESSOR_FIELDS)}; got {processors!r}")
    cpus, gpus = [], []
    for proc in processors:
        unknown = sorted(set(proc) - set(PROCESSOR_FIELDS))
        if unknown:
            raise ValueError(f"constraint processors: field {unknown[0]!r} is not a COMPSs processor field; "
                             f"allowed: {', '.join(PROCESSOR_FIELDS)}")
        kind = str(proc.get("processorType", "CPU")).upper()  # the COMPSs default type is CPU
        if kind not in ("CPU", "GPU"):
            raise ValueError(f"constraint processors: processorType {kind!r}: the local backend runs CPU "
                             "and GPU processors only")
        (cpus if kind == "CPU" else gpus).append(proc.get("computingUnits", "1"))
    if cpus and computing_units is not None:
        raise ValueError("constraint: computing_units beside a CPU processor in processors=; COMPSs adds "
                         "the two up: give the cores once, in the CPU processor")
    return tuple(cpus) or (computing_units if computing_units is not None else "1",), tuple(gpus)


def constraint(computing_units=None, processors=None, **kwargs):
    units = processor_units(computing_units, processors)

    def deco(obj):
        # Works above or below @task: a plain function keeps the value for LocalTask to pick up.
        if isinstance(obj, LocalTask):
            obj.cpu_units, obj.gpu_units = units
        else:
            obj._hpcdl_processors = units
        return obj
    return deco


def on_failure(management, returns=None, **kwargs):
    """`management` is mandatory, as in PyCOMPSs."""
    if management not in _MANAGEMENTS:
        raise ValueError(f"on_failure management must be one of {_MANAGEMENTS}, got {management!r}")

    def deco(obj):
        if isinstance(obj, LocalTask):
            obj.management, obj.failure_returns = management, returns
        else:
            obj._hpcdl_management, obj._hpcdl_failure_returns = management, returns
        return obj
    return deco


def compss_wait_on(*objs, **_kwargs):
    values = [resolve(o) for o in objs]
    return values[0] if len(values) == 1 else values


def compss_barrier(no_more_tasks: bool = False):
    if (pool := current()) is not None:
        pool.barrier()


def failure_reason(future) -> str | None:
    """Why a task given IGNORE returned its default value (None if it did not fail)."""
    return getattr(future, "failure", None)


def failures() -> list[dict]:
    pool = current()
    return list(pool.failures) if pool is not None else []
