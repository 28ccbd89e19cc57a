"""Start N real torch.distributed ranks: torchrun locally, srun inside a Slurm allocation.

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


class RankFailure(RuntimeError):
    """A multi-rank job failed or timed out; the message carries each rank's stderr tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_slurm_allocation(nprocs: int) -> bool:
    """True inside an sbatch/salloc allocation that grants at least `nprocs` tasks."""
    if "SLURM_JOB_ID" not in os.environ or shutil.which("srun") is None:
        return False
    if os.environ.get("HPCDL_LAUNCHER", "") == "torchrun":
        return False
    ntasks = int(os.environ.get("SLURM_NTASKS", os.environ.get("SLURM_NPROCS", "1")))
    return ntasks >= nprocs


def slurm_master_addr() -> str:
    """First host of the allocation: the rendezvous address every rank can reach."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if nodelist and shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                             capture_output=True, text=True, check=False)
        hosts = out.stdout.split()
        if out.returncode == 0 and hosts:
            return hosts[0]
    return "127.0.0.1"


def build_command(nprocs: int, target: str, workdir: Path, *, slurm: bool,
                  master_addr: str, master_port: int) -> list[str]:
    """The exact command line that starts the ranks (unit-tested, printed on failure)."""
    entry = ["-m", "hpcdl.runtime.rank_entry", target, str(workdir)]
    if slurm:
        return ["srun", f"--ntasks={nprocs}", "--kill-on-bad-exit=1", "--export=ALL",
                sys.executable, *entry]
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
            f"--nproc-per-node={nprocs}", f"--master-addr={master_addr}",
            f"--master-port={master_port}", "--max-restarts=0",
            "--monitor-interval=0.5", *entry]


def run_ranks(target: str, nprocs: int, kwargs: dict | None = None, *,
              timeout_s: float = 600.0, threads_per_rank: int = 1,
              backend: str | None = None) -> list:
    """Run `target` ("module:function") on `nprocs` ranks and return their results by rank."""
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    if ":" not in target:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    slurm = in_slurm_allocation(nprocs)
    workdir = Path(tempfile.mkdtemp(prefix="hpcdl-ranks-"))
    try:
        (workdir / "kwargs.pkl").write_bytes(pickle.dumps(kwargs or {}))
        master_addr = slurm_master_addr() if slurm else "127.0.0.1"
        port = free_port()
        env = dict(os.environ)
        threads = str(max(1, int(threads_per_rank)))
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
                   HPCDL_THREADS_PER_RANK=threads, MASTER_ADDR=master_addr,
                   MASTER_PORT=str(port), HPCDL_RANK_TIMEOUT_S=str(timeout_s))
        if backend:
            env["HPCDL_DIST_BACKEND"] = backend
        # torchrun's own logging is noise unless something fails.
        env.setdefault("TORCHELASTIC_ERROR_FILE", str(workdir / "error.json"))
        cmd = build_command(nprocs, target, workdir, slurm=slurm,
                            master_addr=master_addr, master_port=port)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise RankFailure(
                f"{target} on {nprocs} ranks timed out after {timeout_s:.0f} s\n"
                f"{_tails(workdir, nprocs, err)}") from None
        if proc.returncode != 0:
            raise RankFailure(
                f"{target} on {nprocs} ranks failed (exit {proc.returncode}) "
                f"via {'srun' if slurm else 'torchrun'}\n{_tails(workdir, nprocs, err)}")
        results = []
        for r in range(nprocs):
            path = workdir / f"result-{r}.pkl"
            if not path.exists():
                raise RankFailure(f"rank {r} of {target} exited 0 but wrote no result\n"
                                  f"{_tails(workdir, nprocs, err)}")
            results.append(pickle.loads(path.read_bytes()))
        return results
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _tails(workdir: Path, nprocs: int, launcher_err: str, n: int = 1500) -> str:
    parts = []
    for r in range(nprocs):
        f = workdir / f"error-{r}.txt"
        if f.exists():
            parts.append(f"[rank {r}] {f.read_text()[-n:]}")
    if not parts:
        parts.append(f"[launcher stderr] {launcher_err[-n:]}")
    return "\n".join(parts)
