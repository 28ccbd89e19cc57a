"""Malleability study: policies, real cgroups, real job processes, real signals, faults, config errors."""

from __future__ import annotations

import copy
import os
import signal
import time
from pathlib import Path

import pytest

from hpcdl.platform.kit.config import ConfigError, validate_config
from hpcdl.platform.kit.procenv import child_env
from hpcdl.studies.malleable import cgroups, compute, policies, response
from hpcdl.studies.malleable.driver import Driver, group_members
from hpcdl.studies.malleable.job import read_log
from hpcdl.studies.malleable.scheduler import CoScheduler

DATA = "/usr/share/datasets/fashion-mnist"
TINY = {"batch_size": 32, "model": {"width": 8, "depth": 1}, "data_dir": DATA, "seed": 0}
CTRL, WHY = cgroups.usable()
needs_cgroups = pytest.mark.skipif(CTRL is None, reason=f"cgroups not writable here: {WHY}")


def _point(**kw) -> dict:
    return {"cores": 2, "timeout_s": 120, **TINY, **kw}


# ---- policies (pure) ------------------------------------------------------------------------------
def J(name, request=1, remaining=10, share=None):
    return policies.JobView(name, request, remaining, share)


def test_rigid_keeps_cores_fixed_and_makes_arrivals_wait_while_none_are_free():
    admit, shares = policies.decide("rigid", 2, [J("a", 2, share=2.0)], [J("b", 1)])
    assert admit == [] and shares == {"a": 2.0}
    admit, shares = policies.decide("rigid", 2, [], [J("b", 1), J("c", 2)])
    assert admit == ["b", "c"] and shares == {"b": 1.0, "c": 1.0}  # c runs on fewer cores than it asked
    admit, shares = policies.decide("rigid", 2, [J("c", 2, share=1.0)], [])  # a departure frees nothing for c
    assert shares == {"c": 1.0}


def test_malleable_policies_rebalance_all_cores_on_every_event():
    assert policies.decide("equal", 2, [J("a", share=2.0)], [J("b")]) == (["b"], {"a": 1.0, "b": 1.0})
    assert policies.decide("equal", 2, [J("a", share=1.0)], [])[1] == {"a": 2.0}
    # every core holds one job: the arrival waits (no time-slicing), first come, first served
    assert policies.decide("equal", 2, [J("a", share=1.0), J("b", share=1.0)], [J("c"), J("d")]) == (
        [], {"a": 1.0, "b": 1.0})
    admit, shares = policies.decide("equal", 4, [J("a", share=4.0)], [J("b"), J("c"), J("d"), J("e")])
    assert admit == ["b", "c", "d"] and shares == {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}
    _, shares = policies.decide(
        "proportional", 4, [J("a", remaining=30), J("b", remaining=10)], [J("c", remaining=10)]
    )
    assert shares == {"a": 2.0, "b": 1.0, "c": 1.0}  # one core each, the spare one to the most work
    _, shares = policies.decide("proportional", 8, [J("a", remaining=30), J("b", remaining=10)], [])
    assert shares == {"a": 6.0, "b": 2.0}  # whole cores while jobs <= cores
    assert policies.threads_for_share(0.4, 2) == 1 and policies.threads_for_share(1.6, 2) == 2
    with pytest.raises(ValueError, match="policy must be one of"):
        policies.decide("fifo", 2, [], [])


# ---- cgroups ----------------------------------------------------------------------------------------
@needs_cgroups
def test_run_cgroups_set_quota_read_back_and_removed():
    run = cgroups.RunCgroups(CTRL, 10000)
    try:
        cg = run.job("x", 1.5)
        assert cgroups.read_quota(cg) == pytest.approx(1.5)
        run.set_quota(cg, None)
        assert cgroups.read_quota(cg) is None
        assert run.path.parent == CTRL.base and run.path.name.startswith(f"run-{os.getpid()}-")
    finally:
        run.remove()
    assert not run.path.exists()


