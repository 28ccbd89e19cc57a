"""Rank functions only the shuffle device tests launch (run_ranks("shuffle_rank_checks:<name>", ...);
conftest.py puts tests/ on the ranks' PYTHONPATH)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hpcdl.platform.kit.rank_runtime.placement import current
from hpcdl.studies.shuffle import train
from hpcdl.studies.shuffle.exchange import BackgroundExchange, DeviceExchange

WATCHED = ("all_reduce", "broadcast", "all_to_all_single")


def _watch_collectives() -> list[dict]:
    """Wrap the collectives the study calls from Python: each call records its op, the backend of the
    group it runs on and the device of the tensor it moves, then runs as before."""
    calls: list[dict] = []
    for name in WATCHED:
        real = getattr(dist, name)

        def watched(*args, _real=real, _name=name, **kwargs):
            tensor = args[1] if _name == "all_to_all_single" else args[0]   # the input moved
            group = kwargs.get("group")
            calls.append({"op": _name, "default_group": group is None,
                          "backend": str(dist.get_backend(group)), "tensor_device": tensor.device.type,
                          "shape": list(tensor.shape)})
            return _real(*args, **kwargs)

        setattr(dist, name, watched)
    return calls


def collectives_of_training(points: list[dict]) -> dict:
    """Train every point (train_rank's kwargs) with the collectives watched; returns the placement,
    the default group's backend, each call seen, and each point's records."""
    calls = _watch_collectives()
    place = current()
    results = [train.train_rank(**p) for p in points]
    return {"placement": {"device": place.device, "compute": place.compute, "comm": place.comm,
                          "backend": place.backend, "shared": place.shared, "label": place.label},
            "default_backend": str(dist.get_backend()), "calls": calls,
            "records": [r["records"] for r in results]}


def exchange_to_self(k: int = 37) -> dict:
    """One rank sends k samples to itself, once in host memory over gloo and once as CUDA tensors over
    NCCL (the default group on a GPU rank): what arrives, both ways."""
    if dist.get_world_size() != 1:
        raise ValueError("exchange_to_self runs on one rank")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(k, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (k,), generator=gen)
    ids = torch.randperm(1000, generator=gen)[:k]
    counts = [k]
    host = BackgroundExchange(x, y, ids, counts, counts, dist.new_group(backend="gloo"), epoch=0)
    h, _ = host.wait(60)
    dev = torch.device(current().compute)
    gpu = DeviceExchange(x.to(dev), y.to(dev), ids.to(dev), counts, counts, epoch=0)
    d, exposed = gpu.wait(60)
    return {"host": [t.numpy() for t in (h.x, h.y, h.ids)],
            "device": [t.cpu().numpy() for t in (d.x, d.y, d.ids)],
            "bytes": (h.bytes_sent, d.bytes_sent), "device_time_s": d.time_s, "exposed_s": exposed}
