"""Rank launcher: exact fork/torchrun/srun command lines, Slurm allocation detection, real ranks."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
import sys
import uuid
from pathlib import Path

import pytest

from hpcdl.platform.kit.rank_runtime import launch
from hpcdl.platform.kit.rank_runtime.launch import RankFailure, build_command, run_ranks

_os_free_port = launch.free_port

SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_JOB_NODELIST",
              "SLURM_NODELIST", "HPCDL_LAUNCHER", "HPCDL_RANK_TMPDIR")


@pytest.fixture
def clean_env(monkeypatch):
    for var in SLURM_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def fake_tools(tmp_path: Path, monkeypatch, scontrol_job: str = "", hostnames: str = "node1\nnode2\n"):
    """Put stub srun/scontrol first on PATH; scontrol answers `show job` and `show hostnames`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\n"
        f'if [ "$2" = job ]; then printf "%s\\n" "{scontrol_job}"; exit 0; fi\n'
        f'if [ "$2" = hostnames ]; then printf "{hostnames}"; exit 0; fi\n'
        "exit 1\n")
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def in_slurm_job(tmp_path: Path, monkeypatch, scontrol_job: str = "", **env: str) -> None:
    """Inside Slurm job 42, fake_tools' srun and scontrol on PATH, the variables in `env` set too."""
    fake_tools(tmp_path, monkeypatch, scontrol_job)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_fork_command_exact(tmp_path):
    cmd = build_command(3, "pkg.mod:fn", tmp_path, slurm=False, master_addr="127.0.0.1", master_port=29511)
    assert cmd == [sys.executable, "-m", "hpcdl.platform.kit.rank_runtime.forked", "3", "pkg.mod:fn",
                   str(tmp_path)]


def test_torchrun_command_exact(tmp_path):
    cmd = build_command(3, "pkg.mod:fn", tmp_path, slurm=False, master_addr="127.0.0.1", master_port=29511,
                        local="torchrun")
    assert cmd == [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=3",
                   "--master-addr=127.0.0.1", "--master-port=29511", "--max-restarts=0",
                   "--monitor-interval=0.5", "-m", "hpcdl.platform.kit.rank_runtime.entry", "pkg.mod:fn",
                   str(tmp_path)]


def test_srun_command_exact(tmp_path):
    cmd = build_command(2, "pkg.mod:fn", tmp_path, slurm=True, master_addr="node1", master_port=1)
    assert cmd == ["srun", "--ntasks=2", "--kill-on-bad-exit=1", "--export=ALL", sys.executable,
                   "-m", "hpcdl.platform.kit.rank_runtime.entry", "pkg.mod:fn", str(tmp_path)]


def test_srun_asks_for_cpus_only_when_ranks_are_threaded(tmp_path):
    cmd = build_command(4, "m:f", tmp_path, slurm=True, master_addr="n", master_port=1, threads_per_rank=3)
    assert cmd[:3] == ["srun", "--ntasks=4", "--cpus-per-task=3"]


def test_outside_slurm_forks_the_ranks_unless_told_otherwise(clean_env):
    assert not launch.in_slurm_allocation(1)
    assert launch.local_launcher() == "fork"
    clean_env.setenv("HPCDL_LAUNCHER", "torchrun")
    assert launch.local_launcher() == "torchrun"
    clean_env.setenv("HPCDL_LAUNCHER", "mpirun")
    with pytest.raises(ValueError, match="HPCDL_LAUNCHER='mpirun' is not a launcher; allowed: fork, torch"):
        launch.local_launcher()


@pytest.mark.parametrize("launcher", ["fork", "torchrun"])
def test_both_local_launchers_run_real_ranks(launcher, clean_env):
    clean_env.setenv("HPCDL_LAUNCHER", launcher)
    results = run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", 3, {"value": 1.0},
                        timeout_s=120)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["world_size"] == 3 and r["sum"] == pytest.approx(6.0) for r in results)


def test_slurm_ntasks_from_environment(tmp_path, clean_env):
    in_slurm_job(tmp_path, clean_env, SLURM_NTASKS="4")
    assert launch.in_slurm_allocation(4)
    assert not launch.in_slurm_allocation(5)


def test_slurm_ntasks_from_scontrol_when_env_is_stripped(tmp_path, clean_env):
    # Snakemake's Slurm job step keeps only SLURM_JOB_ID; the task count comes from scontrol.
    in_slurm_job(tmp_path, clean_env, scontrol_job="JobId=42 JobName=x NumNodes=1 NumCPUs=2 NumTasks=2 "
                                                   "NodeList=node[1-2] BatchHost=node1")
    assert launch.slurm_allocation_tasks() == 2
    assert launch.in_slurm_allocation(2)
    assert launch.slurm_master_addr() == "node1"


