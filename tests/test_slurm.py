"""The cluster path against a real Slurm on this machine (.ci/slurm.sh, fixtures in tests/slurm_cluster.py).

- a whole study's test-scale workflow under `snakemake --profile slurm`: every rule a Slurm job,
  tables shaped like a local run's;
- a 2-rank rule (resources tasks=2, mpi="srun") whose ranks come from srun (SLURM_PROCID), and one
  inside a plain rule's 1-task step, where the ranks start locally (forked) instead of a hanging srun;
- a failing rule: non-zero exit with the failure in the log; the rerun resumes without redoing
  finished rules;
- sbatch missing: a clear error before any rule runs (no cluster needed for that one);
- across nodes (the partition of two slurmd, each in its own network namespace): ranks on both nodes
  with rank, local rank and MASTER_ADDR from Slurm, and a spatial run (halos) and a shuffle run
  (partial exchange) there that give the one-node run's numbers exactly.
Snakemake always runs under `timeout -k` so a stuck status loop cannot hang the suite.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from slurm_cluster import slurm_cluster, slurm_two_nodes, unavailable  # noqa: F401  (session fixtures)

from hpcdl.platform.kit.procenv import pythonpath
from hpcdl.platform.orchestration.slurm import (
    SLURM_CLIENTS,
    SlurmUnavailable,
    require_slurm,
    require_slurm_for,
)

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
    env["PYTHONPATH"] = pythonpath(REPO, base=env.get("PYTHONPATH", ""))
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


def _ranks_record(tiny_failed_run, rule: str, launcher: str) -> dict:
    """What `rule` recorded in <rule>.json: ranks 0 and 1, started by `launcher` inside the rule's one
    Slurm job."""
    workdir, proc = tiny_failed_run
    path = workdir / f"{rule}.json"
    assert path.exists(), proc.output[-4000:]
    record = json.loads(path.read_text())
    assert record["launcher"] == launcher
    assert [r["rank"] for r in record["ranks"]] == [0, 1]
    assert slurm_jobs_by_rule(workdir)[rule] == [record["job_id"]]
    return record


@pytest.mark.slurm
@pytest.mark.slow
def test_two_rank_rule_gets_ranks_from_srun(tiny_failed_run):
    record = _ranks_record(tiny_failed_run, "ranks", "srun")
    ranks = record["ranks"]
    # rank identity came from srun, inside the rule's own Slurm job
    assert [r["slurm_procid"] for r in ranks] == ["0", "1"]
    assert all(r["world_size"] == 2 and r["sum"] == pytest.approx(3.0) for r in ranks)
    assert {r["slurm_job_id"] for r in ranks} == {record["job_id"]}


@pytest.mark.slurm
@pytest.mark.slow
def test_ranks_inside_a_one_task_step_use_the_local_launcher(tiny_failed_run):
    record = _ranks_record(tiny_failed_run, "ranks_in_step", "fork")
    assert all(r["sum"] == pytest.approx(3.0) for r in record["ranks"])


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
def test_study_workflow_runs_as_slurm_jobs(slurm_cluster, test_scale_workflow, tmp_path):  # noqa: F811
    slurm_dir = tmp_path / "slurm"
    on_slurm = snakemake(["--profile", "slurm", *study_args(slurm_dir), *FAST_POLL], timeout_s=600)
    assert on_slurm.returncode == 0, on_slurm.output[-4000:]
    # The local run to compare with: the suite's shared test-scale run (tests/workflow_run.py), of the
    # same configs/test.yaml, so the same study block (a study's tables depend on its block only).
    # A custom HPCDL_SLURM_SNAKEFILE, or a failed shared run (tests/test_workflow.py says why), gets
    # a local run of its own.
    shared = test_scale_workflow
    if SNAKEFILE == REPO / "Snakefile" and STUDY in shared.studies and shared.run.returncode == 0:
        local_dir = shared.workdir
    else:
        local_dir = tmp_path / "local"
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


# ---------------------------------------------------------------------------------------------
# across nodes: two slurmd, each in its own network namespace (address, hostname, /etc/hosts)

SLURM_TESTS = REPO / "tests" / "slurm"
RUN_RANKS_JOB = SLURM_TESTS / "run_ranks_job.py"
SPATIAL_MODEL = {"channels": [3, 4], "dense": [8]}
SHUFFLE_TRAIN = dict(epochs=3, batch_size=40, lr=0.1, momentum=0.9,
                     model={"kind": "mlp_bn", "width": 8, "depth": 1})


def run_across_nodes(two_nodes, workdir: Path, target: str, nprocs: int, kwargs: dict,
                     sbatch_layout: list[str], timeout_s: int = 240) -> dict:
    """`target` on `nprocs` ranks started by run_ranks inside an sbatch job of the two-node partition;
    returns tests/slurm/run_ranks_job.py's record (launcher, nodelist, each rank's result and node)."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec, out, log = workdir / "spec.pkl", workdir / "ranks.pkl", workdir / "job.log"
    spec.write_bytes(pickle.dumps({"target": target, "nprocs": nprocs, "kwargs": kwargs,
                                   "timeout_s": timeout_s - 30}))
    env = job_env()
    env["PYTHONPATH"] = pythonpath(SLURM_TESTS, base=env["PYTHONPATH"])   # node_ranks
    env.pop("HPCDL_LAUNCHER", None)   # the job's ranks must come from srun
    cmd = ["sbatch", "--parsable", "-J", f"hpcdl-{workdir.name}", "-p", two_nodes.partition,
           "-N", str(len(two_nodes.nodes)), *sbatch_layout, "--time=10", f"--chdir={workdir}",
           f"--output={log}", f"--wrap={sys.executable} {RUN_RANKS_JOB} {spec} {out}"]
    submit = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=60)
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip().split(";")[0]
    state, exit_code = wait_for_job(job_id, timeout_s)
    log_text = log.read_text(errors="replace")[-4000:] if log.exists() else "(no job log)"
    assert (state, exit_code) == ("COMPLETED", "0:0"), f"job {job_id}: {state} {exit_code}\n{log_text}"
    record = pickle.loads(out.read_bytes())
    assert record["launcher"] == "srun", record
    return record


