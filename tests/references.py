"""Single-process references the tests compare the distributed code with."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hpcdl.common.layers import build_spec
from hpcdl.studies.shuffle.exchange_plan import rank_plan
from hpcdl.studies.spatial.data import SlabReader
from hpcdl.studies.spatial.model import CosmoFlow


def reference_losses(data_dir: str, model: dict, batch_size: int, iterations: int, lr: float, seed: int,
                     dtype: str = "float64") -> list[float]:
    """The same training on one process with the whole model and batch (no process group needed).

    It runs in the test's own process: torch's default dtype is set for it and restored after, so the
    tests that run later in the same process (a pytest-xdist worker's) see float32 as usual."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        return _train(data_dir, model, batch_size, iterations, lr, seed)
    finally:
        torch.set_default_dtype(before)


def _train(data_dir: str, model: dict, batch_size: int, iterations: int, lr: float, seed: int) -> list[float]:
    reader = SlabReader(data_dir)
    torch.manual_seed(seed)
    net = CosmoFlow(build_spec(reader.shape, model))
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    order = np.random.default_rng(seed).permutation(len(reader))
    losses = []
    for it in range(iterations):
        start = (it * batch_size) % len(reader)
        idx = np.take(order, range(start, start + batch_size), mode="wrap")
        xb, yb = reader.read(idx, slice(None), slice(None))
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.mse_loss(net(torch.from_numpy(xb).to(torch.get_default_dtype())),
                                      torch.from_numpy(yb).to(torch.get_default_dtype()))
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses


def apply_exchange(ids: list[np.ndarray], q: float, seed: int, epoch: int) -> list[np.ndarray]:
    """Pure simulation of one exchange over all ranks (same plan as the distributed code).

    Received samples overwrite the positions of the sent ones, which is how a rank never
    holds more than its partition plus k received samples.
    """
    m = len(ids)
    sizes = np.array([len(p) for p in ids])
    plans = [rank_plan(sizes, q, seed, epoch, r) for r in range(m)]
    outgoing = [np.split(ids[r][plans[r].send_pos], np.cumsum(plans[r].send_counts)[:-1]) for r in range(m)]
    new = []
    for t in range(m):
        recv = np.concatenate([outgoing[r][t] for r in range(m)] + [np.empty(0, ids[t].dtype)])
        part = ids[t].copy()
        part[plans[t].send_pos] = recv
        new.append(part)
    return new
