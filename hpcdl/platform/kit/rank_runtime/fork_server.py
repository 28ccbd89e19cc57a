"""The resident local rank launcher: one interpreter per calling process imports torch once and forks
the ranks of every launch that process asks for (forked.fork_ranks).

The one-shot launcher (forked.py) started a fresh interpreter per launch, and importing torch there
cost about 1 s of CPU each time, 2 s where the ranks train (torch._dynamo, RANK_PRELOAD). A study
of many short launches paid that on every one: the spatial study's 31 launches spent about 3.3 s
each outside their timed iterations on the laptop. Here only the first launch of a calling process
pays it; each later one costs a fork and the process group's rendezvous.

Forking stays safe for the reason forked.py gives: the server only imports, it never runs a torch op,
so no intra-op thread pool or CUDA context exists to be broken across fork().

The parent (launch.py) writes one JSON request a line to the server's stdin, {"nprocs", "target",
"workdir", "env"}, and reads one JSON line back, {"code", "message"}. Each rank runs in the request's
environment with its stdout and stderr in WORKDIR/rank-<r>.log. The server exits when its stdin
closes, so it never outlives its parent; a launch past its timeout kills the server's whole session
(launch.py) and the next launch starts a new one.

    python -m hpcdl.platform.kit.rank_runtime.fork_server
"""

from __future__ import annotations

import json
import sys

from hpcdl.platform.kit.rank_runtime.forked import fork_ranks


def serve(requests, replies) -> None:
    import torch  # noqa: F401  (imported once, before the first request)

    for line in requests:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            code, message = fork_ranks(int(req["nprocs"]), req["target"], req["workdir"],
                                       env=req["env"], log_to_files=True)
        except Exception as exc:  # a bad request or an import error: say so, stay up for the next one
            code, message = 1, f"[hpcdl] fork server could not launch: {type(exc).__name__}: {exc}"
        replies.write(json.dumps({"code": code, "message": message}) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)