def wait_for_job(job_id: str, timeout_s: float) -> tuple[str, str]:
    """(final JobState, ExitCode) of a batch job, polled every 0.5 s: `sbatch --wait` sleeps 2, 8, then
    32 s between its polls, so a 12 s job would take 42 s. Cancels the job past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        show = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                              check=False, timeout=30)
        fields = dict(tok.partition("=")[::2] for tok in show.stdout.split())
        if fields.get("JobState") not in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return fields["JobState"], fields.get("ExitCode", "")
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], check=False, timeout=30)
            pytest.fail(f"job {job_id} still {fields.get('JobState')} after {timeout_s} s: cancelled")
        time.sleep(0.5)


def deterministic(value):
    """`value` without what differs between runs of the same computation: timings (*_s) and memory (*_mb)."""
    if isinstance(value, dict):
        return {k: deterministic(v) for k, v in value.items() if not k.endswith(("_s", "_mb"))}
    if isinstance(value, list | tuple):
        return [deterministic(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def assert_spans_both_nodes(record: dict, two_nodes, ranks_per_node: list[int]) -> list[dict]:
    """Every rank on the node Slurm gave it, its hostname resolving to that node's own address (where
    gloo binds), ranks in block order; returns each rank's placement."""
    where = [r["where"] for r in record["ranks"]]
    nodes = [n for n, count in zip(two_nodes.nodes, ranks_per_node, strict=True) for _ in range(count)]
    assert [w["rank"] for w in where] == list(range(len(nodes)))
    assert [w["slurm_procid"] for w in where] == [str(r) for r in range(len(nodes))]   # rank from srun
    assert [w["host"] for w in where] == nodes
    assert [w["slurmd_nodename"] for w in where] == nodes
    assert [w["address"] for w in where] == [two_nodes.addresses[n] for n in nodes]
    # MASTER_ADDR: the allocation's first host, reached from both nodes
    assert record["master_addr"] == two_nodes.nodes[0]
    assert {w["master_addr"] for w in where} == {two_nodes.nodes[0]}
    # local ranks from SLURM_LOCALID, counted per node
    expected_local = [i for count in ranks_per_node for i in range(count)]
    assert [w["local_rank"] for w in where] == expected_local
    assert [w["slurm_localid"] for w in where] == [str(i) for i in expected_local]
    assert [w["ranks_on_node"] for w in where] == [c for c in ranks_per_node for _ in range(c)]
    return where


