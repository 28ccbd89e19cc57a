"""Imported by the job forkserver only: torch and the job code, and SIGUSR1/SIGUSR2 ignored.

A forked job inherits these dispositions until it installs its own handlers, so a signal sent
in that window is dropped instead of killing the job (the default action of SIGUSR1); the job
reads its control file after installing the handlers, so the request is not lost.
"""

import signal

import hpcdl.malleable.job  # noqa: F401  (preloaded: the reason this module exists)

signal.signal(signal.SIGUSR1, signal.SIG_IGN)
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
