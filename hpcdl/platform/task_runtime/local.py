"""Local task backend: the PyCOMPSs task semantics the project uses, on concurrent.futures.

Tasks run in spawned worker processes (forking after torch is loaded can deadlock). A task
starts only when its argument futures are resolved and enough cores are free for its
`computing_units`; a task asking for more units than the machine has runs alone.

GPUs, as COMPSs's worker binds them: a task whose constraint lists a GPU processor
(`processors=[..., {"processorType": "GPU", "computingUnits": g}]`,
hpcdl.platform.task_runtime.gpus) waits for g GPUs of the pool to be free and runs with
CUDA_VISIBLE_DEVICES set to those ids, which no other running task holds. CUDA reads that variable
once per process, so GPU tasks run in a worker of their own per set of ids; the worker is kept for
the next task given the same ids (its torch import, CUDA context and data already loaded: an HPO
chunk of a few seconds would otherwise pay as much again to start) and replaced when a task needs
ids overlapping its own, so no two workers hold one GPU. After each task the worker returns its
cached GPU memory to the driver. A task asking for more GPUs than the pool has runs, as with cores,
with the whole pool (the rank runtime then refuses more ranks than GPUs unless the study shares
them: hpcdl.platform.device); with an empty pool it is an error at submission. A task without GPUs
keeps the environment it was started with, as under COMPSs.
"""

from __future__ import annotations

import atexit
import importlib
import itertools
import multiprocessing
import os
import sys
import threading
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field

from hpcdl.platform.results import available_cores as affinity_cores
from hpcdl.platform.task_runtime.gpus import POOL_ENV, GpuError, gpu_pool, resolve_gpus
from hpcdl.platform.task_runtime.units import resolve as resolve_units

_MANAGEMENTS = ("IGNORE", "RETRY", "FAIL", "CANCEL_SUCCESSORS")
DEFAULT_MANAGEMENT = "RETRY"
_IN_WORKER_ENV = "HPCDL_LOCAL_WORKER"


class TaskFailedError(RuntimeError):
    """A task failed under FAIL, or twice under RETRY (the default), or depended on one that did."""


def available_cores() -> int:
    env = os.environ.get("HPCDL_LOCAL_CORES")
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"HPCDL_LOCAL_CORES must be a positive integer, got {env!r}")
        return int(env)
    return affinity_cores()


class LocalFuture:
    """The placeholder a task call returns; compss_wait_on turns it into the value."""

    _ids = itertools.count(1)

    def __init__(self, name: str):
        self.id = next(self._ids)
        self.name = name
        self._done = threading.Event()
        self._value = None
        self._error: str | None = None
        self.failure: str | None = None  # set when IGNORE swallowed an exception

    def _set(self, value=None, error: str | None = None):
        self._value, self._error = value, error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self):
        self._done.wait()
        if self._error is not None:
            raise TaskFailedError(f"task {self.name} (#{self.id}) failed:\n{self._error}")
        return self._value

    def __repr__(self):
        return f"<LocalFuture #{self.id} {self.name} {'done' if self.done() else 'pending'}>"


class _ItemFuture(LocalFuture):
    """One element of a task declared with returns=N > 1."""

    def __init__(self, parent: LocalFuture, index: int):
        self.parent, self.index = parent, index
        self.id, self.name = parent.id, f"{parent.name}[{index}]"

    def done(self):
        return self.parent.done()

    @property
    def failure(self):
        return self.parent.failure

    def result(self):
        value = self.parent.result()
        return None if value is None else value[self.index]


