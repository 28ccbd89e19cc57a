"""ZeRO-Offload's design (Ren et al., arXiv 2101.06840): the parameters and their gradients in the
training precision on the fast tier; the fp32 master weights, Adam's moments and the optimizer step
on the host.

Per step:
    backward   as each bucket's gradients are final (post-accumulate-grad hooks; the buckets of
               OffloadedAdam: whole tensors in the order backward produces them), they are copied to
               a host buffer in the training precision (CUDA: pinned memory, on the device-to-host
               stream; CPU: on a copy thread). Once a bucket's copy is confirmed its fast-tier
               gradients are freed (CUDA: at once, the copy stream holding their memory; CPU: when
               the bucket `grad_window` places later is issued, or at the step).
    step       per bucket, on the host: wait for its gradients, cast them up to fp32 and unscale
               them, run torch.optim.Adam on its fp32 masters (torch's CPU `fused` kernel, or
               `foreach` / for-loop: `host_adam`), then cast the masters down into a host buffer of
               the training precision (CUDA) and copy them into the parameters (CUDA: on the
               host-to-device stream; CPU: on a copy thread), overlapping the next bucket's update.
               Before the step returns the compute stream (CUDA) or the training thread (CPU) waits
               for every copy back: the next forward reads the parameters.

The fast tier holds the parameters and at most a few buckets of gradients: about 2 bytes a
parameter in bf16 / fp16 (4 in fp32), against 16 for `none` at fp32 and 18 in its mixed precision.

The host: on CUDA, host memory (moments and masters pageable, the two copy buffers pinned); on CPU,
where the fast tier is the process's anonymous memory, a shared mapping of files in the slow tier's
run directory (page-cache memory, which the measured peak, the anonymous RSS, leaves out as it
leaves out the slow tier's files). Under `io_mode: dontneed` every step's end writes the mapping back
and drops its pages, so the next step's update reads them from the device.
"""

from __future__ import annotations

import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from hpcdl.studies.offload.optimizer import backward_buckets
from hpcdl.studies.offload.slowtier import FileTier, Ticket

HOST_ADAM = ("fused", "foreach", "forloop")