@needs_cgroups
def test_stale_sweep_removes_run_dirs_of_dead_owners_only():
    stale = CTRL.base / "run-999999999-1-deadbeef"  # no such pid
    stale.mkdir(parents=True)
    (stale / "job-0").mkdir()
    run = cgroups.RunCgroups(CTRL, 10000)  # sweeps at start
    try:
        assert stale.name in run.swept and not stale.exists()
        assert run.path.exists()  # ours (owner alive) is kept by a second sweep
        assert run.path.name not in cgroups.sweep_stale(CTRL)
    finally:
        run.remove()


# ---- jobs: real processes, real signals ------------------------------------------------------------
def _job_spec(tmp_path: Path, name: str, iterations: int, **kw) -> dict:
    return {
        "name": name,
        "iterations": iterations,
        "threads": 2,
        "max_threads": 2,
        **TINY,
        "log_file": str(tmp_path / f"{name}.jsonl"),
        "control_file": str(tmp_path / f"{name}.ctl"),
        "cgroup": None,
        "follow_quota": False,
        **kw,
    }


def test_api_and_signal_changes_apply_at_the_next_iteration_boundary(tmp_path):
    # ~1-2 ms an iteration: 200 leave the second request room when its sender runs late under load
    spec = _job_spec(tmp_path, "api", 200, api_schedule=[[2, 1], [5, 2]])
    res = response._run(spec, [], 120)
    rows = compute.change_rows(
        {"experiment": "response", "variant": "api"}, {**res, "requests": res["requests"]}
    )
    assert [(r["outcome"], r["target_threads"], r["lag_iters"]) for r in rows] == [
        ("applied", 1, 0),
        ("applied", 2, 0),
    ]
    # each change holds from the boundary it was applied at to the next; where the API thread's call
    # lands (it waits for iteration 2, then 5, to start) is the scheduler's choice, so only its order
    k1, k2 = (r["applied_iteration"] for r in rows)
    assert 3 <= k1 < k2 and k2 >= 6
    want = {s["iteration"]: 2 if s["iteration"] < k1 or s["iteration"] >= k2 else 1 for s in res["series"]}
    assert {s["iteration"]: s["threads"] for s in res["series"]} == want and len(want) == 200

    spec = _job_spec(tmp_path, "sig", 200)
    res = response._run(spec, [(2, response._signal_action(spec["control_file"], 1))], 120)
    (row,) = compute.change_rows({"experiment": "response", "variant": "signal"}, res)
    assert row["outcome"] == "applied" and row["lag_iters"] == 0 and row["target_threads"] == 1
    # the iteration the signal lands in is the scheduler's choice (a clean-clone `make test` once saw
    # the driver send it during iteration 4): what the job controls is lag_iters == 0 above, the first
    # boundary after the request, and never a change before the signal was sent (at iteration 2)
    assert row["applied_iteration"] >= 2 and res["series"][-1]["threads"] == 1
    assert row["latency_s"] > 0


def test_out_of_range_requests_are_clamped_with_a_warning_and_the_job_goes_on(tmp_path):
    # an iteration takes 1-2 ms: 400 of them leave the last request (sent once 99 was read) about half
    # a second of boundaries to land on when the driver runs late under load (with 7, a CI run saw it
    # arrive during the final iteration)
    spec = _job_spec(tmp_path, "clamp", 400)
    Path(spec["control_file"]).write_text("0")  # read at start: clamped to 1
    send_99 = response._signal_action(spec["control_file"], 99)
    send_minus_3 = response._signal_action(spec["control_file"], -3)

    def after_99_was_read(proc):
        # one control file holds the latest request: a driver running late under load could overwrite
        # 99 before the job's boundary read it (the job then rightly sees only -3). Each value's clamp
        # is what this test is about, so -3 waits until a boundary has read 99.
        deadline = time.time() + 60
        while not any(r["type"] == "request" and r["target"] == 99 for r in read_log(spec["log_file"])):
            assert time.time() < deadline and proc.exitcode is None, "the job never read the request of 99"
            time.sleep(0.002)
        return send_minus_3(proc)

    acts = [(2, send_99), (4, after_99_was_read)]
    res = response._run(spec, acts, 120)
    threads = [s["threads"] for s in res["series"]]
    assert len(threads) == 400 and threads[0] == 1 and 2 in threads and threads[-1] == 1
    text = " | ".join(res["warnings"])
    assert "initial thread count 0 is outside 1..2" in text
    assert "signal request of 99 is outside 1..2" in text and "signal request of -3 is outside 1..2" in text