def test_one_task_step_falls_back_to_torchrun(tmp_path, clean_env):
    # A plain (non-mpi) rule runs inside `srun -n1`: the ranks then share that one step via torchrun.
    in_slurm_job(tmp_path, clean_env, SLURM_NTASKS="1")
    assert not launch.in_slurm_allocation(2)


def test_inside_a_step_never_nests_srun(tmp_path, clean_env):
    # A nested srun inside a step waits for CPUs the step itself holds: it would hang.
    in_slurm_job(tmp_path, clean_env, SLURM_NTASKS="4", SLURM_STEP_ID="0")
    assert not launch.in_slurm_allocation(1)
    clean_env.setenv("SLURM_STEP_ID", "batch")
    assert launch.in_slurm_allocation(4)


def test_forced_torchrun(tmp_path, clean_env):
    in_slurm_job(tmp_path, clean_env, SLURM_NTASKS="8", HPCDL_LAUNCHER="torchrun")
    assert not launch.in_slurm_allocation(2)


def test_no_srun_means_no_slurm_launch(tmp_path, clean_env):
    clean_env.setenv("SLURM_JOB_ID", "42")
    clean_env.setenv("SLURM_NTASKS", "8")
    clean_env.setenv("PATH", str(tmp_path))
    assert not launch.in_slurm_allocation(2)


def test_scontrol_failure_counts_one_task(tmp_path, clean_env):
    in_slurm_job(tmp_path, clean_env, scontrol_job="")
    assert launch.slurm_allocation_tasks() == 1


def test_master_addr_without_nodelist_is_loopback(clean_env):
    assert launch.slurm_master_addr() == "127.0.0.1"


def test_exchange_dir_is_shared_under_slurm(tmp_path, clean_env):
    clean_env.chdir(tmp_path)
    assert launch._exchange_root(slurm=False) is None
    assert launch._exchange_root(slurm=True) == str(tmp_path / ".hpcdl-ranks")
    clean_env.setenv("HPCDL_RANK_TMPDIR", str(tmp_path / "x"))
    assert launch._exchange_root(slurm=False) == str(tmp_path / "x")


def test_two_ranks_allreduce_locally(clean_env):
    results = run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", 2, {"value": 1.5},
                        timeout_s=120)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 for r in results)
    assert all(r["sum"] == pytest.approx(1.5 * (1 + 2)) for r in results)


