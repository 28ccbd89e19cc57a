"""Where this rank computes and over which backend it talks (hpcdl.platform.kit.device.Placement).

The launcher (hpcdl.platform.kit.rank_runtime.launch.run_ranks) passes the study's resolved device and
its gpu_sharing setting to every rank as HPCDL_DEVICE / HPCDL_GPU_SHARING; `current()` turns them,
LOCAL_RANK and the ranks on this node into the rank's placement. Rank code puts its model and
activations on `current().compute` and the tensors its collectives move on `current().comm`; the
default process group already runs `current().backend` (entry.main). A study that keeps some
traffic in host memory (the shuffle study's samples) makes its own gloo group for it.
"""

from __future__ import annotations

import os
import re
from functools import cache

from hpcdl.platform.kit.device import Placement, rank_placement, visible_gpus


def _slurm_tasks_on_node() -> int | None:
    """Tasks of this srun step on this node, from SLURM_STEP_TASKS_PER_NODE ("2(x3),1") and SLURM_NODEID."""
    spec = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
    node = os.environ.get("SLURM_NODEID")
    if not spec or node is None or not node.isdigit():
        return None
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[int(node)] if int(node) < len(counts) else None


def local_rank_and_world() -> tuple[int, int]:
    """(this rank's index on its node, ranks on its node): torchrun's or the forked launcher's
    LOCAL_RANK / LOCAL_WORLD_SIZE, else srun's SLURM_LOCALID and step layout."""
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))
    world = os.environ.get("LOCAL_WORLD_SIZE")
    if world and world.isdigit():
        return local, int(world)
    on_node = _slurm_tasks_on_node()
    return local, on_node if on_node else int(os.environ.get("WORLD_SIZE", "1"))


@cache
def current() -> Placement:
    device = os.environ.get("HPCDL_DEVICE", "cpu")
    sharing = os.environ.get("HPCDL_GPU_SHARING") == "1"
    local, world = local_rank_and_world()
    gpus = visible_gpus() if device == "cuda" else 0
    return rank_placement(device, local, world, gpus, sharing)
