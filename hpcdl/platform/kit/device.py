"""The one device mechanism of every study (docs/architecture.md, "Devices").

Every study block takes `device: auto | cpu | cuda` (one schema definition, configs/schema/device.yaml,
added to each block by hpcdl.platform.kit.config). `resolve` turns it into `cpu` or `cuda` once, where
the work runs: `auto` is CUDA when torch sees a GPU; `cuda` where none is visible is a ConfigError
naming the key (task apps exit 2 on it before writing anything).

Ranks: the process-group backend follows the tensors' device, never the host (`dist_backend`):
NCCL for CUDA tensors, gloo for CPU tensors. One rank per GPU (`rank_placement`): the rank's
LOCAL_RANK picks `cuda:LOCAL_RANK`; more ranks on a node than GPUs is an error naming the layout,
unless the study's block sets `gpu_sharing: true`, where ranks share GPUs round-robin and talk over
gloo through host memory (NCCL refuses two ranks on one GPU), and their timings say so.

Torch and the config (for ConfigError) are imported inside the functions: importing this module
detects nothing, and a rank that imports it loads neither the schema nor the study registry.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

DEVICES = ("auto", "cpu", "cuda")
# What each resolved device's collectives run on, and what makes a shared GPU possible.
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
SHARED_GPU_BACKEND = "gloo"


def visible_gpus() -> int:
    """GPUs this process can use (CUDA_VISIBLE_DEVICES applies); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve(requested: str, key: str) -> str:
    """`auto` → `cuda` when a GPU is visible, else `cpu`; `cuda` without one → ConfigError naming `key`."""
    from hpcdl.platform.kit.config import ConfigError

    if requested not in DEVICES:
        raise ConfigError(key, requested, ", ".join(DEVICES))
    if requested == "cpu":
        return "cpu"
    gpus = visible_gpus()
    if requested == "cuda" and gpus == 0:
        raise ConfigError(key, requested, "auto or cpu: no GPU is visible here "
                          "(torch.cuda.is_available() is False; CUDA_VISIBLE_DEVICES="
                          f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
    return "cuda" if gpus else "cpu"


def requested(cfg: dict, study: str) -> str:
    return (cfg.get(study) or {}).get("device", "auto")


def study_device(cfg: dict, study: str) -> str:
    """The device `study` runs on here: its block's `device`, resolved among the devices the study
    declares (StudySpec.devices): a study without a CUDA path runs on the CPU under `auto`."""
    from hpcdl.platform.kit.config import ConfigError
    from hpcdl.platform.kit.study import spec

    want, key = requested(cfg, study), f"{study}.device"
    if "cuda" not in spec(study).devices:
        if want == "cuda":
            raise ConfigError(key, want, f"auto or cpu: the {study} study has no CUDA path")
        return "cpu"
    return resolve(want, key)


def dist_backend(device: str) -> str:
    """The process-group backend for tensors on `device` (a resolved device)."""
    if device not in BACKENDS:
        raise ValueError(f"device {device!r} is not a resolved device; expected one of {', '.join(BACKENDS)}")
    return BACKENDS[device]


@dataclass(frozen=True)
class Placement:
    """Where one rank computes and how it talks.

    compute: the torch device of the rank's model and activations ("cpu" or "cuda:<i>");
    comm: the device of the tensors its collectives move ("cuda:<i>" over NCCL, "cpu" over gloo);
    shared: True when ranks of one node share a GPU (timings then include host staging).
    """
    device: str
    compute: str
    comm: str
    backend: str
    shared: bool = False

    @property
    def label(self) -> str:
        if self.device == "cpu":
            return "cpu (gloo)"
        return f"{self.compute} ({'shared GPU, gloo via host memory' if self.shared else 'nccl'})"


class LayoutError(RuntimeError):
    """More ranks on a node than GPUs, without gpu_sharing."""


def rank_placement(device: str, local_rank: int, local_world: int, gpus: int,
                   sharing: bool = False) -> Placement:
    """The placement of local rank `local_rank` of `local_world` on a node with `gpus` visible GPUs.

    One rank per GPU: cuda:local_rank. A launcher that hands each rank exactly one GPU (srun
    --gpus-per-task=1 with device binding, the local backend's pool) leaves one visible: cuda:0.
    """
    if device == "cpu":
        return Placement("cpu", "cpu", "cpu", "gloo")
    if device != "cuda":
        raise ValueError(f"device {device!r} is not a resolved device (cpu or cuda)")
    if gpus < 1:
        raise LayoutError("device cuda but this rank sees no GPU")
    if gpus == 1 and _one_gpu_each():
        return Placement("cuda", "cuda:0", "cuda:0", "nccl")
    if local_world <= gpus:
        index = local_rank if gpus > 1 else 0
        return Placement("cuda", f"cuda:{index}", f"cuda:{index}", "nccl")
    if not sharing:
        raise LayoutError(
            f"{local_world} ranks on this node but {gpus} GPU(s) visible: one rank per GPU needs "
            f"at most {gpus} ranks per node (run fewer ranks, spread them over more nodes, or set "
            f"the study's gpu_sharing: true to share GPUs over {SHARED_GPU_BACKEND})")
    index = local_rank % gpus
    return Placement("cuda", f"cuda:{index}", "cpu", SHARED_GPU_BACKEND, shared=True)


def _one_gpu_each() -> bool:
    """True where the launcher bound each rank to its own GPU (HPCDL_GPU_PER_RANK_BOUND=1: srun
    --gpus-per-task=1 implies --gpu-bind=per_task:1): each rank sees one GPU, its own, at index 0,
    however many ranks the node runs."""
    return os.environ.get("HPCDL_GPU_PER_RANK_BOUND") == "1"


def check_layout(device: str, ranks_per_node: int, gpus: int, sharing: bool, what: str) -> None:
    """Refuse, before any rank starts, a launch of `ranks_per_node` ranks over `gpus` GPUs."""
    if device == "cuda" and ranks_per_node > gpus and not sharing:
        raise LayoutError(
            f"{what}: {ranks_per_node} ranks per node on {gpus} visible GPU(s); one rank per GPU needs "
            f"at most {gpus} (set the study's gpu_sharing: true to share GPUs over "
            f"{SHARED_GPU_BACKEND}, timings labelled shared)")


def _run(cmd: list[str]) -> str:
    if shutil.which(cmd[0]) is None:
        return ""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


# Words of a GPU model's name that say nothing of which GPU it is.
VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro"}


def gpu_slug(model: str) -> str:
    """A GPU model's short name, for folder and file names: the words up to the first with a digit,
    vendor words left out, lower case ("NVIDIA H100 80GB HBM3" -> h100, "NVIDIA GeForce RTX 4090" ->
    rtx4090). The GPU records' folders and the micro-batch study's engine tables use the same names."""
    out = []
    for word in (w for w in re.split(r"[\s_-]+", model.lower()) if w and w not in VENDOR_WORDS):
        out.append(re.sub(r"[^a-z0-9]", "", word))
        if any(c.isdigit() for c in word):
            break
    slug = "".join(out)
    if not slug:
        raise ValueError(f"no short name in the GPU model {model!r} (its words after the vendor's)")
    return slug


def driver_version() -> str:
    """The NVIDIA driver's version (nvidia-smi), else the CUDA driver API version libcuda reports."""
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if smi:
        return smi.splitlines()[0].strip()
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"CUDA driver API {version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        pass
    return "unknown"


def cuda_record() -> dict:
    """GPU model, count, driver, CUDA, cuDNN and NCCL versions of this process's CUDA (empty without)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    nccl = ""
    try:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except (AttributeError, RuntimeError):
        pass
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "gpu_model": torch.cuda.get_device_name(0),
        "gpu_count": torch.cuda.device_count(),
        "gpu_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory,
        "driver": driver_version(),
        "cuda": torch.version.cuda,
        "cudnn": str(cudnn) if cudnn else "unavailable",
        "nccl": nccl or "unavailable",
    }


def device_record(cfg: dict, study: str, resolved: str | None = None) -> dict:
    """What a table's provenance says about the device: requested, resolved (`resolved`, where the
    task app already resolved it) and, on CUDA, the GPU."""
    want = requested(cfg, study)
    got = resolved or study_device(cfg, study)
    record = {"device_requested": want, "device": got}
    if got == "cuda":
        record.update(cuda_record())
    return record
