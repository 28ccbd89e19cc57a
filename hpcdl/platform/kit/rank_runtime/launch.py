"""Start N real torch.distributed ranks: forked locally from one resident interpreter per calling
process (`fork_server`, `resident`; torchrun with HPCDL_LAUNCHER=torchrun), srun inside a Slurm
allocation.

`run_ranks("pkg.module:function", nprocs, kwargs)` runs `function(**kwargs)` on every
rank after the process group is initialised from the environment, and returns the
per-rank return values (index = rank). Any rank failing, or the whole job running
past `timeout_s`, raises `RankFailure` with the exit status and each rank's stderr tail.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from hpcdl.platform.kit.procenv import PACKAGE_ROOT, child_env
from hpcdl.platform.kit.rank_runtime import resident


class RankFailure(RuntimeError):
    """A multi-rank job failed or timed out; the message carries each rank's stderr tail."""

    def __init__(self, message: str, *, group_formed: bool = True, timed_out: bool = False):
        super().__init__(message)
        self.group_formed = group_formed   # every rank got past init_process_group
        self.timed_out = timed_out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scontrol_job(job_id: str) -> dict[str, str]:
    """`scontrol show job -o <id>` as a dict ({} where scontrol is missing or fails)."""
    if shutil.which("scontrol") is None:
        return {}
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id],
                             capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0:
        return {}
    fields = {}
    for token in out.stdout.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def slurm_allocation_tasks() -> int:
    """Tasks granted to the current allocation or step.

    srun steps set SLURM_NTASKS. Snakemake's Slurm job step strips every SLURM_* variable but the
    job id before running a rule, so there the count comes from `scontrol show job`.
    """
    for var in ("SLURM_NTASKS", "SLURM_NPROCS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    job_id = os.environ.get("SLURM_JOB_ID")
    num = _scontrol_job(job_id).get("NumTasks", "") if job_id else ""
    return int(num) if num.isdigit() else 1


def in_slurm_allocation(nprocs: int) -> bool:
    """True inside an sbatch/salloc allocation that grants at least `nprocs` tasks.

    Inside a job step (SLURM_STEP_ID set: e.g. Snakemake's `srun -n1` wrapper of a plain rule) the
    step already holds the CPUs, so a nested srun would wait forever: the local launcher runs the
    ranks within the step instead. HPCDL_LAUNCHER=fork or torchrun forces a local launcher anywhere.
    """
    if "SLURM_JOB_ID" not in os.environ or shutil.which("srun") is None:
        return False
    if local_launcher(explicit=True):
        return False
    if os.environ.get("SLURM_STEP_ID", "batch") not in ("batch", "extern"):
        return False
    return slurm_allocation_tasks() >= nprocs


LOCAL_LAUNCHERS = ("fork", "torchrun")


def local_launcher(explicit: bool = False) -> str | None:
    """The launcher of ranks outside Slurm: HPCDL_LAUNCHER if it names one of LOCAL_LAUNCHERS, else
    `fork` (ranks forked by this process's resident launcher, rank_runtime.resident: torch imported
    once for every launch); with `explicit`, None unless the variable names one."""
    chosen = os.environ.get("HPCDL_LAUNCHER", "")
    if chosen and chosen not in LOCAL_LAUNCHERS:
        raise ValueError(f"HPCDL_LAUNCHER={chosen!r} is not a launcher; allowed: "
                         f"{', '.join(LOCAL_LAUNCHERS)}")
    return chosen or (None if explicit else "fork")


def slurm_master_addr() -> str:
    """First host of the allocation: the rendezvous address every rank can reach."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist and os.environ.get("SLURM_JOB_ID"):
        nodelist = _scontrol_job(os.environ["SLURM_JOB_ID"]).get("NodeList")
    if nodelist and shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                             capture_output=True, text=True, check=False)
        hosts = out.stdout.split()
        if out.returncode == 0 and hosts:
            return hosts[0]
    return "127.0.0.1"


def build_command(nprocs: int, target: str, workdir: Path, *, slurm: bool,
                  master_addr: str, master_port: int, threads_per_rank: int = 1,
                  local: str = "fork", gpus_per_rank: int = 0) -> list[str]:
    """The exact command line that starts the ranks (unit-tested, printed on failure): srun in a
    Slurm allocation, else the `local` launcher (`fork` or `torchrun`). run_ranks sends a `fork`
    launch to the resident server instead (rank_runtime.resident); the one-shot `forked` command
    given here runs the same fork_ranks, for a launch by hand. `gpus_per_rank` 1: each srun
    task gets its own GPU (--gpus-per-task=1, which binds it: the task sees that GPU alone); torchrun
    and the forked launcher start one process per GPU of this node (--nproc-per-node)."""
    entry = ["-m", "hpcdl.platform.kit.rank_runtime.entry", target, str(workdir)]
    if slurm:
        # One step of exactly nprocs tasks; a rank dying ends the step (no stragglers in collectives).
        # -c only when asked for: the allocation must grant it, and 1 CPU per task is srun's default.
        cpus = [f"--cpus-per-task={threads_per_rank}"] if threads_per_rank > 1 else []
        gpus = [f"--gpus-per-task={gpus_per_rank}"] if gpus_per_rank else []
        return ["srun", f"--ntasks={nprocs}", *cpus, *gpus, "--kill-on-bad-exit=1", "--export=ALL",
                sys.executable, *entry]
    if local == "fork":
        return [sys.executable, "-m", "hpcdl.platform.kit.rank_runtime.forked", str(nprocs), target,
                str(workdir)]
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
            f"--nproc-per-node={nprocs}", f"--master-addr={master_addr}",
            f"--master-port={master_port}", "--max-restarts=0",
            "--monitor-interval=0.5", *entry]


# glibc serves each allocation above its mmap threshold (32 MiB at most) with a fresh mapping that is
# page-faulted in on every touch, and gives freed heap tops back to the kernel: a rank that allocates
# large activations every iteration pays page faults each time (here, a 1-rank 64^3 CosmoFlow step:
# 491 ms -> 220 ms once served from a kept heap). Ranks keep their heap; a caller's own MALLOC_* wins.
RANK_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(16 << 30)}

# A caller that is itself a rank must not hand its identity to the ranks srun starts:
# rank_entry prefers RANK/WORLD_SIZE over SLURM_PROCID/SLURM_NTASKS.
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")


def run_ranks(target: str, nprocs: int, kwargs: dict | None = None, *,
              timeout_s: float = 600.0, threads_per_rank: int = 1, device: str = "cpu",
              gpu_sharing: bool = False, keep_heap: bool = True) -> list:
    """Run `target` ("module:function") on `nprocs` ranks and return their results by rank.

    device: the study's resolved device (hpcdl.platform.kit.device.resolve): each rank computes on it,
    one rank per GPU on CUDA, and its process group's backend follows it (rank_runtime.placement).
    Locally, more ranks than visible GPUs is a LayoutError before any rank starts, unless
    `gpu_sharing` (the study block's key) lets ranks share GPUs over gloo.

    keep_heap: ranks run with RANK_MALLOC_ENV; False keeps glibc's defaults, for studies that
    measure memory and compare it with work run outside ranks.

    A launch whose ranks never formed a process group (a rendezvous port taken in the instant
    between choosing it and binding it, a peer refused at connect) is retried once on a new port:
    the target has not run on any rank, so the retry repeats no work and hides no failure of it.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    if ":" not in target:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be a resolved device, cpu or cuda; got {device!r}")
    slurm = in_slurm_allocation(nprocs)
    if device == "cuda" and not slurm:
        from hpcdl.platform.kit.device import check_layout, visible_gpus

        check_layout(device, nprocs, visible_gpus(), gpu_sharing, f"{target} on {nprocs} local ranks")
    root = Path(tempfile.mkdtemp(prefix="hpcdl-ranks-", dir=_exchange_root(slurm)))
    try:
        payload = pickle.dumps(kwargs or {})
        for attempt in (1, 2):
            workdir = root / f"attempt-{attempt}"
            workdir.mkdir()
            (workdir / "kwargs.pkl").write_bytes(payload)
            try:
                return _launch(target, nprocs, workdir, slurm=slurm, timeout_s=timeout_s,
                               threads_per_rank=threads_per_rank, device=device,
                               gpu_sharing=gpu_sharing, keep_heap=keep_heap)
            except RankFailure as exc:
                if attempt == 2 or exc.group_formed or exc.timed_out:
                    raise
                print(f"[hpcdl] ranks of {target} failed before forming a process group; "
                      f"retrying once on a new port:\n{exc}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if slurm and not os.environ.get("HPCDL_RANK_TMPDIR"):
            try:  # the default exchange root is ours to tidy once no other launch uses it
                root.parent.rmdir()
            except OSError:
                pass


def _launch(target: str, nprocs: int, workdir: Path, *, slurm: bool, timeout_s: float,
            threads_per_rank: int, device: str, gpu_sharing: bool, keep_heap: bool) -> list:
    master_addr = slurm_master_addr() if slurm else "127.0.0.1"
    port = free_port()
    env = child_env(PACKAGE_ROOT, base={**(RANK_MALLOC_ENV if keep_heap else {}), **os.environ})
    threads = str(max(1, int(threads_per_rank)))
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
               HPCDL_THREADS_PER_RANK=threads, MASTER_ADDR=master_addr,
               MASTER_PORT=str(port), HPCDL_RANK_TIMEOUT_S=str(timeout_s))
    env.update(HPCDL_DEVICE=device, HPCDL_GPU_SHARING="1" if gpu_sharing else "0")
    # srun binds one GPU to each task (--gpus-per-task=1); shared GPUs need the node's whole set
    gpus_per_rank = 1 if device == "cuda" and slurm and not gpu_sharing else 0
    env["HPCDL_GPU_PER_RANK_BOUND"] = "1" if gpus_per_rank else "0"
    if slurm:
        for var in _RANK_VARS:
            env.pop(var, None)
    # torchrun's own logging is noise unless something fails.
    env.setdefault("TORCHELASTIC_ERROR_FILE", str(workdir / "error.json"))
    launcher = "srun" if slurm else local_launcher()

    def formed() -> bool:
        return all((workdir / f"joined-{r}").exists() for r in range(nprocs))

    if launcher == "fork":  # the resident launcher: torch imported once per calling process
        try:
            code, message = resident.launch(nprocs, target, str(workdir), env, timeout_s)
        except resident.LaunchTimeout:
            raise RankFailure(f"{target} on {nprocs} ranks timed out after {timeout_s:.0f} s\n"
                              f"{_tails(workdir, nprocs, '')}", group_formed=formed(),
                              timed_out=True) from None
        if code != 0:
            raise RankFailure(f"{target} on {nprocs} ranks failed (exit {code}) via fork (resident "
                              f"launcher)\n{_tails(workdir, nprocs, message)}", group_formed=formed())
        return _results(target, nprocs, workdir, "")
    cmd = build_command(nprocs, target, workdir, slurm=slurm, master_addr=master_addr,
                        master_port=port, threads_per_rank=int(threads), local=launcher,
                        gpus_per_rank=gpus_per_rank)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        out, err = _stop(proc)
        raise RankFailure(
            f"{target} on {nprocs} ranks timed out after {timeout_s:.0f} s\n"
            f"{_tails(workdir, nprocs, err)}", group_formed=formed(), timed_out=True) from None
    if proc.returncode != 0:
        raise RankFailure(
            f"{target} on {nprocs} ranks failed (exit {proc.returncode}) "
            f"via {launcher}\n{_tails(workdir, nprocs, err)}",
            group_formed=formed())
    return _results(target, nprocs, workdir, err)


def _results(target: str, nprocs: int, workdir: Path, launcher_err: str) -> list:
    results = []
    for r in range(nprocs):
        path = workdir / f"result-{r}.pkl"
        if not path.exists():
            raise RankFailure(f"rank {r} of {target} exited 0 but wrote no result\n"
                              f"{_tails(workdir, nprocs, launcher_err)}", group_formed=True)
        results.append(pickle.loads(path.read_bytes()))
    return results


def _exchange_root(slurm: bool) -> str | None:
    """Where ranks exchange kwargs/results. Under srun ranks may sit on other nodes, so node-local
    /tmp will not do: use HPCDL_RANK_TMPDIR, else the (shared) working directory."""
    root = os.environ.get("HPCDL_RANK_TMPDIR")
    if not root and slurm:
        root = str(Path.cwd() / ".hpcdl-ranks")
    if root:
        Path(root).mkdir(parents=True, exist_ok=True)
    return root


def _stop(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGTERM first (srun forwards it and cancels the step cleanly), SIGKILL if that is ignored."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return proc.communicate()


def _tails(workdir: Path, nprocs: int, launcher_err: str, n: int = 1500) -> str:
    """Each failed rank's traceback (error-<r>.txt); without any, what the launcher said and, from
    the resident launcher, each rank's own output (rank-<r>.log)."""
    parts = []
    for r in range(nprocs):
        f = workdir / f"error-{r}.txt"
        if f.exists():
            parts.append(f"[rank {r}] {f.read_text()[-n:]}")
    if not parts:
        parts.append(f"[launcher stderr] {launcher_err[-n:]}")
        for r in range(nprocs):
            log = workdir / f"rank-{r}.log"
            if log.exists() and log.stat().st_size:
                parts.append(f"[rank {r} output] {log.read_text(errors='replace')[-n:]}")
    return "\n".join(parts)
