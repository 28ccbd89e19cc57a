"""Starting job processes fast: a forkserver that has imported torch once forks every job.

Importing torch costs about 2 s of CPU on the laptop machine; a scheduler that paid it per job
would measure its own start-up, not the jobs. The forkserver imports `hpcdl.studies.malleable.job`
(torch, the model, the data reader) without running an op, so no thread pool exists when it
forks. Jobs are the forkserver's children, in the caller's process group; each asks for SIGKILL
when its parent dies, and the forkserver exits when the process that started it dies, so killing
the driver takes every job down with it.
"""

from __future__ import annotations

import multiprocessing
from functools import cache


@cache
def _context():
    """The forkserver context, its preload set on first use: the preload list is the process's one
    forkserver's, so setting it at import would change it for every importer of this module."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["hpcdl.studies.malleable._preload"])
    return ctx


def start_job(spec: dict):
    """Start one job process (a multiprocessing.Process: .pid, .sentinel, .exitcode)."""
    from hpcdl.studies.malleable.job import job_entry

    proc = _context().Process(target=job_entry, args=(spec,), name=f"job-{spec['name']}")
    proc.start()
    return proc


def _noop() -> None:
    pass


def warm_up() -> None:
    """Start the forkserver and wait until it has imported torch: not charged to the first job."""
    proc = _context().Process(target=_noop, name="forkserver-warm-up")
    proc.start()  # returns once the forkserver, preload done, has forked it
    proc.join()
