"""Adam with its state in the slow tier, streamed through the fast tier in buckets (AxoNN / ZeRO-Offload).

The fp32 master weights and both Adam moments live in the slow tier. A step walks the buckets in
order; bucket k+1's copy-in (3 reads) is issued before bucket k's update runs, and bucket k's
copy-out (3 writes) is issued right after it, so the copies of one bucket overlap the update of
the next. Two staging sets (double buffering) of the largest bucket's size are the optimizer's
whole fast-tier footprint; a staging set is reused only after its copy-out is confirmed, and the
last buckets' copy-outs are confirmed at the next step (they overlap that step's forward pass).

A bucket is a run of whole parameter tensors up to `bucket_bytes` of fp32 (a tensor larger than
that is a bucket of its own). The update is torch.optim.adam.adam, the functional form of
torch.optim.Adam, on tensors of the same shapes with the same foreach/fused setting as the
in-memory baseline: element for element the same arithmetic, so the weights are bit-identical.
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam as adam_functional

from hpcdl.offload.accounting import FastTier


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


class OffloadedAdam:
    STATES = ("master", "exp_avg", "exp_avg_sq")

    def __init__(self, params, tier, fast: FastTier, timeline, bucket_bytes: int, lr: float,
                 betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0, foreach: bool = True,
                 fused: bool = False):
        self.params = list(params)
        self.tier, self.fast, self.timeline = tier, fast, timeline
        self.hyper = dict(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay)
        self.foreach, self.fused = (False if fused else bool(foreach)), bool(fused)
        sizes = [p.numel() for p in self.params]
        self.buckets = buckets_of(sizes, max(1, bucket_bytes // 4))
        largest = max(sum(sizes[i] for i in b) for b in self.buckets)
        dev = self.params[0].device
        # per parameter and state: its place in the slow tier
        self.slot = {(i, s): tier.reserve("optim", sizes[i] * 4) for i in range(len(sizes)) for s in self.STATES}
        tier.preallocate("optim")
        self.staging = []
        for k in range(2):
            flat = torch.empty(3, largest, dtype=torch.float32, device=dev)
            fast.track(flat, "optimizer_staging", f"optimizer staging set {k} (3 x {largest} fp32)")
            self.staging.append(flat)
        self.pending_out: list[list] = [[], []]
        self._incoming = None
        # as torch.optim.Adam keeps them: fp32 scalars, on the device only for the fused kernel
        self.steps = [torch.tensor(0.0, device=dev if fused else "cpu") for _ in self.params]
        self._initialize()

    def _views(self, k: int, set_index: int):
        """Per parameter of bucket k: (master, exp_avg, exp_avg_sq) views into a staging set."""
        flat, off, out = self.staging[set_index], 0, []
        for i in self.buckets[k]:
            p = self.params[i]
            n = p.numel()
            out.append((i, *(flat[j, off:off + n].view(p.shape) for j in range(3))))
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
        s = k % 2
        for t in self.pending_out[s]:           # the staging set is free once its copy-out is done
            t.wait()
        self.pending_out[s] = []
        return [self.tier.get(t, "optim", self.slot[(i, name)], "optimizer_in")
                for i, *ts in self._views(k, s) for name, t in zip(self.STATES, ts, strict=True)]

    def prefetch(self) -> None:
        """Start bucket 0's copy-in now (called when backward starts: it overlaps backward)."""
        if self._incoming is None:
            self._incoming = self._copy_in(0)

    @torch.no_grad()
    def step(self) -> None:
        tl = self.timeline
        self.prefetch()
        incoming, self._incoming = self._incoming, None
        for k in range(len(self.buckets)):
            for t in incoming:
                t.wait()
            if k + 1 < len(self.buckets):
                incoming = self._copy_in(k + 1)
            views = self._views(k, k % 2)
            with tl.phase("optimizer_update", self.tier.compute_stream):
                idx = [v[0] for v in views]
                adam_functional([v[1] for v in views], [self.params[i].grad.float() for i in idx],
                                [v[2] for v in views], [v[3] for v in views], [], [self.steps[i] for i in idx],
                                foreach=self.foreach, fused=self.fused, amsgrad=False, maximize=False,
                                **self.hyper)
                for i, master, _, _ in views:
                    self.params[i].copy_(master)
            self.pending_out[k % 2] += [self.tier.put(t, "optim", self.slot[(i, name)], "optimizer_out")
                                        for i, *ts in views for name, t in zip(self.STATES, ts, strict=True)]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def finish(self) -> None:
        for s in (0, 1):
            for t in self.pending_out[s]:
                t.wait()
            self.pending_out[s] = []
