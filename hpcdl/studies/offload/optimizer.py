"""Adam with its state in the slow tier, streamed through the fast tier in buckets (AxoNN / ZeRO-Offload).

The fp32 master weights and both Adam moments live in the slow tier. Buckets follow the order in
which backward produces gradients (last layer first). With in_backward (the default, as ZeRO-Offload
and AxoNN do) a bucket is updated as soon as its last gradient is accumulated, inside backward, and
its gradients are freed; bucket 0's copy-in starts when backward starts, bucket k+1's copy-in (3
reads) is issued before bucket k's update runs, and bucket k's copy-out (3 writes) right after it,
so the copies overlap backward compute and the other buckets' updates. Without in_backward the
same pipeline runs after backward, in the optimizer step. `staging_sets` staging buffers of the
largest bucket's size are the optimizer's whole fast-tier footprint (copy-ins run staging_sets - 1
buckets ahead); a staging set is reused only after its copy-out is confirmed, and the last
buckets' copy-outs are confirmed at the next step (they overlap that step's forward pass).

A bucket is a run of whole parameter tensors up to `bucket_bytes` of fp32 (a tensor larger than
that is a bucket of its own; `backward_buckets`, which zero_offload's buckets share). The update is
torch.optim.adam.adam, the functional form of torch.optim.Adam, on tensors of the same shapes with the
same foreach/fused setting as the in-memory baseline: element for element the same arithmetic, so
the weights are bit-identical. At bf16 / fp16 (precision.py) the parameters and gradients are in that
format: a bucket's gradients are cast up (and unscaled) for the update and its masters cast back into
the parameters, as the baseline's MasterAdam does.
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam as adam_functional

from hpcdl.studies.offload.accounting import FastTier
from hpcdl.studies.offload.precision import unscaled


def buckets_of(sizes: list[int], bucket_elems: int) -> list[list[int]]:
    out, cur, cur_n = [], [], 0
    for i, n in enumerate(sizes):
        if cur and cur_n + n > bucket_elems:
            out.append(cur)
            cur, cur_n = [], 0
        cur.append(i)
        cur_n += n
    if cur:
        out.append(cur)
    return out


def backward_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Parameter indices in buckets, in the order backward produces their gradients (the last layer's
    first), each up to `bucket_bytes` of fp32 (whole tensors)."""
    order = list(reversed(range(len(sizes))))
    return [[order[j] for j in b] for b in buckets_of([sizes[i] for i in order], max(1, bucket_bytes // 4))]


class OffloadedAdam:
    STATES = ("master", "exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params,
        tier,
        fast: FastTier,
        timeline,
        bucket_bytes: int,
        lr: float,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        foreach: bool = True,
        fused: bool = False,
        in_backward: bool = True,
        staging_sets: int = 3,
        loss_scale: float = 1.0,
    ):
        self.params = list(params)
        self.tier, self.fast, self.timeline = tier, fast, timeline
        self.hyper = dict(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay)
        self.foreach, self.fused = (False if fused else bool(foreach)), bool(fused)
        self.inv = 1.0 / loss_scale
        sizes = [p.numel() for p in self.params]
        # buckets in the order backward produces gradients: the last layer's first
        self.buckets = backward_buckets(sizes, bucket_bytes)
        self._bucket_of = {i: k for k, b in enumerate(self.buckets) for i in b}
        self._ready = [0] * len(self.buckets)
        self._next = 0
        if in_backward:
            for i, p in enumerate(self.params):
                p.register_post_accumulate_grad_hook(lambda p, i=i: self._grad_ready(i))
        largest = max(sum(sizes[i] for i in b) for b in self.buckets)
        dev = self.params[0].device
        # per parameter and state: its place in the slow tier
        self.slot = {
            (i, s): tier.reserve("optim", sizes[i] * 4) for i in range(len(sizes)) for s in self.STATES
        }
        tier.preallocate("optim")
        self.sets = max(2, staging_sets)
        self.staging = []
        for k in range(self.sets):
            flat = torch.empty(3, largest, dtype=torch.float32, device=dev)
            fast.track(flat, "optimizer_staging", f"optimizer staging set {k} (3 x {largest} fp32)")
            self.staging.append(flat)
        self.pending_out: list[list] = [[] for _ in range(self.sets)]
        self._incoming: dict[int, list] = {}
        # as torch.optim.Adam keeps them: fp32 scalars, on the device only for the fused kernel
        self.steps = [torch.tensor(0.0, device=dev if fused else "cpu") for _ in self.params]
        self._initialize()

    def _views(self, k: int, set_index: int):
        """Per parameter of bucket k: (master, exp_avg, exp_avg_sq) views into a staging set."""
        flat, off, out = self.staging[set_index], 0, []
        for i in self.buckets[k]:
            p = self.params[i]
            n = p.numel()
            out.append((i, *(flat[j, off : off + n].view(p.shape) for j in range(3))))
            off += n
        return out

    def _initialize(self) -> None:
        """Master = the initial weights, moments = 0, written to the slow tier before training."""
        for k in range(len(self.buckets)):
            for i, master, m, v in self._views(k, 0):
                master.copy_(self.params[i].detach().float())
                m.zero_()
                v.zero_()
                for name, t in zip(self.STATES, (master, m, v), strict=True):
                    self.tier.put(t, "optim", self.slot[(i, name)], "init").wait()
        self.tier.sync()

    def _copy_in(self, k: int) -> list:
        s = k % self.sets
        for t in self.pending_out[s]:  # the staging set is free once its copy-out is done
            t.wait()
        self.pending_out[s] = []
        return [
            self.tier.get(t, "optim", self.slot[(i, name)], "optimizer_in")
            for i, *ts in self._views(k, s)
            for name, t in zip(self.STATES, ts, strict=True)
        ]

    def _issue(self, k: int) -> None:
        if k < len(self.buckets) and k not in self._incoming:
            self._incoming[k] = self._copy_in(k)

    def prefetch(self) -> None:
        """Start the first buckets' copy-ins now (called when backward starts: they overlap it)."""
        if self._next == 0:
            for k in range(self.sets - 1):
                self._issue(k)

    def _grad_ready(self, i: int) -> None:
        """A gradient is final: update every bucket, in order, whose gradients are all final
        (ZeRO-Offload / AxoNN style: the optimizer runs inside backward, its copies overlap it)."""
        self._ready[self._bucket_of[i]] += 1
        while self._next < len(self.buckets) and self._ready[self._next] == len(self.buckets[self._next]):
            self._run_bucket(self._next)
            self._next += 1

    @torch.no_grad()
    def _run_bucket(self, k: int) -> None:
        self._issue(k)
        for t in self._incoming.pop(k):
            t.wait()
        self._issue(k + self.sets - 1)  # its staging set was bucket k-1's
        views = self._views(k, k % self.sets)
        with self.timeline.phase("optimizer_update", self.tier.compute_stream):
            idx = [v[0] for v in views]
            adam_functional(
                [v[1] for v in views],
                [unscaled(self.params[i].grad, self.inv) for i in idx],
                [v[2] for v in views],
                [v[3] for v in views],
                [],
                [self.steps[i] for i in idx],
                foreach=self.foreach,
                fused=self.fused,
                amsgrad=False,
                maximize=False,
                **self.hyper,
            )
            for i, master, _, _ in views:
                self.params[i].copy_(master)
                self.params[i].grad = None  # the gradient's fast-tier bytes are free from here
        self.pending_out[k % self.sets] += [
            self.tier.put(t, "optim", self.slot[(i, name)], "optimizer_out")
            for i, *ts in views
            for name, t in zip(self.STATES, ts, strict=True)
        ]

    def step(self) -> None:
        """Update the buckets backward has not updated (all of them when in_backward is off)."""
        while self._next < len(self.buckets):
            self._run_bucket(self._next)
            self._next += 1
        self._next, self._ready = 0, [0] * len(self.buckets)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def finish(self) -> None:
        for s in range(self.sets):
            for t in self.pending_out[s]:
                t.wait()
            self.pending_out[s] = []
