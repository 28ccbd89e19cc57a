"""The CUDA path's two tiers: the GPU's own memory (fast) and pinned host memory mapped into the
GPU's address space (slow, zero-copy), and the check that the slow tier really is host memory."""

from __future__ import annotations


class _Mapped:
    """A pinned host tensor exposed to CUDA as a device array (zero-copy)."""

    _TYPESTR = {"torch.float32": "<f4", "torch.float64": "<f8", "torch.int64": "<i8", "torch.int32": "<i4"}

    def __init__(self, host):
        self._host = host  # keeps the pinned buffer alive as long as the view
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape),
            "typestr": self._TYPESTR[str(host.dtype)],
            "data": (host.data_ptr(), False),
            "version": 3,
            "strides": None,
        }


def place(values, fast: bool, dev):
    """`values` (a CPU tensor) in device memory, or in pinned host memory viewed from the GPU."""
    import torch

    if fast:
        return values.to(dev)
    host = values.contiguous().pin_memory()
    view = torch.as_tensor(_Mapped(host), device=dev)
    view._hetmem_host = host  # noqa: SLF001 - the view must not outlive its pinned buffer
    return view


def check_zero_copy(dev) -> bool:
    """The slow tier really is host memory: a GPU write through the view is seen by the host, with
    no copy, and the view's address is the pinned buffer's."""
    import torch

    v = place(torch.zeros(1024), False, dev)
    v.add_(3.0)
    torch.cuda.synchronize(dev)
    host = v._hetmem_host  # noqa: SLF001
    return bool(v.is_cuda and v.data_ptr() == host.data_ptr() and (host == 3.0).all())
