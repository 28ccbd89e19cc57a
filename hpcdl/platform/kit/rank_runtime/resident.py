"""The calling side of the resident rank launcher (fork_server.py): one server per calling process and
start-time environment, started on its first launch, asked for each launch after.

A server is keyed by its environment without the variables that change every launch (PER_LAUNCH):
what a process reads once at start (MALLOC_* for glibc, OMP_*/MKL_* for the thread libraries,
PYTHONPATH for the imports) is then always what its ranks were asked to start with. The ranks get
the launch's whole environment. A server forked into a child process (a pool worker) is never
used there: the child starts its own.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from hpcdl.platform.kit.rank_runtime.forked import describe_exit

SERVER = "hpcdl.platform.kit.rank_runtime.fork_server"
# set anew for every launch, so they do not choose the server
PER_LAUNCH = ("MASTER_PORT", "MASTER_ADDR", "HPCDL_RANK_TIMEOUT_S", "TORCHELASTIC_ERROR_FILE")
MAX_SERVERS = 2  # each holds an interpreter with torch imported (a few hundred MiB)


class LaunchTimeout(Exception):
    """The launch ran past its timeout; its server and every rank of it were killed."""


@dataclass
class _Server:
    proc: subprocess.Popen
    owner: int = field(default_factory=os.getpid)
    lock: threading.Lock = field(default_factory=threading.Lock)


_servers: dict[tuple, _Server] = {}
_guard = threading.Lock()


def _key(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in PER_LAUNCH))


def _kill(srv: _Server) -> None:
    """End the server's whole session (its ranks included): SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(srv.proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            srv.proc.wait(timeout=5.0)
            break
        except subprocess.TimeoutExpired:
            continue


def _close(srv: _Server) -> None:
    """Let an idle server end on its own (stdin closed), killing it if it does not."""
    try:
        srv.proc.stdin.close()
        srv.proc.wait(timeout=5.0)
    except (OSError, subprocess.TimeoutExpired):
        _kill(srv)


def _server(env: dict[str, str]) -> _Server:
    key = _key(env)
    with _guard:
        srv = _servers.get(key)
        if srv is not None and (srv.owner != os.getpid() or srv.proc.poll() is not None):
            del _servers[key]  # inherited from the process we were forked from, or ended
            srv = None
        if srv is None:
            mine = [k for k, s in _servers.items() if s.owner == os.getpid()]
            for old in mine[:max(0, len(mine) - MAX_SERVERS + 1)]:
                _close(_servers.pop(old))
            proc = subprocess.Popen([sys.executable, "-m", SERVER], env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, start_new_session=True)
            srv = _servers[key] = _Server(proc)
        return srv


def _discard(srv: _Server) -> None:
    with _guard:
        for k, s in list(_servers.items()):
            if s is srv:
                del _servers[k]


def launch(nprocs: int, target: str, workdir: str, env: dict[str, str],
           timeout_s: float) -> tuple[int, str]:
    """Run one launch on this process's server for `env`: (0, "") when every rank exited 0, else
    (1, why). Past `timeout_s` the server is killed with its ranks and LaunchTimeout raised."""
    srv = _server(env)
    with srv.lock:
        request = {"nprocs": nprocs, "target": target, "workdir": str(workdir), "env": env}
        try:
            srv.proc.stdin.write(json.dumps(request) + "\n")
            srv.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            _discard(srv)
            return 1, f"[hpcdl] the fork server had ended ({_status(srv)}) before this launch"
        ready, _, _ = select.select([srv.proc.stdout], [], [], timeout_s)
        if not ready:
            _discard(srv)
            _kill(srv)
            raise LaunchTimeout(f"no reply within {timeout_s:.0f} s")
        line = srv.proc.stdout.readline()
        if not line:
            _discard(srv)
            return 1, f"[hpcdl] the fork server ended ({_status(srv)}) during this launch"
        reply = json.loads(line)
        return int(reply["code"]), str(reply["message"])


def _status(srv: _Server) -> str:
    try:
        return describe_exit(srv.proc.wait(timeout=5.0))
    except subprocess.TimeoutExpired:
        return "still running"


def server_pids() -> list[int]:
    """The pids of this process's servers (tests: a second launch reuses the first's)."""
    with _guard:
        return [s.proc.pid for s in _servers.values() if s.owner == os.getpid()]


@atexit.register
def _close_all() -> None:
    with _guard:
        mine = [s for s in _servers.values() if s.owner == os.getpid()]
        _servers.clear()
    for srv in mine:
        _close(srv)
