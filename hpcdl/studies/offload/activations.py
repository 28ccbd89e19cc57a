"""Activations saved for backward: accounted in the fast tier, or offloaded to the slow tier.

Both modes hook `torch.autograd.graph.saved_tensors_hooks`. Parameters that autograd saves (a
Linear's weight) are returned untouched: they are already resident and charged as parameters.

    keep      the saved tensor stays in the fast tier, charged from pack until autograd drops it
    offload   pack queues a copy to the slow tier and returns an index. The fast copy is charged
              until its write is confirmed, which happens `write_window` packs later (or never for
              the last `write_window` tensors of the forward pass: backward needs them first, so
              they are used straight from memory, as offload libraries keep the last layers).
              Unpack of tensor i waits for its prefetch and starts reading the next
              `prefetch_depth` tensors backward will ask for (i-1, i-2, ...), each into a fresh
              fast-tier buffer charged from the moment the read is issued.
Charges and releases happen at program points that do not depend on transfer timing, so the
accounted peak is the same number in every run.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from hpcdl.studies.offload.accounting import FastTier


@dataclass
class _Saved:
    shape: torch.Size
    dtype: torch.dtype
    nbytes: int
    offset: int
    uses: int = 1
    write: object = None  # Ticket of the copy to the slow tier
    fast: object = None  # the fast copy while its write is unconfirmed
    read: object = None  # Ticket of the prefetch
    buffer: object = None  # the prefetched fast buffer


class SavedActivations:
    def __init__(
        self,
        fast: FastTier,
        params,
        tier=None,
        offload: bool = False,
        prefetch_depth: int = 2,
        write_window: int = 2,
        device: str = "cpu",
    ):
        self.fast, self.tier, self.offload = fast, tier, offload
        self.prefetch_depth, self.write_window, self.device = prefetch_depth, write_window, device
        self._param_ptrs = {p.data_ptr() for p in params}
        self.begin_step()

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def begin_step(self) -> None:
        self.saved: list[_Saved] = []
        self._index_of_ptr: dict[tuple, tuple] = {}
        self._kept: dict[int, list] = {}
        if self.tier is not None:
            self.tier.reset_scratch()

    # ----------------------------------------------------------------- pack
    def _pack(self, t: torch.Tensor):
        if t.data_ptr() in self._param_ptrs:
            return ("param", t)
        return self._pack_offload(t) if self.offload else self._pack_keep(t)

    def _pack_keep(self, t):
        ptr, n = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        entry = self._kept.get(ptr)
        if entry is None:  # one charge per storage however often it is saved
            self.fast.charge(n, "activations", f"saved activation {tuple(t.shape)}")
            entry = self._kept[ptr] = [0, n]
        entry[0] += 1
        return ("kept", t, _Release(self, ptr))

    def _pack_offload(self, t):
        key = (t.data_ptr(), tuple(t.shape), t.dtype, t._version)
        known = self._index_of_ptr.get(key)
        # the same live tensor saved by two nodes: one copy (a dead one's address may be reused)
        if known is not None and known[1]() is not None:
            self.saved[known[0]].uses += 1
            return ("slow", known[0])
        i = len(self.saved)
        n = t.numel() * t.element_size()
        self.fast.charge(n, "activations", f"activation {tuple(t.shape)} awaiting its write")
        off = self.tier.reserve("acts", n)
        s = _Saved(t.shape, t.dtype, n, off, write=self.tier.put(t, "acts", off, "activation"), fast=t)
        self.saved.append(s)
        self._index_of_ptr[key] = (i, weakref.ref(t))
        if i >= self.write_window:
            self._confirm(i - self.write_window)
        return ("slow", i)

    def _confirm(self, i: int) -> None:
        s = self.saved[i]
        if s.fast is not None:
            s.write.wait()
            s.fast = None
            self.fast.release(s.nbytes, "activations")

    # ---------------------------------------------------------------- unpack
    def _unpack(self, packed):
        kind = packed[0]
        if kind in ("param", "kept"):
            return packed[1]
        i = packed[1]
        s = self.saved[i]
        if s.fast is not None:  # never confirmed written: still in memory (and charged)
            out = s.fast
        else:
            self._prefetch(i)
            s.read.wait()
            out = s.buffer
        for j in range(i - 1, max(-1, i - 1 - self.prefetch_depth), -1):
            self._prefetch(j)
        s.uses -= 1
        if s.uses == 0:  # autograd holds the last reference from here on
            s.buffer = None
        return out

    def _prefetch(self, j: int) -> None:
        s = self.saved[j]
        if s.fast is not None or s.read is not None:
            return
        buf = self.tier.empty(s.shape, s.dtype)
        self.fast.track(buf, "activations", f"prefetched activation {tuple(s.shape)}")
        s.buffer, s.read = buf, self.tier.get(
            buf, "acts", s.offset, "activation", after_compute=False, after=s.write
        )

    def end_step(self) -> None:
        """Wait for every write (the next step reuses the scratch) and uncharge the tensors that were
        never confirmed written (held by their write until now)."""
        for s in self.saved:
            if s.write is not None:
                s.write.wait()
            if s.fast is not None:
                s.fast = None
                self.fast.release(s.nbytes, "activations")
        self.saved = []


class _Release:
    """Released (by refcount) when autograd drops the packed tuple: uncharges a kept activation."""

    def __init__(self, owner: SavedActivations, ptr: int):
        self.owner, self.ptr = owner, ptr

    def __del__(self):
        entry = self.owner._kept.get(self.ptr)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            del self.owner._kept[self.ptr]
            self.owner.fast.release(entry[1], "activations")
