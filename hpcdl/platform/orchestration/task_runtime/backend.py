"""Which task backend runs this process: the COMPSs runtime, the PyCOMPSs binding alone, or local.

- `compss`: the process runs under the COMPSs runtime (`runcompss` / `enqueue_compss` put the
  binding in its master context before the app starts; task bodies run in its worker context).
- `pycompss-sequential`: the binding's own decorators without a runtime (HPCDL_RUNTIME=pycompss):
  tasks run inline in the main program, as `python app.py` with PyCOMPSs installed would.
- `local`: hpcdl.platform.orchestration.task_runtime.local's process pool.

HPCDL_RUNTIME=local|pycompss forces a choice; unset (or `auto`) detects.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from functools import cache
from importlib import metadata

BACKENDS = ("local", "compss", "pycompss-sequential")
FORCE_ENV = "HPCDL_RUNTIME"
_FORCE_VALUES = ("", "auto", "local", "pycompss")


@dataclass(frozen=True)
class BackendInfo:
    name: str                     # one of BACKENDS
    pycompss_importable: bool
    pycompss_api: str | None      # "3.x" (context object) or "2.x" (module function)
    pycompss_version: str | None  # package metadata where the binding was pip-installed
    why: str                      # how the choice was made, for errors and provenance

    def as_dict(self) -> dict:
        return asdict(self)


def _binding_scope() -> tuple[str | None, bool | None, str]:
    """(api generation, inside a COMPSs context?, note) from the binding's public context API."""
    try:
        from pycompss.util.context import CONTEXT  # PyCOMPSs >= 3.0: one context object
    except ImportError as exc_3x:
        try:
            from pycompss.util.context import in_pycompss  # PyCOMPSs 2.x: module-level function
        except ImportError:
            return None, None, f"PyCOMPSs is not importable ({exc_3x})"
        return "2.x", bool(in_pycompss()), "PyCOMPSs 2.x context API"
    return "3.x", bool(CONTEXT.in_pycompss()), "PyCOMPSs 3.x context API"


def _binding_version() -> str | None:
    for dist in ("pycompss", "pycompss-player"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def detect(environ=None) -> BackendInfo:
    environ = os.environ if environ is None else environ
    force = environ.get(FORCE_ENV, "").strip().lower()
    if force not in _FORCE_VALUES:
        raise ValueError(f"environment variable {FORCE_ENV}={environ[FORCE_ENV]!r} is not allowed; "
                         f"allowed: local, pycompss, auto (or unset)")
    api, inside, note = _binding_scope()
    found = api is not None
    version = _binding_version() if found else None
    if force == "local":
        return BackendInfo("local", found, api, version, f"{FORCE_ENV}=local")
    if not found:
        if force == "pycompss":
            raise ValueError(f"{FORCE_ENV}=pycompss but {note}")
        return BackendInfo("local", False, None, None, note)
    if inside:
        return BackendInfo("compss", True, api, version, f"{note}: inside the COMPSs runtime")
    if force == "pycompss":
        return BackendInfo("pycompss-sequential", True, api, version,
                           f"{FORCE_ENV}=pycompss: the binding's decorators, no runtime (tasks run inline)")
    return BackendInfo("local", True, api, version, f"{note}: not running under the COMPSs runtime")


@cache
def backend_info() -> BackendInfo:
    """The backend of this process, detected on first use and then fixed for its lifetime; every
    table this process writes afterwards names it in its provenance."""
    from hpcdl.platform.kit.results import record_task_backend

    info = detect()
    record_task_backend(info.as_dict())
    return info
