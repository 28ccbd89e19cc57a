"""A malleable training job: a Fashion-MNIST CNN whose intra-op thread count changes while it trains.

Three ways to ask for a new thread count, all applied by the training thread at the next
iteration boundary (torch.set_num_threads acts on the calling thread's pool, so it must be the
training thread that calls it):

    API     `job.set_threads(n)` from any thread: the request is queued under a lock
    signal  SIGUSR1: read the target from the control file; SIGUSR2: match the cgroup's quota.
            The handlers only record that the signal came (a counter and a time).
    quota   with `follow_quota`, the job reads its own cgroup's CPU quota at every boundary and
            follows it when it changes (cgroup v1 cfs_quota_us / cfs_period_us or v2 cpu.max)

A request below 1 or above `max_threads` is clamped with a logged warning; a control file that
does not hold an integer is ignored with a log line naming the file. Every iteration, request,
change and warning is one JSON line in the job's log (time series: iteration, time, threads, quota).
`job_entry` is the body of a job process: it dies with its parent (PR_SET_PDEATHSIG) and moves
itself into its cgroup before it starts work.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time

import numpy as np
import torch

from hpcdl.common.fashion_mnist import load_split, normalise
from hpcdl.common.models import small_cnn
from hpcdl.studies.malleable import cgroups

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` when the parent exits (Linux); exit now if it already has."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent or parent == 1:
        os._exit(1)


class JobLog:
    """JSON lines, flushed one by one: the scheduler reads progress from this file while we run."""

    def __init__(self, path: str, job: str):
        self.job = job
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 (open for the job's lifetime)
        self._lock = threading.Lock()

    def write(self, kind: str, **fields) -> None:
        line = json.dumps({"type": kind, "job": self.job, **fields})
        with self._lock:
            self._f.write(line + "\n")

    def warn(self, message: str) -> None:
        print(f"[job {self.job}] warning: {message}", file=sys.stderr, flush=True)
        self.write("warning", time=time.time(), message=message)

    def close(self) -> None:
        self._f.close()


def read_log(path: str) -> list[dict]:
    """Every complete line of a job log (a line being written is left for the next read)."""
    try:
        text = open(path).read()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines(keepends=True):
        if line.endswith("\n"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class MalleableJob:
    def __init__(self, spec: dict, log: JobLog):
        self.spec, self.log = spec, log
        self.max_threads = int(spec["max_threads"])
        self.control_file = spec.get("control_file")
        self.follow_quota = bool(spec.get("follow_quota", False))
        self._lock = threading.Lock()
        self._api: list[tuple[int, float]] = []
        self._usr1 = self._usr2 = 0  # signals received (written by the handlers only)
        self._usr1_at = self._usr2_at = 0.0
        self._usr1_seen = self._usr2_seen = 0
        self._progress = threading.Condition()
        self.started_iteration = -1
        self.install_signal_handlers()  # before the control file is read: no request falls between
        self._cgroup = cgroups.own_cgroup()
        self._quota_seen = self._quota()
        initial = int(spec["threads"])
        if self.control_file and os.path.exists(self.control_file):  # written before we could hear a signal
            from_file = self._read_control()
            initial = initial if from_file is None else from_file
        self.threads = self._clamp(initial, "initial thread count")
        torch.set_num_threads(self.threads)

    # ---- the three request paths ---------------------------------------------------------------
    def set_threads(self, n: int) -> None:
        """Ask for `n` intra-op threads from the next iteration on (callable from any thread)."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer):
            raise TypeError(f"set_threads takes an integer thread count, got {type(n).__name__}")
        with self._lock:
            self._api.append((int(n), time.time()))

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGUSR1, self._on_usr1)
        signal.signal(signal.SIGUSR2, self._on_usr2)

    def _on_usr1(self, signum, frame) -> None:  # record only: the training thread acts on it
        self._usr1_at = time.time()
        self._usr1 += 1

    def _on_usr2(self, signum, frame) -> None:
        self._usr2_at = time.time()
        self._usr2 += 1

    # ---- the boundary ---------------------------------------------------------------------------
    def _quota(self) -> float | None:
        if self._cgroup is None:
            return None
        try:
            return cgroups.read_quota(self._cgroup)
        except (OSError, ValueError):
            return None

    def _clamp(self, n: int, what: str) -> int:
        if n < 1 or n > self.max_threads:
            clamped = min(max(n, 1), self.max_threads)
            self.log.warn(
                f"{what} {n} is outside 1..{self.max_threads} (the cores this job may use); using {clamped}"
            )
            return clamped
        return n

    def _read_control(self) -> int | None:
        path = self.control_file
        try:
            text = open(path).read().strip()
        except (OSError, TypeError) as exc:
            self.log.warn(f"ignoring SIGUSR1: control file {path} unreadable ({exc})")
            return None
        try:
            return int(text)
        except ValueError:
            self.log.warn(f"ignoring control file {path}: {text[:40]!r} is not a thread count")
            return None

    def _requests(self, quota: float | None) -> list[tuple[str, int, float]]:
        """(source, target, time requested) of everything that arrived since the last boundary."""
        out = []
        with self._lock:
            out += [("api", n, t) for n, t in self._api]
            self._api.clear()
        if self._usr1 != self._usr1_seen:
            self._usr1_seen = self._usr1
            n = self._read_control()
            if n is not None:
                out.append(("signal", n, self._usr1_at))
        if self._usr2 != self._usr2_seen:
            self._usr2_seen = self._usr2
            out.append(("signal-quota", cgroups.threads_for(quota, self.max_threads), self._usr2_at))
        if self.follow_quota and quota != self._quota_seen:
            out.append(("quota", cgroups.threads_for(quota, self.max_threads), time.time()))
        self._quota_seen = quota
        return out

    def _boundary(self, iteration: int, quota: float | None) -> None:
        reqs = self._requests(quota)
        for source, target, at in reqs:
            self.log.write(
                "request", iteration=iteration, source=source, target=target, requested=at, seen=time.time()
            )
        if not reqs:
            return
        source, target, at = max(reqs, key=lambda r: r[2])  # the latest request wins
        target = self._clamp(target, f"{source} request of")
        if target == self.threads:
            return
        t0 = time.perf_counter()
        torch.set_num_threads(target)
        self.log.write(
            "applied",
            iteration=iteration,
            source=source,
            old=self.threads,
            threads=target,
            requested=at,
            applied=time.time(),
            set_call_s=time.perf_counter() - t0,
        )
        self.threads = target

    # ---- training ---------------------------------------------------------------------------------
    def _data(self):
        images, labels = load_split(self.spec["data_dir"], "test")
        rng = np.random.default_rng(self.spec.get("seed", 0))
        n = self.spec["batch_size"] * self.spec.get("batches", 8)
        idx = rng.choice(len(images), size=min(n, len(images)), replace=False)
        x = torch.from_numpy(normalise(images[idx])).reshape(-1, 1, 28, 28)
        y = torch.from_numpy(labels[idx].astype(np.int64))
        return x.split(self.spec["batch_size"]), y.split(self.spec["batch_size"])

    def run(self) -> None:
        spec = self.spec
        torch.manual_seed(spec.get("seed", 0))
        model = small_cnn(width=spec["model"]["width"], depth=spec["model"]["depth"])
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        xs, ys = self._data()
        self.log.write(
            "start",
            time=time.time(),
            threads=self.threads,
            quota_cores=self._quota_seen,
            iterations=spec["iterations"],
            pid=os.getpid(),
        )
        for it in range(spec["iterations"]):
            # the iteration starts at its boundary: a request arriving after the quota and the
            # requests were read here is for the next boundary, not a lag of this one
            boundary_at = time.time()
            quota = self._quota()
            self._boundary(it, quota)
            if it == spec.get("crash_at"):
                raise RuntimeError(f"job {self.log.job}: injected crash at iteration {it}")
            with self._progress:
                self.started_iteration = it
                self._progress.notify_all()
            start, c0, t0 = boundary_at, time.process_time(), time.perf_counter()
            x, y = xs[it % len(xs)], ys[it % len(ys)]
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            self.log.write(
                "iter",
                iteration=it,
                start=start,
                iter_s=time.perf_counter() - t0,
                cpu_s=time.process_time() - c0,
                threads=self.threads,
                quota_cores=quota,
                loss=float(loss.detach()),
            )
        self.log.write("end", time=time.time())

    def wait_started(self, iteration: int, timeout_s: float) -> bool:
        with self._progress:
            return self._progress.wait_for(lambda: self.started_iteration >= iteration, timeout_s)


def _api_driver(job: MalleableJob, schedule: list) -> None:
    """The API path exercised from another thread: at iteration k (in progress), set_threads(n)."""
    for k, n in schedule:
        if not job.wait_started(k, 600):
            return
        job.set_threads(int(n))
        at = time.time()  # once the request is queued (see response.py)
        job.log.write("api_call", iteration=k, target=int(n), time=at)


def job_entry(spec: dict) -> None:
    """The body of one job process (started by hpcdl.studies.malleable.forkserver)."""
    die_with_parent()
    if spec.get("cgroup"):
        cgroups.attach(spec["cgroup"])
    log = JobLog(spec["log_file"], spec["name"])
    try:
        job = MalleableJob(spec, log)
        if spec.get("api_schedule"):
            threading.Thread(target=_api_driver, args=(job, spec["api_schedule"]), daemon=True).start()
        job.run()
    except BaseException as exc:
        log.write("failed", time=time.time(), error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        log.close()
