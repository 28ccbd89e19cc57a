"""Sweeps survive a kill: real task apps and a real Snakemake, SIGKILLed (or interrupted) mid-sweep.

Per study: start `python -m tasks.<study>`, wait until the point store holds finished records,
SIGKILL the app's process group, rerun it. No point finished before the kill executes again (the
store's started/<session>/<key> markers count executions), run_summary.json says what was reused,
and the raw tables equal an uninterrupted run's on every deterministic column. HPO resumes through
its Optuna journal instead (tests/test_hpo_app.py::test_sigkill_driver_mid_study_then_resume).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from raw_tables import assert_same_raw_tables

from hpcdl.platform.kit.points import executions

REPO = Path(__file__).resolve().parent.parent
HANG_GUARD_S = 300  # only bounds a hung run; no assertion depends on how long anything takes
# Columns that measure time, bandwidth, memory or name a process (as in test_pycompss_conformance).


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCDL_")}
    return {**env, "HPCDL_PROGRESS": "0", "MPLBACKEND": "Agg",
            "PATH": f"{Path(sys.executable).parent}:{env['PATH']}", **extra}


def _overrides(study: str, test_config: dict, tmp_path: Path) -> dict:
    """test.yaml shrunk to a handful of points per study, every kind of task still present."""
    if study == "checkpoint":
        ck = test_config["checkpoint"]
        return {"checkpoint": {**ck, "formats": ["torch", "npz"], "dcp_ranks": [],
                               "sizes": {"min_params": 4096, "max_params": 4096, "points": 1},
                               "overhead": {**ck["overhead"], "modes": ["sync"], "intervals": [2]}}}
    if study == "shuffle":  # two points: the kill lands after the first, as it would after the first of more
        sh = test_config["shuffle"]
        return {"shuffle": {**sh, "kakurenbo": {"fractions": [0], "world_size": 2},
                            "grids": [{**sh["grids"][0], "qs": [0, 0.5]}]}}
    # exactness, calibration, then the train run alone: a strong run is the same task (scaling_run)
    sp = test_config["spatial"]
    return {"spatial": {**sp, "strong": {**sp["strong"], "layouts": []},
                        "hybrid": {**sp["hybrid"], "layouts": []}},
            "data": {"resources_dir": str(tmp_path / "resources")}}


# Records to wait for before the kill: spatial gets past its exactness and calibration phases.
KILL_AFTER = {"checkpoint": 2, "shuffle": 1, "spatial": 2}


def _ok_records(root: Path) -> dict[str, dict]:
    out = {}
    for path in root.glob("*.json"):
        rec = json.loads(path.read_text())
        if rec["status"] == "ok":
            out[rec["key"]] = rec
    return out


def _wait_for_records(root: Path, proc: subprocess.Popen, n: int) -> None:
    """Poll the store until n points are finished; the process must still be running then."""
    deadline = time.monotonic() + HANG_GUARD_S
    while len(_ok_records(root)) < n:
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {n} points finished"
        assert time.monotonic() < deadline, f"hang guard: under {n} finished points after {HANG_GUARD_S} s"
        time.sleep(0.05)


def _app(study: str, config: Path, **env) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", f"tasks.{study}", "--config", str(config)], cwd=REPO,
                          env=_env(**env), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _summary(results: Path, study: str) -> dict:
    return json.loads((results / study / "raw" / "run_summary.json").read_text())


def _assert_not_rerun(root: Path, finished: dict[str, dict], raw_bytes: dict[str, bytes]) -> None:
    """Points finished before the kill kept their record and never started in a later session."""
    runs = executions(root)
    for key, rec in finished.items():
        assert runs[key] == [rec["session"]], f"point {key} ({rec['task']}) ran again: {runs[key]}"
        assert (root / f"{key}.json").read_bytes() == raw_bytes[key], key


@pytest.mark.slow
@pytest.mark.parametrize("study", ["checkpoint", "shuffle", "spatial"])
def test_sigkilled_app_reruns_only_unfinished_points(study, tmp_path, write_config, test_config):
    over = _overrides(study, test_config, tmp_path)
    # Equal-length results paths: DCP's metadata holds the checkpoint path, so sizes depend on it.
    killed_cfg = write_config("killed.yaml", studies=[study], results_dir=str(tmp_path / "K"), **over)
    whole_cfg = write_config("whole.yaml", studies=[study], results_dir=str(tmp_path / "W"), **over)
    root = tmp_path / "K" / study / "points"

    _app(study, whole_cfg)  # the uninterrupted reference
    total = _summary(tmp_path / "W", study)["total"]

    log = open(tmp_path / "killed.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", f"tasks.{study}", "--config", str(killed_cfg)], cwd=REPO,
                            env=_env(), stdout=log, stderr=log, start_new_session=True)
    try:
        _wait_for_records(root, proc, KILL_AFTER[study])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the app and its workers and ranks, nothing else
        proc.wait()
        log.close()
    finished = _ok_records(root)
    raw_bytes = {k: (root / f"{k}.json").read_bytes() for k in finished}
    assert KILL_AFTER[study] <= len(finished) < total, "the kill must land mid-sweep"
    assert not (tmp_path / "K" / study / "raw" / "run_summary.json").exists()

    rerun = _app(study, killed_cfg)
    _assert_not_rerun(root, finished, raw_bytes)
    assert _summary(tmp_path / "K", study) == {"ok": total - len(finished), "failed": 0,
                                               "skipped": len(finished), "total": total}
    assert len(_ok_records(root)) == total
    assert "reused" in rerun.stderr
    assert_same_raw_tables(tmp_path / "K" / study / "raw", tmp_path / "W" / study / "raw")

    if study == "checkpoint":
        # A grown sweep recomputes only the new points: one format more = its I/O and resume points.
        ck = over["checkpoint"]
        grown = write_config("killed.yaml", studies=[study], results_dir=str(tmp_path / "K"),
                             checkpoint={**ck, "formats": [*ck["formats"], "hdf5"]})
        before = set(executions(root))
        _app(study, grown)
        new = set(executions(root)) - before
        assert _summary(tmp_path / "K", study) == {"ok": 3, "failed": 0, "skipped": total, "total": total + 3}
        assert sorted(json.loads((root / f"{k}.json").read_text())["task"] for k in new) == \
            ["io", "io", "resume"]


@pytest.mark.slow
def test_failed_points_are_retried_unless_kept(tmp_path, write_config, test_config):
    ck = test_config["checkpoint"]
    # The largest state over the scratch budget (as in test_checkpoint_faults): its I/O point fails.
    block = {**ck, "formats": ["torch"], "modes": ["sync"], "dcp_ranks": [], "scratch_limit_mb": 2,
             "sizes": {"min_params": 262144, "max_params": 262144, "points": 1},
             "overhead": {**ck["overhead"], "modes": ["sync"], "intervals": [2]}}
    config = write_config(studies=["checkpoint"], checkpoint=block)
    results = tmp_path / "results"
    root = results / "checkpoint" / "points"
    _app("checkpoint", config)
    assert _summary(results, "checkpoint") == {"ok": 2, "failed": 1, "skipped": 0, "total": 3}
    records = {k: json.loads((root / f"{k}.json").read_text()) for k in executions(root)}
    failed = [k for k, r in records.items() if r["status"] == "failed"]
    assert len(failed) == 1 and "checkpoint.scratch_limit_mb" in records[failed[0]]["error"]

    _app("checkpoint", config)  # the failed point runs again, the others are reused
    assert _summary(results, "checkpoint") == {"ok": 0, "failed": 1, "skipped": 2, "total": 3}
    runs = executions(root)
    assert len(runs[failed[0]]) == 2 and all(len(runs[k]) == 1 for k in records if k not in failed)
    io = pd.read_csv(results / "checkpoint" / "raw" / "io.csv")
    assert list(io["status"]) == ["failed"] and "checkpoint.scratch_limit_mb" in io.loc[0, "error"]

    _app("checkpoint", config, HPCDL_KEEP_FAILED="1")  # a stored failure is final: nothing runs
    assert _summary(results, "checkpoint") == {"ok": 0, "failed": 1, "skipped": 2, "total": 3}
    assert executions(root) == runs
    io = pd.read_csv(results / "checkpoint" / "raw" / "io.csv")
    assert list(io["status"]) == ["failed"] and "checkpoint.scratch_limit_mb" in io.loc[0, "error"]


def _snakemake(workdir: Path, config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(config), *args]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_snakemake_killed_mid_run_then_rerun_reuses_points(sig, tmp_path, write_config, test_config):
    over = _overrides("checkpoint", test_config, tmp_path)
    over["checkpoint"]["formats"] = ["torch"]  # 4 points: 2 I/O, 1 resume, 1 overhead
    config = write_config(studies=["checkpoint"], **over)
    results = tmp_path / "results"
    root = results / "checkpoint" / "points"
    log = open(tmp_path / "snakemake1.log", "w")
    # A test run started in the background (nohup, `make test &`, CI) inherits SIGINT ignored, and
    # an ignored signal stays ignored across exec: give Snakemake the terminal's default back.
    proc = subprocess.Popen(_snakemake(tmp_path, config, "--cores", "2"), env=_env(), stdout=log,
                            stderr=log, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_for_records(root, proc, 1)
    finally:
        os.killpg(proc.pid, sig)  # Ctrl-C reaches the whole foreground group; kill -9 of it likewise
        # Snakemake's log handler swallows a KeyboardInterrupt that lands while it writes a record
        # (snakemake/logging.py); a user then presses Ctrl-C again, and so does this test.
        for _ in range(10 if sig == signal.SIGINT else 0):
            try:
                proc.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):  # it may end between wait and kill
                    os.killpg(proc.pid, sig)
        proc.wait(timeout=HANG_GUARD_S)
        log.close()
    assert proc.returncode != 0, (tmp_path / "snakemake1.log").read_text()[-3000:]
    finished = _ok_records(root)
    raw_bytes = {k: (root / f"{k}.json").read_bytes() for k in finished}
    assert 1 <= len(finished) < 4, "the kill must land mid-sweep"

    if sig == signal.SIGKILL:  # Snakemake had no chance to remove its lock (README: Resuming)
        unlock = subprocess.run(_snakemake(tmp_path, config, "--unlock"), env=_env(), capture_output=True,
                                text=True, timeout=HANG_GUARD_S)
        assert unlock.returncode == 0, unlock.stderr[-3000:]
    # After kill -9 the rerun goes on to the claims (the stages after a resumed run, once); after
    # Ctrl-C only to the run's outputs: those stages take the same path whichever signal stopped it.
    target = [] if sig == signal.SIGKILL else [str(results / "checkpoint" / "raw" / "run_summary.json")]
    rerun = subprocess.run(_snakemake(tmp_path, config, "--cores", "2", "--rerun-incomplete", *target),
                           env=_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    _assert_not_rerun(root, finished, raw_bytes)
    summary = _summary(results, "checkpoint")
    assert summary == {"ok": 4 - len(finished), "failed": 0, "skipped": len(finished), "total": 4}
    assert len(_ok_records(root)) == 4
    if sig == signal.SIGKILL:
        claims = json.loads((results / "checkpoint" / "claims.json").read_text())
        assert claims["study"] == "checkpoint" and claims["total"] >= 1
    else:
        assert not (results / "checkpoint" / "claims.json").exists()  # the target held the rerun there
