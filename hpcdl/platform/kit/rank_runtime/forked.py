"""The local rank launcher: one interpreter imports torch and the target's module, then forks the ranks.

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


def _status(code: int) -> str:
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


def main(nprocs: int, target: str, workdir: str) -> int:
    import torch  # noqa: F401  (imported once, here, for every rank)

    from hpcdl.platform.kit.rank_runtime import entry

    module = importlib.import_module(target.split(":")[0])
    # What the ranks would import lazily, imported once here instead of once per rank: the target
    # module names it. DistributedDataParallel's constructor imports torch._dynamo (~1-2 s of CPU),
    # so the shuffle study's ranks preload it; a target that builds no DDP must not pay it (every
    # `import torch` loads torch.nn.parallel.distributed itself, so its presence tells nothing).
    for name in getattr(module, "RANK_PRELOAD", ()):
        importlib.import_module(name)
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    for rank in range(nprocs):
        pid = os.fork()
        if pid == 0:
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nprocs),
                              LOCAL_WORLD_SIZE=str(nprocs), GROUP_RANK="0")
            code = 1
            try:
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
            print(f"[hpcdl] rank {rank} of {target} ended with {_status(code)}; stopping the other "
                  f"{len(children)} rank(s)", file=sys.stderr, flush=True)
            _stop(children)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