def test_garbage_in_the_control_file_is_ignored_with_a_line_naming_the_file(tmp_path):
    spec = _job_spec(tmp_path, "garbage", 6)

    def garbage(proc):
        Path(spec["control_file"]).write_text("two threads please")
        os.kill(proc.pid, signal.SIGUSR1)
        return {"time": time.time(), "target": 2, "source": "signal"}

    res = response._run(spec, [(2, garbage)], 120)
    assert [s["threads"] for s in res["series"]] == [2] * 6  # nothing changed, all iterations ran
    assert any(
        f"ignoring control file {spec['control_file']}: 'two threads please'" in w for w in res["warnings"]
    )


def test_set_threads_refuses_a_non_integer(tmp_path):
    from hpcdl.studies.malleable.job import JobLog, MalleableJob

    job = MalleableJob(_job_spec(tmp_path, "t", 1), JobLog(str(tmp_path / "t.jsonl"), "t"))
    with pytest.raises(TypeError, match="integer thread count"):
        job.set_threads(1.5)
    job.set_threads(0)  # accepted now, clamped (with a warning) at the boundary
    job.run()
    assert any(
        r["type"] == "warning" and "api request of 0" in r["message"]
        for r in read_log(str(tmp_path / "t.jsonl"))
    )


def _quota_response(tmp_path: Path, run, iterations: int) -> tuple[dict, list[dict]]:
    """Threads 2 -> 1 -> 2 by rewriting the job's quota at iterations 2 and 5: (result, change rows)."""
    try:
        res = response.response_point(
            _point(experiment="response", method="quota", iterations=iterations, change_at=[2, 5],
                   low_threads=1),
            tmp_path,
            run,
        )
    finally:
        run.remove()
    return res, compute.change_rows({"experiment": "response", "variant": "quota"}, res)


BOTH_WITHIN_ONE = [("applied", 1, 0), ("applied", 2, 0)]  # (outcome, threads, lag): no iteration late


@needs_cgroups
def test_job_follows_its_cgroup_quota_within_one_iteration(tmp_path):
    # ~1-2 ms an iteration: 200 leave the second write room when the driver runs late under load
    res, rows = _quota_response(tmp_path, cgroups.RunCgroups(CTRL, 10000), 200)
    assert [(r["outcome"], r["target_threads"], r.get("lag_iters")) for r in rows] == BOTH_WITHIN_ONE
    seen = [(s["threads"], s["quota_cores"]) for s in res["series"]]
    assert (
        seen[0] == (2, pytest.approx(2.0))
        and (1, pytest.approx(1.0)) in seen
        and seen[-1] == (2, pytest.approx(2.0))
    )


@needs_cgroups
def test_a_driver_stalled_inside_the_quota_write_dates_the_request_when_the_write_is_done(tmp_path):
    # a driver preempted inside the request call, made certain: each quota write waits 50 ms first
    # (~30 of the job's iterations). Dated before the call, those iterations would count as lag.
    class StalledWrites(cgroups.RunCgroups):
        def set_quota(self, path, cores):
            time.sleep(0.05)
            super().set_quota(path, cores)

    # 1000 iterations: under the other test worker's load the job once ended (300 iterations) before
    # the second stalled write, which then read "not applied"; the lag is counted the same either way
    _, rows = _quota_response(tmp_path, StalledWrites(CTRL, 10000), 1000)
    assert [(r["outcome"], r["target_threads"], r.get("lag_iters")) for r in rows] == BOTH_WITHIN_ONE
    assert all(r["latency_s"] > 0 for r in rows)


