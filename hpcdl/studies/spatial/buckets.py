"""Gradient all-reduce in buckets launched during the backward, as DistributedDataParallel does.

Parameters are grouped into buckets of about `bucket_bytes` in the order the backward produces
their gradients (last layer first). A bucket's all-reduce starts (async) the moment its last
gradient is accumulated, so it travels while the backward of earlier layers still computes;
buckets are launched strictly in order so every rank issues the same collectives in the same
order. `finish()` waits for them all and writes the reduced gradients back.

On a GPU over NCCL a bucket's all-reduce runs on NCCL's stream once the stream that produced its
gradients reaches it (the hook's); `finish()` makes the compute stream wait for each (work.wait()),
so the copies back are ordered after the reduction. Where ranks share a GPU (gloo) a bucket is
staged to host memory in the hook and copied back after its wait.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from hpcdl.studies.spatial.devices import synchronize, to_comm


class _Bucket:
    def __init__(self, params: list, group, scale: float):
        self.params, self.group, self.scale = params, group, scale
        self.pending = len(params)
        self.flat = None
        self.sent = None  # what the all-reduce moves: flat itself, or its host copy (shared GPU)
        self.work = None


class GradBuckets:
    """`plan`: [(params in backward order, process group or None for the world, scale)], each
    list reduced over its group (sum, then x scale); a group of one rank only scales."""

    def __init__(self, plan: list[tuple[list, object, float, int]], bucket_bytes: int):
        self.buckets: list[_Bucket] = []
        self.local: list[tuple[list, float]] = []
        for params, group, scale, size in plan:
            if size <= 1:
                self.local.append((params, scale))
                continue
            cur, nbytes = [], 0
            for p in params:
                cur.append(p)
                nbytes += p.numel() * p.element_size()
                if nbytes >= bucket_bytes:
                    self.buckets.append(_Bucket(cur, group, scale))
                    cur, nbytes = [], 0
            if cur:
                self.buckets.append(_Bucket(cur, group, scale))
        self._owner = {}
        for i, b in enumerate(self.buckets):
            for p in b.params:
                self._owner[p] = i
                p.register_post_accumulate_grad_hook(self._ready)
        self._next = 0
        # the parameters' device: on CUDA the exposed wait is timed once its queued kernels are done
        self.device = next((p.device for params, *_ in plan for p in params), torch.device("cpu"))

    def start(self) -> None:
        """Before each backward."""
        for b in self.buckets:
            b.pending, b.work, b.flat, b.sent = len(b.params), None, None, None
        self._next = 0

    def _ready(self, p) -> None:
        i = self._owner.get(p)
        if i is None:
            return
        self.buckets[i].pending -= 1
        self._launch()

    def _launch(self, force: bool = False) -> None:
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if b.pending > 0 and not force:
                return
            b.flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                for p in b.params])
            b.sent = to_comm(b.flat)
            b.work = dist.all_reduce(b.sent, group=b.group, async_op=True)
            self._next += 1

    def finish(self) -> float:
        """Wait for every bucket (launching any whose gradients never came), copy back, scale.

        Returns the seconds spent waiting here: the all-reduce time the backward did not hide. On a
        GPU that is from the end of the backward's kernels to the end of the last reduction."""
        self._launch(force=True)
        synchronize(self.device)
        t0 = time.perf_counter()
        for b in self.buckets:
            b.work.wait()
            if b.sent is not b.flat:
                b.flat.copy_(b.sent)
        synchronize(self.device)
        waited = time.perf_counter() - t0
        for b in self.buckets:
            b.flat.mul_(b.scale)
            off = 0
            for p in b.params:
                n = p.numel()
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(b.flat[off:off + n].view_as(p))
                off += n
        for params, scale in self.local:
            if scale != 1.0:
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(scale)
        return waited