def test_ranks_keep_their_heap_unless_the_caller_chose_malloc_settings(clean_env):
    names = sorted(launch.RANK_MALLOC_ENV)
    clean_env.delenv("MALLOC_MMAP_MAX_", raising=False)
    clean_env.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    seen = run_ranks("rank_probes:environment", 2, {"names": names}, timeout_s=120)
    assert seen == [{"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "131072"}] * 2
    seen = run_ranks("rank_probes:environment", 1, {"names": names}, timeout_s=120, keep_heap=False)
    assert seen == [{"MALLOC_MMAP_MAX_": None, "MALLOC_TRIM_THRESHOLD_": "131072"}]


def test_rank_raising_gives_its_traceback(clean_env, capsys):
    with pytest.raises(RankFailure, match=r"on 2 ranks failed \(exit 1\)") as info:
        run_ranks("rank_probes:raise_on_rank", 2, {"victim": 1}, timeout_s=120)
    assert info.value.group_formed and not info.value.timed_out  # failed in the target: never retried
    assert re.search(r"\[rank 1\] Traceback \(most recent call last\):.*in raise_on_rank\n.*"
                     r"RuntimeError: rank 1 gives up", str(info.value), re.S), str(info.value)
    assert "retrying" not in capsys.readouterr().err


def test_rank_dying_is_a_failure_naming_it_not_a_timeout(clean_env, capsys):
    with pytest.raises(RankFailure, match=r"on 2 ranks failed \(exit 1\)") as info:
        run_ranks("rank_probes:die_on_rank", 2, {"victim": 1}, timeout_s=120)
    assert info.value.group_formed and not info.value.timed_out
    msg = str(info.value)
    # os._exit leaves no traceback: the launcher's report names rank 1 and its status, unless the
    # survivor's traceback (its all_reduce lost the peer) was written first
    died = re.search(r"rank 1 of rank_probes:die_on_rank ended with exit code 3\b", msg)
    assert died or re.search(r"\[rank 0\] Traceback.*all_reduce", msg, re.S), msg
    assert "retrying" not in capsys.readouterr().err


@contextlib.contextmanager
def _held_port():
    """A loopback port some other process is listening on, for as long as the block runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        yield squatter.getsockname()[1]


def test_taken_rendezvous_port_is_retried_on_a_new_port(clean_env, capsys):
    """The port race free_port() leaves open, made certain: the first port handed out is held."""
    with _held_port() as taken:
        ports = iter([taken])
        clean_env.setattr(launch, "free_port", lambda: next(ports, None) or _os_free_port())
        results = run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", 2, {"value": 2.0},
                            timeout_s=120)
    assert [r["sum"] for r in results] == [pytest.approx(6.0)] * 2
    err = capsys.readouterr().err
    assert "failed before forming a process group; retrying once on a new port" in err


def test_port_taken_on_both_attempts_fails_with_the_launcher_error(clean_env, capsys):
    with _held_port() as taken:
        clean_env.setattr(launch, "free_port", lambda: taken)
        with pytest.raises(RankFailure, match="failed \\(exit 1\\) via fork") as info:
            run_ranks("hpcdl.platform.kit.rank_runtime.probes:allreduce_sum", 2, {"value": 2.0},
                      timeout_s=120)
    assert not info.value.group_formed
    assert capsys.readouterr().err.count("retrying once") == 1


@pytest.mark.parametrize("target, nprocs, msg", [("no_colon", 2, "module:function"),
                                                 ("m:f", 0, "nprocs must be >= 1")])
def test_bad_arguments(target, nprocs, msg):
    with pytest.raises(ValueError, match=msg):
        run_ranks(target, nprocs)


def test_forked_ranks_find_what_their_target_module_preloads_and_nothing_more(clean_env):
    """The launcher imports a target module's RANK_PRELOAD before forking; torch._dynamo (about 1 s
    of CPU a launch) only for targets that name it: every `import torch` loads DDP's module now."""
    clean_env.setenv("HPCDL_TEST_FRESH_SERVER", str(uuid.uuid4()))  # no server a training target used
    names = ["xml.dom.minidom", "torch._dynamo"]
    seen = run_ranks("rank_probes:modules_loaded", 2, {"names": names}, timeout_s=120)
    assert seen == [{"xml.dom.minidom": True, "torch._dynamo": False}] * 2
    from hpcdl.studies.shuffle import train as shuffle_train
    from hpcdl.studies.spatial import train as spatial_train
    assert "torch._dynamo" in shuffle_train.RANK_PRELOAD and "torch._dynamo" in spatial_train.RANK_PRELOAD


def test_the_resident_launcher_serves_every_launch_of_a_process_from_one_interpreter(clean_env):
    """Ranks are forked by one server per calling process and start environment: the second launch
    finds the first one's server; a launch that fails leaves it serving; another environment (what a
    process reads once at start) gets a server of its own."""
    from hpcdl.platform.kit.rank_runtime import resident

    clean_env.setenv("HPCDL_TEST_FRESH_SERVER", str(uuid.uuid4()))
    first = run_ranks("os:getppid", 2, {}, timeout_s=120)
    assert len(set(first)) == 1 and first[0] in resident.server_pids()
    with pytest.raises(RankFailure, match="via fork \\(resident launcher\\)"):
        run_ranks("rank_probes:raise_on_rank", 2, {"victim": 0}, timeout_s=120)
    assert run_ranks("os:getppid", 1, {}, timeout_s=120) == first[:1]  # the same server, still up
    clean_env.setenv("HPCDL_TEST_FRESH_SERVER", str(uuid.uuid4()))
    other = run_ranks("os:getppid", 1, {}, timeout_s=120)
    assert other != first[:1] and set(resident.server_pids()) >= {first[0], other[0]}


def test_a_launch_past_its_timeout_kills_the_server_and_the_next_launch_starts_another(clean_env):
    from hpcdl.platform.kit.rank_runtime import resident

    clean_env.setenv("HPCDL_TEST_FRESH_SERVER", str(uuid.uuid4()))
    server = run_ranks("os:getppid", 1, {}, timeout_s=120)[0]
    with pytest.raises(RankFailure, match="timed out after 3 s") as info:
        run_ranks("rank_probes:sleep_for", 2, {"seconds": 60}, timeout_s=3)
    assert info.value.timed_out
    with pytest.raises(ProcessLookupError):  # the server and its sleeping ranks are gone
        os.kill(server, 0)
    assert server not in resident.server_pids()
    assert run_ranks("os:getppid", 1, {}, timeout_s=120)[0] != server
