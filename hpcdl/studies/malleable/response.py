"""Single-job experiments: how fast a job follows a change, and what ignoring a quota cut costs.

    response  threads changed mid-run by the API (a thread inside the job calls set_threads), by a
              signal (control file + SIGUSR1, sent from here) or by the quota (we rewrite the
              job's cgroup quota; the job follows it): high -> low at iteration k1, back at k2
    oversub   a job with `cores` threads whose quota is cut step by step; `keep` keeps its
              threads (oversubscribed: more runnable threads than the quota's cores), `follow`
              matches the quota

Requests made here are timed here, when the call that makes one has returned (the signal sent, the
quota written): stamped before it, a driver preempted inside the call would date the request before
the job could see it, and a boundary in that gap would count as a lag. The job logs when it applied
each change, so lag and latency are measured across the two processes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from hpcdl.studies.malleable import forkserver
from hpcdl.studies.malleable.job import read_log


def _iters_done(log_file: str) -> int:
    return sum(r["type"] == "iter" for r in read_log(log_file))


def _run(spec: dict, actions: list, timeout_s: float) -> dict:
    """Start the job; when iteration k is under way (k iterations logged), run actions[k]; wait."""
    forkserver.warm_up()
    t0 = time.time()
    proc = forkserver.start_job(spec)
    requests = []
    try:
        for k, act in sorted(actions, key=lambda a: a[0]):
            while _iters_done(spec["log_file"]) < k:
                if proc.exitcode is not None or time.time() - t0 > timeout_s:
                    break
                time.sleep(0.002)
            if proc.exitcode is not None:
                break
            requests.append(act(proc) | {"iteration": k})
        proc.join(max(0.0, timeout_s - (time.time() - t0)))
        if proc.exitcode is None:
            raise TimeoutError(f"job {spec['name']} not finished after {timeout_s} s")
    finally:
        if proc.exitcode is None:
            proc.kill()
            proc.join()
    logged = read_log(spec["log_file"])
    if proc.exitcode != 0:
        errors = [r["error"] for r in logged if r["type"] == "failed"]
        raise RuntimeError(
            f"job {spec['name']} failed (exit code {proc.exitcode}): "
            f"{errors[-1] if errors else 'no error logged'}"
        )
    requests += [
        {"time": r["time"], "target": r["target"], "source": "api", "iteration": r["iteration"]}
        for r in logged
        if r["type"] == "api_call"
    ]
    return _relative(logged, requests, t0, spec["name"])


def _relative(logged: list[dict], requests: list[dict], t0: float, job: str) -> dict:
    return {
        "series": [{**r, "start": r["start"] - t0} for r in logged if r["type"] == "iter"],
        "requests": [{**r, "job": job, "time": r["time"] - t0} for r in requests],
        "applied": [
            {**r, "requested": r["requested"] - t0, "applied": r["applied"] - t0}
            for r in logged
            if r["type"] == "applied"
        ],
        "warnings": [r["message"] for r in logged if r["type"] == "warning"],
    }


def _signal_action(control_file: str, target: int):
    def act(proc):
        tmp = f"{control_file}.tmp"
        Path(tmp).write_text(str(target))
        os.replace(tmp, control_file)
        os.kill(proc.pid, signal.SIGUSR1)
        at = time.time()
        return {"time": at, "target": target, "source": "signal"}

    return act


def _quota_action(run_cgroups, cgroup: Path, cores: float, threads: int):
    def act(proc):
        run_cgroups.set_quota(cgroup, cores)
        at = time.time()
        return {"time": at, "target": threads, "source": "quota", "quota_cores": cores}

    return act


def _base_spec(point: dict, workdir: Path, name: str) -> dict:
    return {
        "name": name,
        "iterations": point.get("iterations", 0),
        "threads": point["cores"],
        "max_threads": point["cores"],
        "batch_size": point["batch_size"],
        "model": point["model"],
        "data_dir": point["data_dir"],
        "seed": point["seed"],
        "log_file": str(workdir / f"{name}.jsonl"),
        "control_file": str(workdir / f"{name}.ctl"),
        "cgroup": None,
        "follow_quota": False,
    }


def response_point(point: dict, workdir: Path, run_cgroups=None) -> dict:
    """Threads high -> low -> high through one method; run_cgroups is needed for method=quota."""
    spec = _base_spec(point, workdir, f"response-{point['method']}")
    (k1, k2), high, low = point["change_at"], point["cores"], point["low_threads"]
    method = point["method"]
    actions = []
    if method == "api":
        spec["api_schedule"] = [[k1, low], [k2, high]]
    elif method == "signal":
        actions = [
            (k1, _signal_action(spec["control_file"], low)),
            (k2, _signal_action(spec["control_file"], high)),
        ]
    elif method == "quota":
        cg = run_cgroups.job(spec["name"], float(high))
        spec.update(cgroup=str(cg), follow_quota=True)
        actions = [
            (k1, _quota_action(run_cgroups, cg, float(low), low)),
            (k2, _quota_action(run_cgroups, cg, float(high), high)),
        ]
    else:
        raise ValueError(f"response method must be api, signal or quota, got {method!r}")
    return _run(spec, actions, point["timeout_s"])


def oversub_point(point: dict, workdir: Path, run_cgroups) -> dict:
    """Quota steps point['quotas'] (cores) every point['phase_iterations']; threads kept or followed."""
    from hpcdl.studies.malleable.cgroups import threads_for

    spec = _base_spec(point, workdir, f"oversub-{point['mode']}")
    quotas, phase = point["quotas"], point["phase_iterations"]
    spec["iterations"] = phase * len(quotas)
    cg = run_cgroups.job(spec["name"], float(quotas[0]))
    spec.update(cgroup=str(cg), follow_quota=point["mode"] == "follow")
    target = (
        (lambda q: threads_for(q, point["cores"]))
        if point["mode"] == "follow"
        else (lambda q: point["cores"])
    )
    actions = [
        (i * phase, _quota_action(run_cgroups, cg, float(q), target(q)))
        for i, q in enumerate(quotas)
        if i > 0
    ]
    return _run(spec, actions, point["timeout_s"])
