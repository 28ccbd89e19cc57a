"""The local rank launcher: one interpreter imports torch and the target's module, then forks the ranks.
`fork_ranks` is the whole of it; this module's command runs it once, fork_server.py keeps an
interpreter resident and runs it for every launch its parent asks for.

torchrun starts every rank as a fresh interpreter that imports torch again, about 3 s of CPU a
rank on the laptop: 8 ranks on 2 cores spent ~25 s starting for a few seconds of training (the
shuffle study's M=8 points, #28). Forked ranks share the parent's imports, copy-on-write.

Forking is safe here because the parent runs nothing but imports: no torch op has run, so no
intra-op thread pool or CUDA context exists to be broken across fork(). Each child is a rank of
`entry.main`, which sets its threads and forms the process group as under torchrun or srun.

As torchrun does, the first rank to fail ends the others (SIGTERM, then SIGKILL after a grace
period), so no survivor waits in a collective for a dead peer; the launcher exits 1 and names the
rank and its exit status on stderr.

    python -m hpcdl.platform.kit.rank_runtime.forked NPROCS module:function WORKDIR
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time

GRACE_S = 5.0


def describe_exit(code: int) -> str:
    """A process's exit code as words: 'exit code N' or 'signal SIGNAME'."""
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def _stop(children: dict[int, int]) -> None:
    for pid in children:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + GRACE_S
    while children and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            children.pop(pid, None)
        else:
            time.sleep(0.05)
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        children.pop(pid, None)


def prepare(target: str) -> None:
    """Import torch, the rank entry and the target's module, and what that module names in
    RANK_PRELOAD, so the ranks forked next inherit them. Imports only: no torch op runs here."""
    import torch  # noqa: F401  (imported once, here, for every rank)

    from hpcdl.platform.kit.rank_runtime import entry  # noqa: F401

    module = importlib.import_module(target.split(":")[0])
    # What the ranks would import lazily, imported once here instead of once per rank: the target
    # module names it. DistributedDataParallel's and the optimizers' constructors import torch._dynamo
    # (~1 s of CPU), so training targets preload it; a target that builds neither must not pay it
    # (every `import torch` loads torch.nn.parallel.distributed itself, so its presence tells nothing).
    for name in getattr(module, "RANK_PRELOAD", ()):
        importlib.import_module(name)


def _to_file(path: str) -> None:
    """Send this process's stdout and stderr to `path` (a rank of the resident launcher)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for std in (1, 2):
        os.dup2(fd, std)
    os.close(fd)


def fork_ranks(nprocs: int, target: str, workdir: str, env: dict[str, str] | None = None,
               log_to_files: bool = False) -> tuple[int, str]:
    """Fork `nprocs` ranks of `entry.main(target, workdir)` and wait for them: (0, "") when every rank
    exits 0, else (1, which rank failed how) once the others are stopped. `env` replaces each rank's
    environment; `log_to_files` sends rank r's stdout and stderr to WORKDIR/rank-<r>.log."""
    from hpcdl.platform.kit.rank_runtime import entry

    prepare(target)
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    for rank in range(nprocs):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if env is not None:
                    os.environ.clear()
                    os.environ.update(env)
                if log_to_files:
                    _to_file(os.path.join(workdir, f"rank-{rank}.log"))
                os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nprocs),
                                  LOCAL_WORLD_SIZE=str(nprocs), GROUP_RANK="0")
                code = entry.main(target, workdir)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = rank
    while children:
        pid, status = os.wait()
        rank = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            message = (f"[hpcdl] rank {rank} of {target} ended with {describe_exit(code)}; "
                       f"stopping the other {len(children)} rank(s)")
            _stop(children)
            return 1, message
    return 0, ""


def main(nprocs: int, target: str, workdir: str) -> int:
    code, message = fork_ranks(nprocs, target, workdir)
    if message:
        print(message, file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