# ---- the co-scheduler: a crash, and a SIGKILL -------------------------------------------------------
def test_crashed_job_is_recorded_failed_and_its_cores_go_to_the_others(tmp_path):
    run = cgroups.RunCgroups(CTRL, 10000) if CTRL else None
    try:
        workload = [
            {"name": "a", "arrival_s": 0, "iterations": 300, "request_cores": 1},
            {"name": "b", "arrival_s": 0, "iterations": 40, "request_cores": 1, "crash_at": 3},
        ]
        res = CoScheduler(workload, "equal", 2, TINY, tmp_path, run, timeout_s=120).run()
    finally:
        if run:
            run.remove()
    jobs = {j["job"]: j for j in res["jobs"]}
    assert jobs["b"]["status"] == "failed" and "injected crash at iteration 3" in jobs["b"]["error"]
    assert jobs["a"]["status"] == "ok" and jobs["a"]["iterations_done"] == 300
    after = [d for d in res["decisions"] if d["event"] == "failure"]
    assert after and all(d["job"] == "a" and d["cores"] == 2.0 and d["threads"] == 2 for d in after)
    a_iters = [s for s in res["series"] if s["job"] == "a"]
    assert a_iters[-1]["threads"] == 2
    first = [d for d in res["decisions"] if d["event_index"] == 0]
    assert {d["job"]: d["cores"] for d in first} == {"a": 1.0, "b": 1.0}  # the equal share before the crash


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_killed_scheduler_leaves_no_job_running_and_no_cgroup(tmp_path):
    point = _point(
        experiment="cosched",
        repeat=0,
        policies=["equal"],
        jobs=[{"name": str(i), "arrival_s": 0, "iterations": 100000, "request_cores": 1} for i in range(2)],
    )
    drv = Driver(point, tmp_path / "drv", 10000)
    logs = [tmp_path / "drv" / "equal" / f"job-{i}.jsonl" for i in range(2)]  # each policy its own folder
    deadline = time.time() + 90
    while not all(any(r["type"] == "iter" for r in read_log(str(p))) for p in logs):
        assert time.time() < deadline and drv.proc.poll() is None, (
            tmp_path / "drv" / "driver.log"
        ).read_text()
        time.sleep(0.1)
    pids = [next(r["pid"] for r in read_log(str(p)) if r["type"] == "start") for p in logs]
    assert all(_alive(p) for p in pids)
    cg_path = drv.run.path if drv.run else None
    os.kill(drv.proc.pid, signal.SIGKILL)
    drv.proc.wait()
    deadline = time.time() + 15  # the jobs die with the forkserver, the forkserver with the driver
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "a job outlived its killed scheduler"
    drv.finish()
    assert group_members(drv.proc.pid) == []
    if cg_path is not None:
        assert not cg_path.exists(), "the killed scheduler's cgroups were left behind"


# ---- configuration -------------------------------------------------------------------------------------
def _cfg(test_config, **block):
    cfg = copy.deepcopy(test_config)
    cfg["studies"] = ["malleable"]
    cfg["malleable"].update(block)
    return cfg


@pytest.mark.parametrize(
    "block, key",
    [
        ({"response": {"change_at": [5, 3], "iterations": 8}}, "malleable.response.change_at"),
        ({"response": {"low_threads": 2}}, "malleable.response.low_threads"),
        ({"oversub": {"quotas": [2, 3]}}, "malleable.oversub.quotas"),
        (
            {"cosched": {"jobs": [{"arrival_s": 0, "iterations": 5, "request_cores": 4}]}},
            "malleable.cosched.jobs[0].request_cores",
        ),
        ({"cosched": {"policies": ["fifo"]}}, "malleable.cosched.policies[0]"),
        ({"cores": 0}, "malleable.cores"),
        ({"cfs_period_us": 10}, "malleable.cfs_period_us"),
    ],
)
def test_bad_config_names_the_key(test_config, block, key):
    with pytest.raises(ConfigError) as err:
        validate_config(_cfg(test_config, **block))
    assert err.value.key == key, str(err.value)


