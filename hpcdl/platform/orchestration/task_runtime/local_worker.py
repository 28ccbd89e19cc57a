"""What runs inside a local backend's worker process: one task, given its cores and its GPUs."""

from __future__ import annotations

import importlib
import os
import sys

IN_WORKER_ENV = "HPCDL_LOCAL_WORKER"  # set in workers: a task calling a task runs it inline


def run_in_worker(module: str, qualname: str, args, kwargs, units: int, gpu_ids: list[str] | None = None):
    os.environ[IN_WORKER_ENV] = "1"
    if gpu_ids is not None:  # before anything in this fresh process initialises CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    os.environ["OMP_NUM_THREADS"] = str(units)
    if "torch" in sys.modules:  # the task module imported torch: give it its cores
        sys.modules["torch"].set_num_threads(units)
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    fn = getattr(obj, "__wrapped__", obj)
    try:
        return fn(*args, **kwargs)
    finally:
        if gpu_ids is not None:
            release_gpu_memory()


def release_gpu_memory():
    """The worker outlives its task: give the allocator's cached blocks back, so what the next
    process on this GPU (a rank, a task with other ids) measures and can allocate is not ours."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        import gc

        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def worker_init():
    os.environ[IN_WORKER_ENV] = "1"
