"""The GPU twin of units.py: how many GPUs each task of a study holds, and the local GPU pool.

A study whose tasks can hold GPUs (StudySpec.task_gpus(cfg) > 0) declares them with the binding's
own constraint, its cores and its GPUs in one processor list (the spelling of the COMPSs manual,
"Constraints", and of BSC's dislib):

    @constraint(processors=[{"processorType": "CPU", "computingUnits": "$HPCDL_<STUDY>_UNITS"},
                            {"processorType": "GPU", "computingUnits": "$HPCDL_<STUDY>_GPUS"}])

The CPU entry is listed because, once `processors` is given, COMPSs takes the task's cores from that
list (`computing_units` beside it would be added to a listed CPU). `$HPCDL_<STUDY>_GPUS` is
StudySpec.task_gpus(cfg) where the study's device (hpcdl.platform.kit.device) resolves to cuda, else 0.
A GPU computingUnits of 0 is fine: the binding passes the list on as text and the runtime drops a
listed processor with no computing units (MethodResourceDescription, COMPSs 3.3), so one decorator
serves CPU and GPU runs. The variable must be set, though: unset, the runtime reads "" and gives the
processor its default of one unit. `$VAR` is written without braces: the runtime ends a processor's
definition at the first "}".

Where `device: auto` is resolved, since a command may be generated on a host (a login node, the
Snakemake host) that is not where the tasks run:
- the run rule's runcompss command (hpcdl.platform.orchestration.task_runtime.compss.task_app_command) runs
where COMPSs and its tasks run (locally, or inside the rule's Slurm job), so its shell resolves it
  there, by the app's own rule: `HPCDL_<STUDY>_GPUS="$(python -m hpcdl compss gpus STUDY --config
  FILE)"`;
- enqueue_compss fixes the job's environment on the submitting host, and the job has GPUs only if it
  asks for them: `auto` there means GPUs exactly when `compss.extra_flags` asks for
  `--gpus_per_node` >= 1 (`cuda` adds --gpus_per_node itself);
- `cuda` and `cpu` mean the same everywhere.
The app checks the value at start (`apply_gpus`): under COMPSs the runtime has already read the
variable, so a value other than the one the app resolves is an error, as for the units.

The local backend's pool (`gpu_pool`): HPCDL_GPU_POOL=0,1,... where set (the ids are handed out as
given: a node shared between apps, or a test), else the GPUs this process sees (the entries of
CUDA_VISIBLE_DEVICES that torch counts, or 0..n-1). Each task holding g GPUs gets g ids of its own
in CUDA_VISIBLE_DEVICES, as COMPSs's worker binds them.
"""

from __future__ import annotations

import os

from hpcdl.platform.orchestration.task_runtime.units import agree_with_runtime, read_count

POOL_ENV = "HPCDL_GPU_POOL"


class GpuError(ValueError):
    """The GPUs a study's tasks need are not what the runtime was started with, or not there."""


def gpus_var(study: str) -> str:
    return f"HPCDL_{study.upper()}_GPUS"


def declared_gpus(study: str, cfg: dict) -> int:
    """GPUs each task of `study` holds when its device is cuda (StudySpec.task_gpus); 0: never any."""
    from hpcdl.platform.kit.study import spec

    value = spec(study).task_gpus(cfg)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GpuError(f"hpcdl/studies/{study}: StudySpec.task_gpus gave {value!r}, "
                       "not a GPU count (an integer >= 0)")
    return value


def task_gpus(study: str, cfg: dict, device: str | None = None) -> int:
    """GPUs each task of `study` holds here: declared_gpus where its device resolves to cuda, else 0.

    `device` is the resolved device; None resolves it (ConfigError naming `<study>.device` for cuda
    where no GPU is visible).
    """
    from hpcdl.platform.kit.device import requested, study_device

    declared = declared_gpus(study, cfg)
    if device is None:
        # cpu needs no look at the hardware (and no torch import)
        device = "cpu" if requested(cfg, study) == "cpu" else study_device(cfg, study)
    return declared if device == "cuda" else 0


def resolve_gpus(value: int | str, key: str, environ=None) -> int:
    """A GPU count: an int-like value >= 0, or "$VAR" read from `environ`; `key` names it."""
    return read_count(value, key, minimum=0, noun="GPU count", error=GpuError, environ=environ)


def gpu_pool(environ=None) -> list[str]:
    """The GPU ids the local backend hands out, in order (see the module docstring)."""
    environ = os.environ if environ is None else environ
    if POOL_ENV in environ:
        ids = [x.strip() for x in environ[POOL_ENV].split(",")] if environ[POOL_ENV].strip() else []
        if any(not x for x in ids) or len(set(ids)) != len(ids):
            raise GpuError(f"environment variable {POOL_ENV}={environ[POOL_ENV]!r} is not a list of distinct "
                           "GPU ids (e.g. 0,1,2,3; empty for none)")
        return ids
    from hpcdl.platform.kit.device import visible_gpus

    count = visible_gpus()
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    # A child given CUDA_VISIBLE_DEVICES=0 would see physical GPU 0, not our first: hand out our
    # entries (ids or UUIDs), as many as CUDA counted (it stops at the first invalid one).
    return [x.strip() for x in listed.split(",") if x.strip()][:count]


def gpus_exports(study: str, cfg: dict, config_path: str) -> dict[str, str]:
    """{HPCDL_<STUDY>_GPUS: shell word} for a command whose shell runs where the tasks run.

    Empty for a study whose tasks never hold GPUs. `auto` stays a command substitution that asks,
    in that shell, what the app will resolve there (`python -m hpcdl compss gpus`).
    """
    from hpcdl.platform.kit.device import requested

    declared = declared_gpus(study, cfg)
    if not declared:
        return {}
    want = requested(cfg, study)  # one of auto, cpu, cuda: the config was validated
    if want == "auto":
        import shlex

        ask = shlex.join(["python", "-m", "hpcdl", "compss", "gpus", study, "--config", str(config_path)])
        return {gpus_var(study): f"$({ask})"}
    return {gpus_var(study): str(declared if want == "cuda" else 0)}


def apply_gpus(study: str, cfg: dict, backend: str) -> tuple[str, int]:
    """Resolve the study's device here and make its tasks' GPU constraint agree: (device, GPUs per task).

    cuda without a visible GPU is a ConfigError naming `<study>.device`. Under COMPSs the runtime read
    HPCDL_<STUDY>_GPUS when it started, so a missing or different value is a GpuError; elsewhere the
    variable is set here. On the local backend, GPUs per task with an empty pool is a GpuError.
    """
    from hpcdl.platform.kit.device import study_device

    device = study_device(cfg, study)
    gpus = task_gpus(study, cfg, device)
    if not declared_gpus(study, cfg):
        return device, 0  # its tasks name no GPU variable
    agree_with_runtime(gpus_var(study), gpus, backend, study=study, what="GPU constraint", error=GpuError,
                       needs=f"{study}.device ({cfg[study].get('device', 'auto')}) resolves to {device} "
                             f"here, so each {study} task holds {gpus} GPU(s)",
                       hint=f", or set {study}.device to match the GPUs the runtime was given")
    if gpus and backend == "local" and not gpu_pool():
        raise GpuError(f"each {study} task holds {gpus} GPU(s) ({study}.device resolves to cuda) but the "
                       f"local GPU pool is empty: {POOL_ENV}={os.environ.get(POOL_ENV)!r}")
    return device, gpus