def _iter_futures(obj):
    if isinstance(obj, LocalFuture):
        yield obj
    elif isinstance(obj, (list, tuple, set)):
        for item in obj:
            yield from _iter_futures(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _iter_futures(item)


def resolve(obj):
    """Replace every LocalFuture inside lists/tuples/dicts by its value (blocking)."""
    if isinstance(obj, LocalFuture):
        return obj.result()
    if isinstance(obj, list):
        return [resolve(x) for x in obj]
    if isinstance(obj, tuple):
        return tuple(resolve(x) for x in obj)
    if isinstance(obj, dict):
        return {k: resolve(v) for k, v in obj.items()}
    return obj


def _run_in_worker(module: str, qualname: str, args, kwargs, units: int, gpu_ids: list[str] | None = None):
    os.environ[_IN_WORKER_ENV] = "1"
    if gpu_ids is not None:  # before anything in this fresh process initialises CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    os.environ["OMP_NUM_THREADS"] = str(units)
    if "torch" in sys.modules:  # the task module imported torch: give it its cores
        sys.modules["torch"].set_num_threads(units)
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    fn = getattr(obj, "__wrapped__", obj)
    try:
        return fn(*args, **kwargs)
    finally:
        if gpu_ids is not None:
            _release_gpu_memory()


def _release_gpu_memory():
    """The worker outlives its task: give the allocator's cached blocks back, so what the next
    process on this GPU (a rank, a task with other ids) measures and can allocate is not ours."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        import gc

        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _worker_init():
    os.environ[_IN_WORKER_ENV] = "1"


@dataclass
class _Job:
    task: LocalTask
    future: LocalFuture
    args: tuple
    kwargs: dict
    units: int
    gpus: int = 0
    attempts: int = 0
    deps: list = field(default_factory=list)


class LocalBackend:
    def __init__(self, cores: int | None = None, progress: bool | None = None, gpus: list[str] | None = None):
        self.cores = cores or available_cores()
        self.free = self.cores
        # GPU ids handed out (gpus.gpu_pool), read when the first GPU task is submitted
        self.gpu_pool: list[str] | None = list(gpus) if gpus is not None else None
        self.free_gpus: list[str] = list(self.gpu_pool or [])
        # GPU tasks' workers, one per set of ids (kept for the next task with those ids), and the
        # replaced ones still to shut down
        self._gpu_workers: dict[tuple[str, ...], ProcessPoolExecutor] = {}
        self._spent: list[ProcessPoolExecutor] = []
        self._pool: ProcessPoolExecutor | None = None
        self._pending: list[_Job] = []
        self._running = 0
        self._cond = threading.Condition()
        self._dispatcher: threading.Thread | None = None
        self._closed = False
        self.failures: list[dict] = []
        self.submitted = self.finished = self.failed = 0
        self._t0: float | None = None
        self._last_report = 0.0
        self.progress = (os.environ.get("HPCDL_PROGRESS", "1") != "0") if progress is None else progress

    # -- submission ---------------------------------------------------------------------------
    def submit(self, task: LocalTask, args, kwargs) -> LocalFuture:
        units = sum(resolve_units(v, f"task {task.name}: computing_units") for v in task.cpu_units)
        gpus = sum(resolve_gpus(v, f"task {task.name}: GPU computingUnits") for v in task.gpu_units)
        if gpus:
            self._load_gpu_pool()
            if not self.gpu_pool:
                raise GpuError(f"task {task.name} asks for {gpus} GPU(s) but the local GPU pool is empty "
                               f"(no GPU visible; {POOL_ENV}={os.environ.get(POOL_ENV)!r})")
        fut = LocalFuture(task.name)
        job = _Job(task, fut, args, kwargs, units, gpus, deps=list(_iter_futures((args, kwargs))))
        with self._cond:
            if self._closed:
                raise RuntimeError("local task backend is shut down")
            if self._t0 is None:
                self._t0 = time.monotonic()
            self.submitted += 1
            self._pending.append(job)
            self._ensure_dispatcher()
            self._cond.notify_all()
        return fut

    def _load_gpu_pool(self):
        if self.gpu_pool is None:
            pool = gpu_pool()  # may import torch: outside the lock
            with self._cond:
                if self.gpu_pool is None:
                    self.gpu_pool, self.free_gpus = pool, list(pool)

    def _ensure_dispatcher(self):
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.cores, mp_context=ctx, initializer=_worker_init)
        if self._dispatcher is None:
            self._dispatcher = threading.Thread(target=self._dispatch_loop, name="hpcdl-dispatch",
                                                daemon=True)
            self._dispatcher.start()

    def _dispatch_loop(self):
        with self._cond:
            while not self._closed:
                started = False
                for job in list(self._pending):
                    if not all(d.done() for d in job.deps):
                        continue
                    need = min(job.units, self.cores)
                    gpus = min(job.gpus, len(self.gpu_pool or ()))
                    if need > self.free or gpus > len(self.free_gpus):
                        continue
                    self._pending.remove(job)
                    self._start(job, need, gpus)
                    started = True
                while self._spent:
                    self._spent.pop().shutdown(wait=False)
                if not started:
                    self._cond.wait(timeout=0.2)

    def _start(self, job: _Job, need: int, gpus: int):
        try:
            args, kwargs = resolve(job.args), resolve(job.kwargs)
        except TaskFailedError as exc:  # a dependency failed: so does this task
            self._finish_failed(job, f"dependency failed: {exc}")
            return
        self.free -= need
        self._running += 1
        job.attempts += 1
        module, qualname = job.task.import_path()
        ids, executor = None, self._pool
        if job.gpus:
            ids, self.free_gpus = self.free_gpus[:gpus], self.free_gpus[gpus:]
            executor = self._gpu_worker(tuple(ids))
        pf: Future = executor.submit(_run_in_worker, module, qualname, args, kwargs, job.units, ids)
        pf.add_done_callback(lambda f, job=job, need=need, ids=ids: self._on_done(job, need, f, ids))

    def _gpu_worker(self, ids: tuple[str, ...]) -> ProcessPoolExecutor:
        """The worker for a task holding `ids` (all free, so every worker holding one of them is idle).

        CUDA reads CUDA_VISIBLE_DEVICES once, when a process first initialises it: a worker serves
        exactly one set of ids. One that shares a GPU with `ids` is shut down first, so no two
        workers keep a context on one GPU. (Workers are replaced by hand: max_tasks_per_child can
        deadlock on Python 3.11, cpython gh-115634.)
        """
        if ids in self._gpu_workers:
            return self._gpu_workers[ids]
        for held in [k for k in self._gpu_workers if set(k) & set(ids)]:
            self._spent.append(self._gpu_workers.pop(held))
        self._gpu_workers[ids] = ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init)
        return self._gpu_workers[ids]

    def _on_done(self, job: _Job, need: int, pf: Future, ids: list[str] | None = None):
        with self._cond:
            self.free += need
            if ids is not None:
                self.free_gpus = sorted(self.free_gpus + ids, key=self.gpu_pool.index)
            self._running -= 1
            exc = pf.exception()
            if exc is None:
                job.future._set(pf.result())
                self.finished += 1
            else:
                detail = "".join(traceback.format_exception(exc)).strip()
                mgmt = job.task.management
                if mgmt == "RETRY" and job.attempts < 2:
                    self._pending.append(job)
                elif mgmt == "IGNORE":
                    job.future.failure = f"{type(exc).__name__}: {exc}"
                    self._record_failure(job, exc, detail)
                    job.future._set(job.task.failure_returns)
                else:
                    self._finish_failed(job, detail, exc)
            self._report()
            self._cond.notify_all()

    def _finish_failed(self, job: _Job, detail: str, exc: BaseException | None = None):
        self._record_failure(job, exc, detail)
        job.future.failure = detail.splitlines()[-1] if detail else "failed"
        job.future._set(error=detail)

    def _record_failure(self, job: _Job, exc, detail: str):
        self.failed += 1
        self.finished += 1
        self.failures.append({"task": job.task.name, "future_id": job.future.id,
                              "management": job.task.management, "attempts": job.attempts,
                              "error": f"{type(exc).__name__}: {exc}" if exc else detail,
                              "traceback": detail})

    def _report(self):
        if not self.progress or self._t0 is None:
            return
        now = time.monotonic()
        done_all = self.finished == self.submitted
        if not done_all and now - self._last_report < 2.0:
            return
        self._last_report = now
        elapsed = now - self._t0
        eta = elapsed / self.finished * (self.submitted - self.finished) if self.finished else float("nan")
        failed = f", {self.failed} failed" if self.failed else ""
        print(f"[hpcdl] tasks {self.finished}/{self.submitted} done{failed}, {self._running} running, "
              f"elapsed {elapsed:.0f} s, ETA {eta:.0f} s", file=sys.stderr, flush=True)

    # -- synchronisation ----------------------------------------------------------------------
    def barrier(self):
        with self._cond:
            while self._pending or self._running:
                self._cond.wait(timeout=0.2)

    def shutdown(self):
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        with self._cond:
            spent, self._spent = self._spent + list(self._gpu_workers.values()), []
            self._gpu_workers = {}
        for executor in spent:
            executor.shutdown(wait=True)


_backend: LocalBackend | None = None
_backend_lock = threading.Lock()


def backend() -> LocalBackend:
    global _backend
    with _backend_lock:
        if _backend is None:
            _backend = LocalBackend()
        return _backend


def set_local_cores(cores: int | None) -> None:
    """Wait for running tasks, then size the local backend to `cores` (None: all available)."""
    global _backend
    with _backend_lock:
        old, _backend = _backend, LocalBackend(cores)
    if old is not None:
        old.barrier()
        old.shutdown()


@atexit.register
def _shutdown_at_exit():
    if _backend is not None:
        _backend.shutdown()


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
        if os.environ.get(_IN_WORKER_ENV):  # a task calling a task: run it inline
            return self.__wrapped__(*args, **kwargs)
        fut = backend().submit(self, args, kwargs)
        n = self.returns if isinstance(self.returns, int) else len(self.returns)
        return tuple(_ItemFuture(fut, i) for i in range(n)) if n > 1 else fut


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
    if _backend is not None:
        _backend.barrier()


def failure_reason(future) -> str | None:
    """Why a task given IGNORE returned its default value (None if it did not fail)."""
    return getattr(future, "failure", None)


def failures() -> list[dict]:
    return list(_backend.failures) if _backend is not None else []
