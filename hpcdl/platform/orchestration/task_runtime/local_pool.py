"""The local backend's scheduler: worker processes, cores and GPUs handed to tasks as they free up.

A task starts only when its argument futures are resolved and enough cores are free for its
`computing_units`; a task asking for more units than the machine has runs alone. GPU tasks run in a
worker of their own per set of GPU ids (hpcdl.platform.orchestration.task_runtime.local says why). One backend
serves the process (`backend`); `set_local_cores` replaces it with one of another size.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
import threading
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from hpcdl.platform.kit.results import available_cores as affinity_cores
from hpcdl.platform.orchestration.task_runtime.gpus import POOL_ENV, GpuError, gpu_pool, resolve_gpus
from hpcdl.platform.orchestration.task_runtime.local_futures import (
    LocalFuture,
    TaskFailedError,
    iter_futures,
    resolve,
)
from hpcdl.platform.orchestration.task_runtime.local_worker import run_in_worker, worker_init
from hpcdl.platform.orchestration.task_runtime.units import resolve as resolve_units


class PoolTask(Protocol):
    """What the pool needs of a task (local.LocalTask is one): named here, so that the pool does not
    import the module that imports it."""

    name: str
    cpu_units: tuple[str, ...]
    gpu_units: tuple[str, ...]
    management: str
    failure_returns: object

    def import_path(self) -> tuple[str, str]: ...


def available_cores() -> int:
    env = os.environ.get("HPCDL_LOCAL_CORES")
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"HPCDL_LOCAL_CORES must be a positive integer, got {env!r}")
        return int(env)
    return affinity_cores()


@dataclass
class _Job:
    task: PoolTask
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
    def submit(self, task: PoolTask, args, kwargs) -> LocalFuture:
        units = sum(resolve_units(v, f"task {task.name}: computing_units") for v in task.cpu_units)
        gpus = sum(resolve_gpus(v, f"task {task.name}: GPU computingUnits") for v in task.gpu_units)
        if gpus:
            self._load_gpu_pool()
            if not self.gpu_pool:
                raise GpuError(f"task {task.name} asks for {gpus} GPU(s) but the local GPU pool is empty "
                               f"(no GPU visible; {POOL_ENV}={os.environ.get(POOL_ENV)!r})")
        fut = LocalFuture(task.name)
        job = _Job(task, fut, args, kwargs, units, gpus, deps=list(iter_futures((args, kwargs))))
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
            self._pool = ProcessPoolExecutor(max_workers=self.cores, mp_context=ctx, initializer=worker_init)
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
        pf: Future = executor.submit(run_in_worker, module, qualname, args, kwargs, job.units, ids)
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
            max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=worker_init)
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
_exit_hook = False  # whether _shutdown_at_exit is registered (at the first backend, not at import)


def _install(new: LocalBackend) -> LocalBackend | None:
    """Make `new` the process's backend (caller holds _backend_lock); returns the one it replaces."""
    global _backend, _exit_hook
    if not _exit_hook:
        atexit.register(_shutdown_at_exit)
        _exit_hook = True
    old, _backend = _backend, new
    return old


def backend() -> LocalBackend:
    with _backend_lock:
        if _backend is None:
            _install(LocalBackend())
        return _backend


def current() -> LocalBackend | None:
    """The process's backend if a task has been submitted or cores set, else None (none is made)."""
    return _backend


def set_local_cores(cores: int | None) -> None:
    """Wait for running tasks, then size the local backend to `cores` (None: all available)."""
    with _backend_lock:
        old = _install(LocalBackend(cores))
    if old is not None:
        old.barrier()
        old.shutdown()


def _shutdown_at_exit():
    if _backend is not None:
        _backend.shutdown()