def test_points_cover_every_experiment(test_config):
    from hpcdl.studies.malleable import sweep

    cfg = validate_config(_cfg(test_config))
    pts = sweep.response_points(cfg) + sweep.oversub_points(cfg) + sweep.cosched_points(cfg)
    runs = [(lab["experiment"], lab["repeat"], lab["variant"]) for p in pts for lab in sweep.labels(p)]
    # test.yaml: 2 repeats; each repeat's point runs every compared variant, the order rotated per repeat
    assert runs == [  # a line a point
        ("response", 0, "api"), ("response", 0, "signal"), ("response", 0, "quota"),
        ("oversub", 0, "keep"), ("oversub", 0, "follow"),
        ("oversub", 1, "follow"), ("oversub", 1, "keep"),
        ("cosched", 0, "rigid"), ("cosched", 0, "equal"), ("cosched", 0, "proportional"),
        ("cosched", 1, "equal"), ("cosched", 1, "proportional"), ("cosched", 1, "rigid"),
    ]


_READONLY_PROBE = """
import json, sys
from hpcdl.studies.malleable import compute
base = dict(cores=2, timeout_s=120, batch_size=32, model={"width": 8, "depth": 1}, data_dir=sys.argv[1],
            seed=0)
over = compute.run({**base, "experiment": "oversub", "repeat": 0, "modes": ["keep"], "quotas": [2, 1],
                    "phase_iterations": 3}, 10000)
jobs = [{"name": "0", "arrival_s": 0, "iterations": 4, "request_cores": 2}]
co = compute.run({**base, "experiment": "cosched", "repeat": 0, "policies": ["equal"], "jobs": jobs},
                 10000)
print(json.dumps({"oversub": over["points"][0], "cosched": co["points"][0], "iters": len(co["series"])}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to remount the cgroup file system read-only")
def test_read_only_cgroupfs_skips_quota_points_with_the_reason_and_runs_thread_only_ones(tmp_path):
    """A private mount namespace where the cpu hierarchy is read-only: a real unwritable cgroupfs."""
    import json
    import shutil
    import subprocess
    import sys

    if CTRL is None or shutil.which("unshare") is None:
        pytest.skip(f"needs a cpu cgroup hierarchy and unshare(1): {WHY}")
    script = tmp_path / "probe.py"
    script.write_text(_READONLY_PROBE)
    cmd = f"mount -o remount,bind,ro {CTRL.mount} && exec {sys.executable} {script} {DATA}"
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(Path(__file__).parent.parent),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["oversub"]["status"] == "skipped"
    assert "read-only cgroup file system" in out["oversub"]["reason"]
    assert out["cosched"]["status"] == "ok" and out["cosched"]["enforcement"] == "threads"
    assert "read-only cgroup file system" in out["cosched"]["reason"] and out["iters"] == 4


@needs_cgroups
def test_sigusr2_matches_the_thread_count_to_the_cgroup_quota(tmp_path):
    run = cgroups.RunCgroups(CTRL, 10000)
    try:
        cg = run.job("usr2", 1.0)  # quota of one core, job started with two threads, not following
        spec = _job_spec(tmp_path, "usr2", 6, cgroup=str(cg))

        def usr2(proc):
            os.kill(proc.pid, signal.SIGUSR2)
            return {"time": time.time(), "target": 1, "source": "signal-quota"}

        res = response._run(spec, [(2, usr2)], 120)
    finally:
        run.remove()
    threads = [s["threads"] for s in res["series"]]
    assert threads[0] == 2 and threads[-1] == 1
    assert [a["source"] for a in res["applied"]] == ["signal-quota"]
