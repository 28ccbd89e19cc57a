"""The cluster path against a real single-node Slurm (.ci/slurm.sh, fixture in tests/slurm_cluster.py).

- a whole study's test-scale workflow under `snakemake --profile slurm`: every rule a Slurm job,
  tables shaped like a local run's;
- a 2-rank rule (resources tasks=2, mpi="srun") whose ranks come from srun (SLURM_PROCID), and one
  inside a plain rule's 1-task step, where the ranks start locally (forked) instead of a hanging srun;
- a failing rule: non-zero exit with the failure in the log; the rerun resumes without redoing
  finished rules;
- sbatch missing: a clear error before any rule runs (no cluster needed for that one).
Snakemake always runs under `timeout -k` so a stuck status loop cannot hang the suite.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from slurm_cluster import slurm_cluster, unavailable  # noqa: F401  (session fixture: Slurm up/down)

from hpcdl.platform.slurm import SLURM_CLIENTS, SlurmUnavailable, require_slurm, require_slurm_for

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "slurm" / "Snakefile"
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# The plugin's status loop at test speed (the profile's defaults suit real clusters).
FAST_POLL = ["--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1"]
SLURM_TOOLS = {*SLURM_CLIENTS, "sinfo", "scontrol", "sacct", "salloc", "sattach", "sbcast", "sstat",
               "sshare", "sprio", "sreport", "sacctmgr", "sdiag", "strigger", "scrontab"}
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+)")


def job_env(path: str | None = None) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{path or env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("SLURM_JOB_ID", None)  # never nest inside an outer allocation
    for var in ("HPCDL_SLURM_PARTITION", "HPCDL_SLURM_ACCOUNT"):  # the test cluster has its own default
        env.pop(var, None)
    return env


def snakemake(args: list[str], timeout_s: int = 600, path: str | None = None,
              extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Run snakemake from the repo root (so `--profile slurm` resolves to ./slurm) with a hard timeout."""
    cmd = ["timeout", "-k", "15", str(timeout_s), SNAKEMAKE, *args]
    env = {**job_env(path), **(extra_env or {})}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    proc.output = proc.stdout + proc.stderr
    assert proc.returncode not in (124, 137), f"snakemake hung past {timeout_s} s:\n{proc.output[-4000:]}"
    return proc


def slurm_jobs_by_rule(workdir: Path) -> dict[str, list[str]]:
    """Slurm job ids per rule, from the plugin's kept logs (.snakemake/slurm_logs/rule_<r>/<id>.log)."""
    jobs: dict[str, list[str]] = {}
    for log in (workdir / ".snakemake" / "slurm_logs").glob("rule_*/**/*.log"):
        rule = log.relative_to(workdir / ".snakemake" / "slurm_logs").parts[0].removeprefix("rule_")
        jobs.setdefault(rule, []).append(log.stem)
    return jobs


# ---------------------------------------------------------------------------------------------
# sbatch missing: no cluster needed

def path_without_slurm(tmp_path: Path) -> str:
    """A PATH with every tool of the current one except Slurm's clients (symlinks in one dir)."""
    bin_dir = tmp_path / "noslurm-bin"
    bin_dir.mkdir()
    for d in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            target = bin_dir / entry.name
            if entry.name in SLURM_TOOLS or target.exists() or not os.access(entry.path, os.X_OK):
                continue
            target.symlink_to(entry.path)
    return str(bin_dir)


def test_require_slurm_names_missing_tools(tmp_path):
    with pytest.raises(SlurmUnavailable, match=r"sbatch, squeue, scancel, srun are not on PATH"):
        require_slurm(path=str(tmp_path))


def test_require_slurm_reports_dead_controller(tmp_path):
    for tool in (*SLURM_CLIENTS, "scontrol"):
        f = tmp_path / tool
        f.write_text("#!/bin/sh\necho 'Slurmctld(primary) at head is DOWN'\nexit 1\n")
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(SlurmUnavailable, match=r"slurmctld is not reachable .*is DOWN"):
        require_slurm(path=str(tmp_path))


def test_require_slurm_for_other_executors_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    require_slurm_for(None)
    require_slurm_for("local")
    with pytest.raises(SlurmUnavailable):
        require_slurm_for("slurm")


def test_unavailable_cluster_skips_locally_but_fails_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="not root"):
        unavailable("not root")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true but .* not root"):
        unavailable("not root")


def test_profile_without_sbatch_fails_before_any_work(tmp_path):
    workdir = tmp_path / "wd"
    proc = snakemake(["--profile", "slurm", "-s", str(TINY), "--directory", str(workdir), *FAST_POLL],
                     timeout_s=120, path=path_without_slurm(tmp_path))
    assert proc.returncode != 0
    assert "sbatch" in proc.output and "not on PATH" in proc.output, proc.output[-3000:]
    assert not (workdir / "first.txt").exists()
    assert not SUBMITTED.search(proc.output)


def test_profile_found_from_repo_root_takes_partition_and_account_from_env(tmp_path):
    env = {"HPCDL_SLURM_PARTITION": "gpu_p", "HPCDL_SLURM_ACCOUNT": "prj42"}
    proc = snakemake(["--profile", "slurm", "-n", "-s", str(TINY), "--directory", str(tmp_path)],
                     timeout_s=120, extra_env=env)
    assert proc.returncode == 0, proc.output[-3000:]
    assert "Using profile slurm" in proc.output
    resources = [line for line in proc.output.splitlines() if line.strip().startswith("resources:")]
    assert resources and all("slurm_partition=gpu_p" in r and "slurm_account=prj42" in r for r in resources)
    assert any("tasks=2" in r and "mpi=srun" in r for r in resources)


# ---------------------------------------------------------------------------------------------
# the tiny workflow: a plain rule, a 2-rank rule, a rule that fails until a flag file exists

