"""What every task app does before its first task: config, backend check, core and GPU counts."""

from __future__ import annotations

import sys

from hpcdl.platform.kit.config import ConfigError, config_from_args
from hpcdl.platform.kit.points import StudyRun
from hpcdl.platform.orchestration.task_runtime.backend import BackendInfo, backend_info
from hpcdl.platform.orchestration.task_runtime.compss import study_runtime
from hpcdl.platform.orchestration.task_runtime.gpus import GpuError, apply_gpus
from hpcdl.platform.orchestration.task_runtime.units import UnitsError, apply_units


class RuntimeSelectionError(RuntimeError):
    """The config asks for the COMPSs runtime but this process is not running under it."""


def check_backend(study: str, cfg: dict, info: BackendInfo | None = None) -> None:
    info = info or backend_info()
    if study_runtime(study, cfg) == "compss" and info.name != "compss":
        raise RuntimeSelectionError(
            f"config key '{study}.runtime' is 'compss' but the {info.name} backend was selected "
            f"({info.why}). Start the app under the COMPSs runtime (`python -m hpcdl compss "
            f"command {study} --config FILE` prints the runcompss command line) or set "
            f"{study}.runtime: local")


def start_app(study: str, argv: list[str] | None, description: str) -> StudyRun:
    """Parse --config; refuse a backend the config does not allow; resolve the study's device, once;
    export the tasks' core and GPU counts (hpcdl.platform.orchestration.task_runtime.units, .gpus).
    The run that follows (a StudyRun) carries that device to its workers and records it.

    Any refusal (`device: cuda` where no GPU is visible among them) prints the reason and exits 2
    before the app writes anything.
    """
    cfg = config_from_args(argv, description)
    info = backend_info()
    try:
        check_backend(study, cfg)
        units = apply_units(study, cfg, info.name)
        device, gpus = apply_gpus(study, cfg, info.name)
    except (RuntimeSelectionError, UnitsError, GpuError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"[{study}] task backend {info.name} ({info.why}); {units} computing unit(s) and {gpus} GPU(s) "
          f"per task; device {device}", file=sys.stderr, flush=True)
    from hpcdl.platform.orchestration import task_runtime

    return StudyRun(cfg, study, device=device, wait=task_runtime.compss_wait_on,
                    reason=task_runtime.failure_reason)