class MappedHost:
    """CPU: host buffers as shared mappings of files in the FileTier's run directory; copies on two
    threads (gradients in, parameters out), timed on the timeline's lanes."""

    cuda = False
    compute_stream = None

    def __init__(self, tier: FileTier):
        self.tier, self.timeline = tier, tier.timeline
        self._maps: list[tuple[int, mmap.mmap]] = []
        self._in = ThreadPoolExecutor(1, thread_name_prefix="zero-grads-to-host")
        self._out = ThreadPoolExecutor(1, thread_name_prefix="zero-params-to-fast")

    def zeros(self, name: str, n: int, dtype: torch.dtype, pinned: bool = False) -> torch.Tensor:
        nbytes = n * torch.empty(0, dtype=dtype).element_size()
        fd = os.open(self.tier.dir / f"host-{name}.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, nbytes)  # zeros; a full device fails here, before training
            mm = mmap.mmap(fd, nbytes)
        except OSError as exc:
            os.close(fd)
            raise self.tier._error(exc, f"reserving {nbytes} bytes of zero_offload host state") from exc
        self._maps.append((fd, mm))
        return torch.frombuffer(mm, dtype=dtype)

    def _submit(self, pool, lane: str, kind: str, pairs: list, nbytes: int) -> Ticket:
        log = self.timeline.current  # the issuing step's log

        def job():
            start = time.perf_counter()
            with torch.no_grad():  # a parameter is a leaf that requires grad
                for dst, src in pairs:
                    dst.copy_(src)
            if log is not None:
                log.add(lane, kind, start, time.perf_counter(), nbytes)

        return Ticket(self, pool.submit(job), kind=kind)

    def to_host(self, pairs: list, kind: str, nbytes: int) -> Ticket:
        return self._submit(self._in, "to_slow", kind, pairs, nbytes)

    def to_fast(self, pairs: list, kind: str, nbytes: int) -> Ticket:
        return self._submit(self._out, "from_slow", kind, pairs, nbytes)

    def host_wait(self, ticket: Ticket) -> None:
        ticket.wait()

    def end_step(self) -> None:
        if self.tier.io_mode != "dontneed":
            return
        for fd, mm in self._maps:
            mm.flush()
            mm.madvise(mmap.MADV_DONTNEED)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        for pool in (self._in, self._out):
            pool.shutdown(wait=True)
        for fd, mm in self._maps:
            try:
                mm.close()
            except BufferError:  # a tensor still views it: unmapped when that tensor dies
                pass
            os.close(fd)
        self._maps = []


class PinnedHost:
    """CUDA: host buffers in host memory (the copy buffers pinned); copies on the PinnedTier's
    device-to-host and host-to-device streams."""

    cuda = True

    def __init__(self, tier):
        self.tier, self.timeline = tier, tier.timeline
        self.compute_stream, self.d2h, self.h2d = tier.compute_stream, tier.d2h, tier.h2d

    def zeros(self, name: str, n: int, dtype: torch.dtype, pinned: bool = False) -> torch.Tensor:
        return torch.zeros(n, dtype=dtype, pin_memory=pinned)

    def _copy(self, stream, lane: str, kind: str, pairs: list, nbytes: int, record: bool) -> Ticket:
        clock = self.timeline.clock
        stream.wait_stream(self.compute_stream)  # what it reads or overwrites is the compute stream's
        with torch.cuda.stream(stream), torch.no_grad():
            start = clock.mark(stream)
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
                if record:
                    src.record_stream(stream)  # freed by the caller: kept until this copy is done
            end = clock.mark(stream)
        self.timeline.add(lane, kind, start, end, nbytes)
        return Ticket(self, event=end, kind=kind)

    def to_host(self, pairs: list, kind: str, nbytes: int) -> Ticket:
        return self._copy(self.d2h, "to_slow", kind, pairs, nbytes, record=True)

    def to_fast(self, pairs: list, kind: str, nbytes: int) -> Ticket:
        return self._copy(self.h2d, "from_slow", kind, pairs, nbytes, record=False)

    def host_wait(self, ticket: Ticket) -> None:
        """The host reads what a device-to-host copy wrote: the CPU waits for it (the compute stream
        idles meanwhile: recorded on the wait lane)."""
        if ticket.done:
            return
        clock = self.timeline.clock
        start = clock.mark(self.compute_stream)
        ticket.event.synchronize()
        self.timeline.add("wait", ticket.kind, start, clock.mark(self.compute_stream))
        ticket.keep, ticket.done = None, True

    def end_step(self) -> None:
        pass

    def close(self) -> None:
        pass


class ZeroOffloadAdam:
    def __init__(
        self,
        params,
        tier,
        fast,
        timeline,
        bucket_bytes: int,
        lr: float,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        host_adam: str = "fused",
        loss_scale: float = 1.0,
        grad_window: int = 2,
    ):
        if host_adam not in HOST_ADAM:
            raise ValueError(f"config key 'offload.zero_offload.host_adam': {host_adam!r} is not allowed; "
                             f"allowed: {', '.join(HOST_ADAM)}")
        self.params = list(params)
        self.fast, self.timeline = fast, timeline
        self.host = MappedHost(tier) if isinstance(tier, FileTier) else PinnedHost(tier)
        self.inv, self.window = 1.0 / loss_scale, max(1, grad_window)
        dtype = self.params[0].dtype
        sizes = [p.numel() for p in self.params]
        self.buckets = backward_buckets(sizes, bucket_bytes)
        self._bucket_of = {i: k for k, b in enumerate(self.buckets) for i in b}
        self.offset = [sum(sizes[:i]) for i in range(len(sizes))]
        # a bucket is a run of consecutive parameters: one contiguous range of the flat host buffers
        self.span = [(self.offset[min(b)], self.offset[max(b)] + sizes[max(b)]) for b in self.buckets]
        n = sum(sizes)
        z = self.host.zeros
        try:
            self.master, self.exp_avg, self.exp_avg_sq, self.grad32 = (
                z(name, n, torch.float32) for name in ("master", "exp_avg", "exp_avg_sq", "grad32"))
            self.grad_low = z("grads", n, dtype, pinned=True)  # where the gradients land
            # CUDA: the masters cast down on the host, then copied up (ZeRO-Offload moves 16-bit parameters)
            self.param_low = z("params", n, dtype, pinned=True) if self.host.cuda else None
        except BaseException:  # a full slow-tier directory: unmap what was mapped, then say so
            self.host.close()
            raise
        with torch.no_grad():
            for i, p in enumerate(self.params):
                self._view(self.master, i).copy_(p.detach().reshape(-1))
        self.opts = []
        for b in self.buckets:
            masters = [self._view(self.master, i).view(self.params[i].shape) for i in b]
            opt = torch.optim.Adam(masters, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                   foreach=host_adam == "foreach", fused=host_adam == "fused")
            for i, m in zip(b, masters, strict=True):
                m.grad = self._view(self.grad32, i).view(m.shape)  # filled in place each step
                # the moments in the host buffers (torch.optim.Adam would allocate them in the process)
                opt.state[m] = {"step": torch.tensor(0.0, dtype=torch.float32),
                                "exp_avg": self._view(self.exp_avg, i).view(m.shape),
                                "exp_avg_sq": self._view(self.exp_avg_sq, i).view(m.shape)}
            self.opts.append((opt, masters))
        self._reset()
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._grad_ready(i))

    def _view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        return flat[self.offset[i] : self.offset[i] + self.params[i].numel()]

    def _reset(self) -> None:
        self._ready = [0] * len(self.buckets)
        self._issued = 0
        self._out: dict[int, tuple] = {}  # bucket -> (ticket, pairs) of its gradients' copy

    # ------------------------------------------------------------------ backward: gradients to the host
    def _grad_ready(self, i: int) -> None:
        self._ready[self._bucket_of[i]] += 1
        b = self.buckets
        while self._issued < len(b) and self._ready[self._issued] == len(b[self._issued]):
            self._copy_out(self._issued)
            self._issued += 1

    def _copy_out(self, k: int) -> None:
        b = self.buckets[k]
        pairs = [(self._view(self.grad_low, i), self.params[i].grad.reshape(-1)) for i in b]
        nbytes = sum(g.numel() * g.element_size() for _, g in pairs)
        self._out[k] = (self.host.to_host(pairs, "gradients", nbytes), pairs)
        if self.host.cuda:  # the copy stream keeps their memory until the copy is done
            pairs.clear()
            for i in b:
                self.params[i].grad = None
        elif k >= self.window:
            self._confirm(k - self.window)

    def _confirm(self, k: int) -> None:
        """Bucket k's gradients are on the host: free them in the fast tier (a fixed program point,
        so the registry's peak does not depend on copy timing)."""
        ticket, pairs = self._out[k]
        self.host.host_wait(ticket)
        pairs.clear()
        for i in self.buckets[k]:
            self.params[i].grad = None

    # ------------------------------------------------------------------ the step, on the host
    @torch.no_grad()
    def step(self) -> None:
        back = []
        for k in range(len(self.buckets)):
            if k not in self._out:  # backward's hooks issue every bucket's copy; one missing is a bug
                raise RuntimeError(f"zero_offload: bucket {k}'s gradients never arrived")
            self._confirm(k)
            lo, hi = self.span[k]
            with self.timeline.phase("optimizer_update", self.host.compute_stream):
                g = self.grad32[lo:hi]
                g.copy_(self.grad_low[lo:hi])
                if self.inv != 1.0:
                    g.mul_(self.inv)
                opt, masters = self.opts[k]
                opt.step()
                if self.host.cuda:
                    self.param_low[lo:hi].copy_(self.master[lo:hi])  # cast on the host
                    src = self.param_low
                else:
                    src = self.master  # the copy thread casts as it copies
            pairs = [(self.params[i].view(-1), self._view(src, i)) for i in self.buckets[k]]
            nbytes = sum(p.numel() * p.element_size() for p, _ in pairs)
            back.append(self.host.to_fast(pairs, "parameters", nbytes))
        for t in back:  # ahead of the next forward
            t.wait()
        self.host.end_step()
        self._reset()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def finish(self) -> None:
        pass

    def close(self) -> None:
        """Drop every view of the host buffers, then unmap them."""
        self.opts = []
        self.master = self.exp_avg = self.exp_avg_sq = self.grad32 = self.grad_low = self.param_low = None
        self.host.close()
