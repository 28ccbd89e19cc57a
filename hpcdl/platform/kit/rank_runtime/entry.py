"""Entry point of one rank: init the process group from the environment, run the target.

Rank and world size come from torchrun (RANK/WORLD_SIZE) or from srun
(SLURM_PROCID/SLURM_NTASKS); MASTER_ADDR/MASTER_PORT are set by the launcher. The backend follows
the device of the tensors the rank's collectives move (rank_runtime.placement): NCCL on the rank's
own GPU, gloo for CPU tensors; never whatever the host happens to have.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import traceback
from datetime import timedelta
from pathlib import Path


def rank_and_world() -> tuple[int, int]:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if "SLURM_PROCID" in os.environ:
        return int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    return 0, 1


def main(target: str, workdir: str) -> int:
    rank, world = rank_and_world()
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    os.environ.setdefault("LOCAL_RANK", os.environ.get("SLURM_LOCALID", str(rank)))
    out = Path(workdir)
    try:
        import torch
        import torch.distributed as dist

        from hpcdl.platform.kit.rank_runtime.placement import current

        torch.set_num_threads(int(os.environ.get("HPCDL_THREADS_PER_RANK", "1")))
        place = current()
        backend = place.backend
        extra = {}
        if place.device == "cuda":
            torch.cuda.set_device(place.compute)
            if backend == "nccl":  # binds the group to the rank's GPU (NCCL's communicators form eagerly)
                extra["device_id"] = torch.device(place.compute)
        # A peer that dies must surface as an error here, not as a hang.
        timeout = timedelta(seconds=float(os.environ.get("HPCDL_COLLECTIVE_TIMEOUT_S", "60")))
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **extra)
        (out / f"joined-{rank}").touch()   # the launcher retries only launches that never got here
        module_name, func_name = target.split(":")
        func = getattr(importlib.import_module(module_name), func_name)
        kwargs = pickle.loads((out / "kwargs.pkl").read_bytes())
        result = func(**kwargs)
        tmp = out / f"result-{rank}.pkl.tmp"
        tmp.write_bytes(pickle.dumps(result))
        os.replace(tmp, out / f"result-{rank}.pkl")
        dist.destroy_process_group()
        return 0
    except BaseException:
        (out / f"error-{rank}.txt").write_text(traceback.format_exc())
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
