"""The co-scheduler: a queue of malleable jobs sharing a set of cores, rebalanced on every event.

Jobs arrive at configured times with an amount of work (iterations). On every arrival and every
departure (a job finishing or failing) the policy (hpcdl.studies.malleable.policies) assigns each running
job a share of the cores, and the scheduler enforces it twice: a CPU quota on the job's own cgroup
(written by us, as root) and the job's thread count (the target written to the job's control file,
then SIGUSR1). A job that crashes is recorded as failed and its cores go to the others. Without
writable cgroups the shares are enforced by thread counts alone (recorded as such).

Every decision is logged with its latency (policy + enforcement time per event).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_any
from pathlib import Path

from hpcdl.studies.malleable import forkserver, policies
from hpcdl.studies.malleable.job import read_log


@dataclass
class _Job:
    name: str
    arrival_s: float
    iterations: int
    request: int
    crash_at: int | None = None
    state: str = "pending"  # pending -> waiting -> running -> done | failed
    proc: object = None
    cgroup: Path | None = None
    share: float | None = None
    threads: int | None = None
    admitted_s: float | None = None
    finished_s: float | None = None
    error: str = ""
    log_file: str = ""
    control_file: str = ""
    requests: list = field(default_factory=list)


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class CoScheduler:
    def __init__(
        self,
        workload: list[dict],
        policy: str,
        cores: int,
        job_defaults: dict,
        workdir: str | Path,
        run_cgroups=None,
        timeout_s: float = 600.0,
    ):
        if policy not in policies.POLICIES:
            raise ValueError(f"policy must be one of {policies.POLICIES}, got {policy!r}")
        self.policy, self.cores, self.defaults = policy, int(cores), job_defaults
        self.workdir = Path(workdir)
        self.cg = run_cgroups
        self.timeout_s = timeout_s
        self.jobs = [
            _Job(
                name=str(j.get("name", i)),
                arrival_s=float(j["arrival_s"]),
                iterations=int(j["iterations"]),
                request=int(j.get("request_cores", cores)),
                crash_at=j.get("crash_at"),
            )
            for i, j in enumerate(workload)
        ]
        self.decisions: list[dict] = []
        self.t0 = 0.0

    # ---- helpers --------------------------------------------------------------------------------
    def _now(self) -> float:
        return time.time() - self.t0

    def _done_iterations(self, job: _Job) -> int:
        return sum(r["type"] == "iter" for r in read_log(job.log_file)) if job.log_file else 0

    def _view(self, job: _Job) -> policies.JobView:
        return policies.JobView(job.name, job.request, job.iterations - self._done_iterations(job), job.share)

    def _start(self, job: _Job, share: float) -> None:
        job.log_file = str(self.workdir / f"job-{job.name}.jsonl")
        job.control_file = str(self.workdir / f"job-{job.name}.ctl")
        threads = policies.threads_for_share(share, self.cores)
        _write_atomic(job.control_file, str(threads))
        if self.cg is not None:
            job.cgroup = self.cg.job(job.name, share)
        spec = {
            **self.defaults,
            "name": job.name,
            "iterations": job.iterations,
            "threads": threads,
            "max_threads": self.cores,
            "log_file": job.log_file,
            "control_file": job.control_file,
            "cgroup": str(job.cgroup) if job.cgroup else None,
            "follow_quota": False,
            "crash_at": job.crash_at,
        }
        job.proc = forkserver.start_job(spec)
        job.state, job.share, job.threads, job.admitted_s = "running", share, threads, self._now()
        job.requests.append({"time": time.time(), "target": threads, "source": "start"})

    def _resize(self, job: _Job, share: float) -> None:
        if self.cg is not None and job.cgroup is not None and share != job.share:
            self.cg.set_quota(job.cgroup, share)
        job.share = share
        threads = policies.threads_for_share(share, self.cores)
        if threads != job.threads:
            _write_atomic(job.control_file, str(threads))
            try:
                os.kill(job.proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                return  # it just ended: its departure is the next event
            at = time.time()  # once sent (see response.py)
            job.threads = threads
            job.requests.append({"time": at, "target": threads, "source": "signal"})

    def _event(self, index: int, kind: str, subject: str) -> None:
        t_event = time.perf_counter()
        running = [j for j in self.jobs if j.state == "running"]
        waiting = [j for j in self.jobs if j.state == "waiting"]
        admit, shares = policies.decide(
            self.policy, self.cores, [self._view(j) for j in running], [self._view(j) for j in waiting]
        )
        decide_s = time.perf_counter() - t_event
        by_name = {j.name: j for j in self.jobs}
        for name, share in shares.items():
            job = by_name[name]
            if name in admit:
                self._start(job, share)
            else:
                self._resize(job, share)
        apply_s = time.perf_counter() - t_event - decide_s
        for name, share in shares.items():
            self.decisions.append(
                {
                    "event_index": index,
                    "time_s": self._now(),
                    "event": kind,
                    "event_job": subject,
                    "job": name,
                    "cores": share,
                    "threads": by_name[name].threads,
                    "decide_s": decide_s,
                    "apply_s": apply_s,
                    "admitted": name in admit,
                }
            )

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> dict:
        forkserver.warm_up()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        events = 0
        try:
            while any(j.state in ("pending", "waiting", "running") for j in self.jobs):
                now = self._now()
                if now > self.timeout_s:
                    raise TimeoutError(f"workload not finished after {self.timeout_s} s")
                happened = []
                for j in self.jobs:
                    if j.state == "pending" and j.arrival_s <= now:
                        j.state = "waiting"
                        happened.append(("arrival", j.name))
                    elif j.state == "running" and j.proc.exitcode is not None:
                        j.proc.join()
                        j.finished_s = self._now()
                        j.state = "done" if j.proc.exitcode == 0 else "failed"
                        if j.state == "failed":
                            j.error = self._failure(j)
                        j.share = None
                        happened.append(("departure" if j.state == "done" else "failure", j.name))
                for kind, name in happened:
                    self._event(events, kind, name)
                    events += 1
                pending = [j.arrival_s - now for j in self.jobs if j.state == "pending"]
                sentinels = [j.proc.sentinel for j in self.jobs if j.state == "running"]
                timeout = min([*pending, 0.5]) if pending else 0.5
                if sentinels:
                    wait_any(sentinels, timeout=max(timeout, 0.0))
                else:
                    time.sleep(max(timeout, 0.0))
        finally:
            for j in self.jobs:
                if j.state == "running" and j.proc.exitcode is None:
                    j.proc.kill()
                    j.proc.join()
                    j.state, j.error = "failed", "killed: the workload did not finish"
        return self.result()

    def _failure(self, job: _Job) -> str:
        for rec in reversed(read_log(job.log_file)):
            if rec["type"] == "failed":
                return rec["error"]
        return f"exit code {job.proc.exitcode}"

    def result(self) -> dict:
        jobs, series, changes = [], [], []
        for j in self.jobs:
            logged = read_log(j.log_file) if j.log_file else []
            jobs.append(
                {
                    "job": j.name,
                    "arrival_s": j.arrival_s,
                    "iterations": j.iterations,
                    "request_cores": j.request,
                    "admitted_s": j.admitted_s,
                    "finished_s": j.finished_s,
                    "wait_s": None if j.admitted_s is None else j.admitted_s - j.arrival_s,
                    "turnaround_s": None if j.finished_s is None else j.finished_s - j.arrival_s,
                    "status": "ok" if j.state == "done" else "failed",
                    "error": j.error,
                    "iterations_done": sum(r["type"] == "iter" for r in logged),
                }
            )
            series += [{**r, "start": r["start"] - self.t0} for r in logged if r["type"] == "iter"]
            changes += [{**r, "job": j.name} for r in j.requests if r["source"] != "start"]
            changes += [
                {**r, "requested": r["requested"] - self.t0, "applied": r["applied"] - self.t0}
                for r in logged
                if r["type"] == "applied"
            ]
        return {
            "jobs": jobs,
            "decisions": self.decisions,
            "series": series,
            "requests": [{**c, "time": c["time"] - self.t0} for c in changes if "time" in c],
            "applied": [c for c in changes if "applied" in c],
        }
