"""Where a shuffle rank computes and holds its samples (`Where`), and its per-epoch bookkeeping
(train.py): the phase stopwatch, the count of the samples it holds, the epoch's batch cuts."""

from __future__ import annotations

import time

import numpy as np
import torch

from hpcdl.platform import Placement

EXCHANGE_DEVICES = ("host", "device")


class Where:
    """Where this rank computes, where it holds its samples, and how tensors get between them."""

    def __init__(self, place: Placement, exchange_device: str, strategy: str):
        if exchange_device not in EXCHANGE_DEVICES:
            raise ValueError(f"exchange_device must be one of {EXCHANGE_DEVICES}, got {exchange_device!r}")
        self.label = place.label
        self.compute, self.comm = torch.device(place.compute), torch.device(place.comm)
        self.cuda = self.compute.type == "cuda"
        on_gpu = exchange_device == "device" and self.cuda
        if on_gpu and strategy == "partial" and place.backend != "nccl":
            raise ValueError(
                f"shuffle.exchange_device: device exchanges CUDA tensors over NCCL, but this rank runs "
                f"{place.label}: ranks sharing a GPU talk over gloo; set shuffle.exchange_device: host, "
                f"or run one rank per GPU (gpu_sharing: false)")
        self.samples = self.compute if on_gpu else torch.device("cpu")
        self.samples_on = "device" if on_gpu else "host"

    def sync(self) -> None:
        """Wait for the compute stream's work, so a clock read after it times that work (CUDA)."""
        if self.cuda:
            torch.cuda.current_stream(self.compute).synchronize()

    def batch(self, src, idx: np.ndarray) -> torch.Tensor:
        """Rows `idx` of `src` (a numpy array or memmap, or a tensor of held samples), on the compute
        device."""
        if isinstance(src, torch.Tensor) and src.device == self.compute:
            return src[torch.from_numpy(idx).to(self.compute)]
        if not self.cuda:
            return torch.from_numpy(np.ascontiguousarray(src[idx]))
        # host memory -> GPU: gathered into pinned memory, the copy runs asynchronously
        if isinstance(src, torch.Tensor):
            host = torch.empty((len(idx), *src.shape[1:]), dtype=src.dtype, pin_memory=True)
            torch.index_select(src, 0, torch.from_numpy(idx), out=host)
        else:
            host = torch.from_numpy(np.ascontiguousarray(src[idx])).pin_memory()
        return host.to(self.compute, non_blocking=True)

    def on_comm(self, t: torch.Tensor, op) -> None:
        """Run the in-place collective `op` on the default group over `t`, staged on the comm device
        where it differs from t's (a shared GPU talks over gloo through host memory)."""
        if t.device == self.comm:
            op(t)
            return
        staged = t.to(self.comm)
        op(staged)
        t.copy_(staged)


class Stopwatch:
    def __init__(self, sync=None):
        self.t = {}
        self._sync = sync or (lambda: None)

    def add(self, key: str, t0: float) -> float:
        self._sync()
        now = time.perf_counter()
        self.t[key] = self.t.get(key, 0.0) + now - t0
        return now


def host_ids(idx) -> np.ndarray:
    return idx.cpu().numpy() if isinstance(idx, torch.Tensor) else np.asarray(idx)


class Held:
    """What a rank holds, counted from its buffers: distinct sample ids, and sample rows in memory
    (a staged copy of a sample being sent is a second row of the same sample)."""

    def __init__(self, samples: int, rows: int):
        self.samples, self.rows = samples, rows

    @classmethod
    def count(cls, buffers) -> Held:
        """`buffers`: (data, ids) pairs; data's first axis must match its ids row for row."""
        ids = []
        for data, idx in buffers:
            if len(data) != len(idx):
                raise RuntimeError(f"buffer holds {len(data)} samples but {len(idx)} ids")
            ids.append(host_ids(idx).ravel())
        all_ids = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
        return cls(int(len(np.unique(all_ids))), int(len(all_ids)))


def batches(n: int, batch_size: int) -> list[slice]:
    # drop nothing: the last, smaller batch still trains (every rank has the same count); a last batch
    # of one sample joins the one before, since batch norm cannot train on one sample (KAKURENBO's
    # hiding leaves any count of visible samples)
    cuts = list(range(0, n, batch_size)) + [n]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] == 1:
        del cuts[-2]
    return [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