@pytest.fixture(scope="module")
def tiny_failed_run(slurm_cluster, tmp_path_factory):  # noqa: F811
    workdir = tmp_path_factory.mktemp("slurm-tiny")
    proc = snakemake(["--profile", "slurm", "-s", str(TINY), "--directory", str(workdir), *FAST_POLL])
    return workdir, proc


@pytest.mark.slurm
@pytest.mark.slow
def test_two_rank_rule_gets_ranks_from_srun(tiny_failed_run):
    workdir, proc = tiny_failed_run
    ranks_json = workdir / "ranks.json"
    assert ranks_json.exists(), proc.output[-4000:]
    record = json.loads(ranks_json.read_text())
    assert record["launcher"] == "srun"
    ranks = record["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    # rank identity came from srun, inside the rule's own Slurm job
    assert [r["slurm_procid"] for r in ranks] == ["0", "1"]
    assert all(r["world_size"] == 2 and r["sum"] == pytest.approx(3.0) for r in ranks)
    assert {r["slurm_job_id"] for r in ranks} == {record["job_id"]}
    assert slurm_jobs_by_rule(workdir)["ranks"] == [record["job_id"]]


@pytest.mark.slurm
@pytest.mark.slow
def test_ranks_inside_a_one_task_step_use_the_local_launcher(tiny_failed_run):
    workdir, proc = tiny_failed_run
    path = workdir / "ranks_in_step.json"
    assert path.exists(), proc.output[-4000:]
    record = json.loads(path.read_text())
    assert record["launcher"] == "fork"
    assert [r["rank"] for r in record["ranks"]] == [0, 1]
    assert all(r["sum"] == pytest.approx(3.0) for r in record["ranks"])
    assert slurm_jobs_by_rule(workdir)["ranks_in_step"] == [record["job_id"]]


@pytest.mark.slurm
@pytest.mark.slow
def test_failing_rule_fails_the_run_and_rerun_resumes(tiny_failed_run):
    workdir, proc = tiny_failed_run
    assert proc.returncode != 0
    assert "Error in rule boom" in proc.output
    assert "deliberate failure: boom.ok missing" in proc.output  # the rule's log, shown by the profile
    assert not (workdir / "boom.txt").exists()
    first_jobs = slurm_jobs_by_rule(workdir)
    assert len(first_jobs["first"]) == 1 and len(first_jobs["boom"]) == 1
    first_mtime = (workdir / "first.txt").stat().st_mtime_ns

    (workdir / "boom.ok").touch()
    rerun = snakemake(["--profile", "slurm", "-s", str(TINY), "--directory", str(workdir), *FAST_POLL])
    assert rerun.returncode == 0, rerun.output[-4000:]
    assert (workdir / "boom.txt").read_text().startswith("slurm_job_id=")
    resubmitted = {m.group(1) for m in SUBMITTED.finditer(rerun.output)}
    assert len(resubmitted) == 1  # boom only
    jobs = slurm_jobs_by_rule(workdir)
    assert jobs["first"] == first_jobs["first"] and jobs["ranks"] == first_jobs["ranks"]
    assert len(jobs["boom"]) == 2
    assert (workdir / "first.txt").stat().st_mtime_ns == first_mtime


# ---------------------------------------------------------------------------------------------
# a whole study, test scale

# The study exercised end to end (its test-scale config is small); HPCDL_SLURM_STUDY picks another.
STUDY = os.environ.get("HPCDL_SLURM_STUDY", "checkpoint")
SNAKEFILE = Path(os.environ.get("HPCDL_SLURM_SNAKEFILE", REPO / "Snakefile"))


def study_args(workdir: Path) -> list[str]:
    return ["-s", str(SNAKEFILE), "--directory", str(workdir),
            "--configfile", str(REPO / "configs" / "test.yaml"), "--config", f"studies=[{STUDY}]"]


@pytest.mark.slurm
@pytest.mark.slow
def test_study_workflow_runs_as_slurm_jobs(slurm_cluster, tmp_path):  # noqa: F811
    local_dir, slurm_dir = tmp_path / "local", tmp_path / "slurm"
    on_slurm = snakemake(["--profile", "slurm", *study_args(slurm_dir), *FAST_POLL], timeout_s=600)
    assert on_slurm.returncode == 0, on_slurm.output[-4000:]
    local = snakemake(["--cores", "2", *study_args(local_dir)], timeout_s=600)
    assert local.returncode == 0, local.output[-4000:]

    # every non-local rule ran as its own Slurm job; the study's app among them
    submitted = SUBMITTED.findall(on_slurm.output)
    jobs = slurm_jobs_by_rule(slurm_dir)
    assert f"{STUDY}_run" in jobs, jobs
    assert sorted(j for ids in jobs.values() for j in ids) == sorted(slurm_id for _, slurm_id in submitted)
    # ... and the provenance of its raw tables names that job
    raw_prov = sorted((slurm_dir / "results" / STUDY / "raw").glob("*.provenance.json"))
    assert raw_prov, "no raw table provenance"
    for prov in raw_prov:
        assert json.loads(prov.read_text())["slurm"]["SLURM_JOB_ID"] in jobs[f"{STUDY}_run"]

    # same tables, same shape as the local run
    study_local = local_dir / "results" / STUDY
    local_tables = sorted(p.relative_to(local_dir) for p in study_local.rglob("tables/*.csv"))
    assert local_tables
    for rel in local_tables:
        a, b = pd.read_csv(local_dir / rel), pd.read_csv(slurm_dir / rel)
        assert list(a.columns) == list(b.columns), rel
        assert a.shape == b.shape, rel
    assert (slurm_dir / "results" / STUDY / "claims.json").exists()
