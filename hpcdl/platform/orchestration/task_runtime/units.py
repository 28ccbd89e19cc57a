"""The one computing_units mechanism of every task app.

A study's tasks say `@constraint(computing_units="$HPCDL_<STUDY>_UNITS")` (a study whose tasks can hold GPUs
gives the same variable to the CPU of its processor list: hpcdl.platform.orchestration.task_runtime.gpus). The
value comes from the study's declaration (hpcdl.platform.kit.study.StudySpec.task_units): an int, or a "$VAR"
config setting such as "$SLURM_CPUS_PER_TASK". COMPSs reads a "$VAR" constraint from the runtime's own
environment when the runtime starts, before the app runs, so the value must be exported by the command that
starts it: `units_exports` gives the shell assignments the generated commands put in front of python /
runcompss / enqueue_compss, and `apply_units` makes the app agree with them (the local backend reads the
variable at submission time; under COMPSs a missing or different value is an error, since the runtime has
already read it).
"""

from __future__ import annotations

import os
import re

VAR = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")


class UnitsError(ValueError):
    """The cores a study's tasks need are not what the COMPSs runtime was started with."""


def units_var(study: str) -> str:
    return f"HPCDL_{study.upper()}_UNITS"


def task_units(study: str, cfg: dict) -> int | str:
    """The study's setting: an int, or a "$VAR" string to be read from the environment at run time."""
    from hpcdl.platform.kit.study import spec

    return spec(study).task_units(cfg)


def read_count(value: int | str, key: str, *, minimum: int, noun: str, error: type[Exception],
               environ=None) -> int:
    """An int-like value >= `minimum`, or "$VAR" read from `environ`; `key` names the setting and
    `noun` what it counts in `error`'s message. Shared by the cores (here) and the GPUs (gpus.py)."""
    environ = os.environ if environ is None else environ
    raw = value
    if isinstance(value, str):
        m = VAR.match(value.strip())
        if m:
            if m.group(1) not in environ:
                raise error(f"{key}={raw!r} names environment variable {m.group(1)}, which is not set")
            value = environ[m.group(1)]
    wrong = f"{key}={raw!r} is not a {noun} (an integer >= {minimum} or \"$VAR\")"
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise error(wrong) from None
    if isinstance(value, bool) or count < minimum:
        raise error(wrong)
    return count


def resolve(value: int | str, key: str, environ=None) -> int:
    """A core count: an int-like value >= 1, or "$VAR" read from `environ`; `key` names the setting."""
    return read_count(value, key, minimum=1, noun="core count", error=UnitsError, environ=environ)


def units_exports(study: str, cfg: dict) -> dict[str, str]:
    """{HPCDL_<STUDY>_UNITS: shell word}: an int, or "${VAR}" that the shell expands when the rule runs."""
    value = task_units(study, cfg)
    if isinstance(value, str):
        m = VAR.match(value)
        word = f"${{{m.group(1)}}}" if m else value
    else:
        word = str(int(value))
    return {units_var(study): word}


def agree_with_runtime(var: str, count: int, backend: str, *, study: str, needs: str, what: str,
                       error: type[Exception], hint: str = "") -> None:
    """Give the tasks' constraint variable `var` the value `count` in this process. Under COMPSs the
    runtime read it when it started, so there it must already be `count`, else `error` says why
    (`needs`: what the config asks, `what`: the constraint). Shared by the cores (here) and the GPUs
    (gpus.py)."""
    if backend != "compss":
        os.environ[var] = str(count)
        return
    seen = os.environ.get(var)
    if seen != str(count):
        raise error(f"the COMPSs runtime was started with {var}={seen!r} but {needs}: COMPSs reads a "
                    f"task's {what} from its environment at start-up, so start runcompss with "
                    f"{var}={count} (the commands printed by `python -m hpcdl compss command|enqueue "
                    f"{study} --config FILE` do){hint}")


def apply_units(study: str, cfg: dict, backend: str) -> int:
    """Make the task constraints of `study` resolve to its configured cores in this process."""
    units = resolve(task_units(study, cfg), f"{study} computing units")
    agree_with_runtime(units_var(study), units, backend, study=study, what="computing_units",
                       needs=f"the {study} config needs {units}", error=UnitsError)
    return units
