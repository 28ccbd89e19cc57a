"""The one door task apps (tasks/) and benchmarks (benchmarks/) go through:
`from hpcdl.platform.task_app import start_app, study_task, ...`.

A task app starts with `run = start_app(study, argv, description)`: the config parsed and checked,
the backend allowed, the device resolved once and its tasks' cores and GPUs exported; `run` (a
hpcdl.platform.kit.points.StudyRun) carries that device to the workers and owns every path of the
run (its StudyDir: raw tables, claims, about page, logs). Its tasks are `@study_task(study)` bodies;
it gathers them with `compss_wait_on` and writes its raw tables with `write_table`.

Like the study face (hpcdl.platform), each name is imported from its module on first use: the task
runtime chooses its backend when a task app first asks for it, not when this module is imported.
tests/test_layering.py checks that tasks/ and benchmarks/ import the platform through here only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcdl.platform import _lazy_names

if TYPE_CHECKING:
    from hpcdl.platform.kit.atomic import atomic_write_text
    from hpcdl.platform.kit.config import ConfigError, load_config, validate_config
    from hpcdl.platform.kit.device import DEVICES
    from hpcdl.platform.kit.device import resolve as resolved_device
    from hpcdl.platform.kit.points import StudyRun, failed_row, point_key, read_record
    from hpcdl.platform.kit.procenv import pythonpath
    from hpcdl.platform.kit.rank_runtime.launch import run_ranks
    from hpcdl.platform.kit.rank_runtime.placement import current as current_placement
    from hpcdl.platform.kit.results import available_cores, write_table
    from hpcdl.platform.orchestration.task_runtime import (
        BACKEND,
        compss_wait_on,
        failure_reason,
        set_local_cores,
    )
    from hpcdl.platform.orchestration.task_runtime.app import start_app
    from hpcdl.platform.orchestration.task_runtime.gpus import POOL_ENV, gpu_pool
    from hpcdl.platform.orchestration.task_runtime.study_task import study_task
    from hpcdl.platform.orchestration.task_runtime.units import units_var

_RUNTIME = "hpcdl.platform.orchestration.task_runtime"
# The door, written once: per group, module -> the names exported from it; tests/test_layering.py
# checks the TYPE_CHECKING imports above against it.
DOOR: dict[str, dict[str, tuple[str, ...]]] = {
    "what a task app starts and submits with": {
        f"{_RUNTIME}.app": ("start_app",),
        f"{_RUNTIME}.study_task": ("study_task",),
        _RUNTIME: ("BACKEND", "compss_wait_on", "failure_reason", "set_local_cores"),
        f"{_RUNTIME}.units": ("units_var",),
        f"{_RUNTIME}.gpus": ("POOL_ENV", "gpu_pool"),
    },
    "what a run writes and keeps": {
        "hpcdl.platform.kit.points": ("StudyRun", "failed_row", "point_key", "read_record"),
        "hpcdl.platform.kit.results": ("available_cores", "write_table"),
        "hpcdl.platform.kit.atomic": ("atomic_write_text",),
    },
    "what a benchmark sets up": {
        "hpcdl.platform.kit.config": ("ConfigError", "load_config", "validate_config"),
        "hpcdl.platform.kit.device": ("DEVICES", "resolved_device"),
        "hpcdl.platform.kit.procenv": ("pythonpath",),
        "hpcdl.platform.kit.rank_runtime.launch": ("run_ranks",),
        "hpcdl.platform.kit.rank_runtime.placement": ("current_placement",),
    },
}
_RENAMED = {"current_placement": "current", "resolved_device": "resolve"}
# door name -> (module, attribute); the backend is chosen once: BACKEND keeps asking the runtime
EXPORTS, __getattr__, __dir__ = _lazy_names(globals(), DOOR, _RENAMED, uncached=("BACKEND",))
__all__ = sorted(EXPORTS)