@pytest.mark.slurm
def test_ranks_probe_spans_two_nodes(slurm_two_nodes, tmp_path):  # noqa: F811
    record = run_across_nodes(slurm_two_nodes, tmp_path / "probe",
                              "hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", 4, {"value": 1.0},
                              ["--ntasks-per-node=2"])
    assert_spans_both_nodes(record, slurm_two_nodes, [2, 2])
    results = [r["result"] for r in record["ranks"]]
    assert all(r["world_size"] == 4 and r["sum"] == pytest.approx(1 + 2 + 3 + 4) for r in results)
    assert {r["slurm_job_id"] for r in results} == {record["job_id"]}


@pytest.mark.slurm
def test_spatial_run_across_two_nodes_equals_the_one_node_run(slurm_two_nodes, tmp_path,  # noqa: F811
                                                              monkeypatch):
    from hpcdl.platform.kit.rank_runtime.launch import run_ranks
    from hpcdl.studies.spatial.data import ensure_dataset

    data = ensure_dataset(tmp_path / "data", (16, 12, 8), 8, 0, (0.5, 2.0), (-3.0, -1.0))
    # one rank per node, the depth split in two: every halo and every all-reduce crosses the bridge
    kw = dict(data_dir=str(data), n_data=1, grid=(2, 1), model=SPATIAL_MODEL, batch_size=4, iterations=3,
              lr=1e-2, seed=0, dtype="float64")
    record = run_across_nodes(slurm_two_nodes, tmp_path / "spatial", "hpcdl.studies.spatial.train:train_run",
                              2, kw, ["--ntasks-per-node=1"])
    assert_spans_both_nodes(record, slurm_two_nodes, [1, 1])
    across = [r["result"] for r in record["ranks"]]
    monkeypatch.setenv("HPCDL_LAUNCHER", "fork")   # the same ranks on this one machine, forked
    one_node = run_ranks("hpcdl.studies.spatial.train:train_run", 2, kw, timeout_s=240)
    assert [r["slab_depth"] for r in across] == [8, 8]
    for rank in across:
        assert all(rec["halo_s"] > 0 and rec["allreduce_s"] > 0 for rec in rank["records"])
    # losses, slabs, parameter counts: the same to the last bit
    assert deterministic(across) == deterministic(one_node)


@pytest.mark.slurm
def test_shuffle_partial_exchange_across_two_nodes_equals_the_one_node_run(slurm_two_nodes,  # noqa: F811
                                                                           tmp_path, monkeypatch):
    from hpcdl.platform.kit.rank_runtime.launch import run_ranks
    from hpcdl.studies.shuffle import data as shuffle_data

    data = shuffle_data.prepare("/usr/share/datasets/fashion-mnist", tmp_path / "cache", n_train=301,
                                n_val=60, seed=0)
    kw = dict(data=data, strategy="partial", q=0.3, partitioning="skewed", alpha=0.2,
              runs=[{"seed": 5, "kakurenbo_fraction": 0.0, "round": 0, "slot": 0}], return_ids=True,
              **SHUFFLE_TRAIN)
    second = slurm_two_nodes.nodes[1]
    sent_before = slurm_two_nodes.link_bytes(second, "tx")
    # three ranks on two nodes (2 + 1): samples go both within a node and across
    record = run_across_nodes(slurm_two_nodes, tmp_path / "shuffle", "hpcdl.studies.shuffle.train:train_rank",
                              3, kw, ["--ntasks=3"])
    sent_by_second = slurm_two_nodes.link_bytes(second, "tx") - sent_before
    assert_spans_both_nodes(record, slurm_two_nodes, [2, 1])
    across = [r["result"] for r in record["ranks"]]
    monkeypatch.setenv("HPCDL_LAUNCHER", "fork")   # the same ranks on this one machine, forked
    one_node = run_ranks("hpcdl.studies.shuffle.train:train_rank", 3, kw, timeout_s=240)
    for epoch in range(SHUFFLE_TRAIN["epochs"]):
        assert across[2]["records"][epoch]["bytes_sent"] > 0
    # the samples rank 2 sent left its node over its own link (with the gradients and Slurm's traffic)
    assert sent_by_second >= sum(rec["bytes_sent"] for rec in across[2]["records"])
    # the same samples on every rank, the same losses, accuracies and bytes exchanged, exactly
    for a, b in zip(across, one_node, strict=True):
        assert np.array_equal(a["ids"], b["ids"])
    assert deterministic(across) == deterministic(one_node)
