"""Imported by the job forkserver only: torch and the job code, SIGUSR1/SIGUSR2 ignored, and the
forkserver tied to its parent's life (it does not notice a SIGKILLed parent by itself when a child
holds its end of the liveness pipe; with PR_SET_PDEATHSIG it dies, and so its jobs with it).

A forked job inherits these dispositions until it installs its own handlers, so a signal sent
in that window is dropped instead of killing the job (the default action of SIGUSR1); the job
reads its control file after installing the handlers, so the request is not lost.
"""

import signal

import hpcdl.studies.malleable.job  # (preloaded: the reason this module exists)

hpcdl.studies.malleable.job.die_with_parent()

signal.signal(signal.SIGUSR1, signal.SIG_IGN)
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
