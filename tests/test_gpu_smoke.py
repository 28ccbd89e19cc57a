"""`make gpu`'s plumbing on the CPU (#42): what broke on the first H200 run, proven here.

The smoke rebuilds the GPU image's Python situation (envs/gpu_smoke_env.py): an interpreter in a venv
of its own, and the packages the image lacks on PYTHONPATH from a carried site directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hpcdl.platform.kit.procenv import child_env

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "envs"))
import gpu_carry  # noqa: E402
import gpu_files  # noqa: E402
import gpu_run  # noqa: E402


def test_the_plan_is_one_call_of_at_most_nine_minutes_with_a_limit_per_step():
    out = subprocess.run([sys.executable, str(REPO / "envs" / "gpu_run.py"), "--plan"], capture_output=True,
                         text=True, check=True).stdout
    budgets = dict(re.findall(r"^\s+(\w+)\s+(\d+) s", out, re.M))
    assert set(budgets) == {"setup", "tests", "engines", "calibrate", "studies", "total"}
    assert int(budgets["total"]) == sum(int(v) for k, v in budgets.items() if k != "total") <= 540
    assert int(budgets["tests"]) <= 210 and int(budgets["calibrate"]) <= 150 and int(budgets["engines"]) <= 60


def test_the_cuda_tests_are_spread_by_work_stealing_and_cut_per_test():
    """Defect 6: with --dist loadfile one worker ran all five checkpoint resume tests (122 s)."""
    argv = [str(a) for a in gpu_run.cuda_tests_argv("py", 6)]
    assert argv[argv.index("--dist") + 1] == "worksteal" and argv[argv.index("-n") + 1] == "6"
    assert argv[argv.index("-m", 2) + 1] == "cuda" and "--timeout" in argv


def test_an_unknown_step_is_refused_by_name():
    proc = subprocess.run([sys.executable, str(REPO / "envs" / "gpu_run.py"), "--steps", "setup,bogus",
                           "--plan"], capture_output=True, text=True)
    assert proc.returncode == 2 and "bogus" in proc.stderr


def test_only_wheels_for_any_python_3_are_carried_as_wheels():
    """A wheel built here for this machine's CPython 3.11 (pycachesim) made the image's pip (3.12) refuse
    the whole install; such a pin travels as its source archive and is built there."""
    portable = ["throttler-1.2.3-py3-none-any.whl", "humanfriendly-10.0-py2.py3-none-any.whl"]
    local = ["pycachesim-0.3.1-cp311-cp311-linux_x86_64.whl",
             "greenlet-3.5.6-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"]
    assert all(gpu_carry.is_portable(Path(w)) for w in portable)
    assert not any(gpu_carry.is_portable(Path(w)) for w in local)


def test_a_study_that_cannot_finish_in_the_time_left_is_not_started(tmp_path):
    """The H200 run started spatial with 99 s left, then with 235 s; it needs about 250 s and kept
    nothing either time. A study is started only where its measured GPU time fits what is left."""
    records = tmp_path / "records"
    proc = subprocess.run([sys.executable, str(REPO / "envs" / "gpu_run.py"), "--steps", "studies",
                           "--studies", "spatial hetmem", "--records", str(records), "--call-budget-s", "45"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    needs = gpu_run.ESTIMATE_S
    assert needs["spatial"] > 45 and needs["hetmem"] > 45  # the premise: neither fits the 45 s
    assert f"spatial needs about {needs['spatial']} s" in proc.stdout, proc.stdout
    assert f"hetmem needs about {needs['hetmem']} s" in proc.stdout
    assert (records / "studies-left.txt").read_text().split() == ["hetmem", "spatial"]
    assert not (records / "workflow.log").exists()  # no Snakemake call was made


def test_an_earlier_calls_records_left_on_the_machine_are_not_this_calls(tmp_path):
    """A device machine kept the 2026-11-26 call's records folder, and its hetmem and offload went into
    the 2026-11-27 archive beside that call's own studies."""
    records = tmp_path / "records"
    (records / "hetmem").mkdir(parents=True)
    (records / "hetmem" / "claims.json").write_text("{}")
    proc = subprocess.run([sys.executable, str(REPO / "envs" / "gpu_run.py"), "--steps", "studies",
                           "--studies", "spatial", "--records", str(records), "--call-budget-s", "30"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "an earlier call's records removed" in proc.stdout, proc.stdout + proc.stderr
    assert sorted(p.name for p in records.iterdir()) == ["studies-left.txt", "summary.json"]
    with tarfile.open(records.with_suffix(".tgz")) as tar:
        assert not any("hetmem" in n for n in tar.getnames())


def test_results_made_by_other_code_are_removed_and_this_codes_are_resumed(tmp_path, capsys):
    """Points are reused by their inputs, not by the code that computed them: a device machine that
    kept results-gpu/ from an earlier session's commit would pass those points off as this commit's."""
    results = tmp_path / "results-gpu"
    (results / "shuffle" / "points").mkdir(parents=True)
    (results / "shuffle" / "points" / "abc.json").write_text("{}")
    gpu_files.fresh_results(results, "a" * 40)          # unrecorded code: removed
    assert "made by unrecorded code" in capsys.readouterr().out
    assert not (results / "shuffle").exists()
    (results / "shuffle" / "points").mkdir(parents=True)
    (results / "shuffle" / "points" / "abc.json").write_text("{}")
    gpu_files.fresh_results(results, "a" * 40)          # the same code (a second call): resumed
    assert (results / "shuffle" / "points" / "abc.json").exists()
    gpu_files.fresh_results(results, "b" * 40)          # another commit: removed
    assert not (results / "shuffle").exists()
    assert (results / gpu_files.RESULTS_MARK).read_text() == "b" * 40 + "\n"
    version = gpu_files.code_version()
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty-[0-9a-f]{12})?", version), version


def _imports(python: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", "import pandas, torch, jsonschema, snakemake"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_wrapper_keeps_the_image_venv_where_a_symlink_loses_it(tmp_path):
    """Defect 1: `.gpu-bin/python` was a symlink to the image's venv interpreter, which then found no
    pyvenv.cfg and ran without the venv's packages. The setup step writes a wrapper that execs it."""
    records = tmp_path / "records"
    proc = subprocess.run([sys.executable, str(REPO / "envs" / "gpu_run.py"), "--smoke", "--steps", "setup",
                           "--records", str(records)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wrapper = REPO / ".gpu-smoke" / "bin" / "python"
    assert wrapper.read_text().startswith("#!/bin/sh\nexec ") and not wrapper.is_symlink()
    env = child_env(REPO / ".gpu-smoke" / "carry-site", REPO)
    assert _imports(str(wrapper), env).returncode == 0
    image_python = REPO / ".gpu-smoke" / "image-venv" / "bin" / "python"
    link = tmp_path / "bin" / "python"
    link.parent.mkdir()
    link.symlink_to(image_python)
    lost = _imports(str(link), env)
    assert lost.returncode != 0 and "No module named" in lost.stderr
    # the carried packages come only from PYTHONPATH: without it the image lacks jsonschema
    no_carry = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    bare = _imports(str(wrapper), child_env(REPO, base=no_carry))
    assert bare.returncode != 0 and "jsonschema" in bare.stderr
    device = json.loads((records / "device.json").read_text())
    assert device["device"] == "cpu" and device["torch"].split("+")[0] and device["python"].endswith("python")


@pytest.mark.slow
def test_make_gpu_smoke_runs_every_step_and_archives_the_records(tmp_path):
    records = tmp_path / "gpu-records"
    proc = subprocess.run(["make", "--no-print-directory", "gpu-smoke", f"GPU_RECORDS={records}"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    smoke = tmp_path / "gpu-records-smoke"   # the Makefile's suffix: a real run's records stay apart
    summary = {s["step"]: s for s in json.loads((smoke / "summary.json").read_text())}
    assert set(summary) == {"setup", "tests", "engines", "calibrate", "studies"}
    assert all(s["exit"] == 0 for s in summary.values()), summary
    # each study's own seconds, measured where record.json's duration_s is read off
    assert summary["studies"]["per_study"]["microbatch"]["exit"] == 0
    assert 0 < summary["studies"]["per_study"]["microbatch"]["seconds"] <= summary["studies"]["seconds"]
    calibrate_log = (smoke / "spatial-calibrate.log").read_text()
    assert "killed with" in calibrate_log and "resumed to" in calibrate_log   # defect 4's kill and resume
    assert "needs CUDA" in (smoke / "engines.log").read_text()
    assert not list((smoke / "engines").glob("*.csv"))
    claims = json.loads((smoke / "microbatch" / "claims.json").read_text())
    assert claims and (smoke / "microbatch" / "layer_speedup.csv").exists()
    archive = smoke.with_suffix(".tgz")
    assert archive.stat().st_size <= 16 * 2**20
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {f"{smoke.name}/device.json", f"{smoke.name}/summary.json",
            f"{smoke.name}/microbatch/claims.json"} <= names
    assert records.exists() is False   # nothing written where a real run's records go
