"""A depth-partitioned conv3d whose halo exchange is hidden behind compute.

Stride-1 'same' convs (the study's) use a halo correction: post the exchange, run the whole
slab's conv zero-padded (one full-size call, exactly the ceiling run's work) while it is in
flight, wait, then add a thin conv of the halo planes to the edge output planes. Other convs
split: the output planes that read no halo plane compute while the exchange is in flight, then
the boundary planes. In the backward the same holds in reverse: the thin (boundary) convs'
backward runs first (autograd runs the most recently created node first), their halo gradients
are posted to the owners at once, the big conv's backward runs while they travel, and only then
does this rank wait for the gradients of the planes it sent.

Two autograd Functions share one `_Halo` state per call: `_Post` (identity on x; forward posts,
backward waits for the returned gradients and adds them) and `_Wait` (forward waits for the
halo planes; backward posts their gradients). The same sums as the blocking path up to the
order of additions, so the float64 exactness checks hold. On a GPU the halo planes and their
gradients live on the rank's GPU; hpcdl.studies.spatial.halo's post/wait move them over its backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hpcdl.studies.spatial.halo import Line, Posted, post, wait
from hpcdl.studies.spatial.partition import AxisPlan


class _Halo:
    """One exchange's plan, peers and in-flight works, shared by its _Post and _Wait nodes."""

    def __init__(self, plan: AxisPlan, line: Line, dim: int, tag: int):
        self.ex, self.line, self.dim, self.tag = plan.exchange(line.index), line, dim, tag
        self.fwd: Posted | None = None
        self.bwd: Posted | None = None  # posted by _Wait.backward (or _Post.backward where no halo came)
        self.halo: dict = {}
        self.back: dict = {}

    def _shape(self, x: torch.Tensor, n: int) -> list[int]:
        s = list(x.shape)
        s[self.dim] = n
        return s

    def post_forward(self, x: torch.Tensor) -> None:
        ex, line, dim = self.ex, self.line, self.dim
        recvs, sends = [], []
        for side, peer in (("l", line.left()), ("r", line.right())):
            if ex[f"recv_{side}"]:
                shape = self._shape(x, ex[f"recv_{side}"])
                self.halo[side] = torch.empty(shape, dtype=x.dtype, device=x.device)
                recvs.append((self.halo[side], peer))
        if ex["send_l"]:
            sends.append((x.narrow(dim, 0, ex["send_l"]).contiguous(), line.left()))
        if ex["send_r"]:
            edge = x.narrow(dim, x.shape[dim] - ex["send_r"], ex["send_r"])
            sends.append((edge.contiguous(), line.right()))
        self.fwd = post(sends, recvs, self.tag)

    def post_backward(self, grads: dict, like: torch.Tensor) -> None:
        ex, line = self.ex, self.line
        sends = [(grads[s].contiguous(), peer) for s, peer in (("l", line.left()), ("r", line.right()))
                 if s in grads]
        recvs = []
        for side, peer in (("l", line.left()), ("r", line.right())):
            if ex[f"send_{side}"]:
                self.back[side] = torch.empty(self._shape(like, ex[f"send_{side}"]), dtype=like.dtype,
                                              device=like.device)
                recvs.append((self.back[side], peer))
        self.bwd = post(sends, recvs, self.tag + 1)


class _Post(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, st: _Halo):
        ctx.st = st
        st.post_forward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        st = ctx.st
        if st.bwd is None:  # no halo received here (so _Wait had no gradient): only receive
            st.post_backward({}, grad)
        wait(st.bwd)  # the gradients of the planes this rank sent, posted by _Wait.backward
        if st.back:
            # in place: autograd's own fresh buffer of the convs' input gradients (_Wait gives x none)
            n = grad.shape[st.dim]
            if "l" in st.back:
                grad.narrow(st.dim, 0, st.ex["send_l"]).add_(st.back["l"])
            if "r" in st.back:
                grad.narrow(st.dim, n - st.ex["send_r"], st.ex["send_r"]).add_(st.back["r"])
        st.fwd, st.bwd = None, None
        st.halo, st.back = {}, {}
        return grad, None


class _Wait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, st: _Halo):
        ctx.st = st
        wait(st.fwd)
        return (st.halo["l"] if "l" in st.halo else x.new_empty(st._shape(x, 0)),
                st.halo["r"] if "r" in st.halo else x.new_empty(st._shape(x, 0)))

    @staticmethod
    def backward(ctx, grad_l, grad_r):
        st = ctx.st
        grads = {}
        if "l" in st.halo:
            grads["l"] = grad_l if grad_l is not None else torch.zeros_like(st.halo["l"])
        if "r" in st.halo:
            grads["r"] = grad_r if grad_r is not None else torch.zeros_like(st.halo["r"])
        like = grad_l if grad_l is not None else grad_r
        st.post_backward(grads, like if like is not None else st.halo.get("l", st.halo.get("r")))
        return None, None


def interior_split(ex: dict, n_keep: int, kernel: int, stride: int) -> tuple[int, int, int, int] | None:
    """(a, j_lo, j_hi, n_out) of the window [zeros/halo_l | keep | halo/zeros_r]: outputs j_lo..j_hi
    read only kept planes; None where no output does (thin slab: the blocking path runs)."""
    a = ex["zeros_l"] + ex["recv_l"]
    width = a + n_keep + ex["recv_r"] + ex["zeros_r"]
    n_out = (width - kernel) // stride + 1
    j_lo = -(-a // stride)
    j_hi = (a + n_keep - kernel) // stride
    if j_hi < j_lo or (j_hi + 1) * stride < a:
        return None
    return a, j_lo, j_hi, n_out


def _corrects(ex: dict, n: int, kernel: int, stride: int, pad: int) -> bool:
    """A stride-1 'same' conv whose window is [pad halo/zero planes | the whole slab | pad planes]."""
    return (stride == 1 and 2 * pad == kernel - 1 and ex["keep"] == (0, n)
            and ex["zeros_l"] + ex["recv_l"] == pad and ex["zeros_r"] + ex["recv_r"] == pad)


def _edge_conv(halo: torch.Tensor, taps: torch.Tensor, depth_pad: tuple[int, int], pad: int) -> torch.Tensor:
    """The halo planes' share of the `pad` edge output planes: a conv of the halo, zero-padded in
    depth to 2 * pad - 1 planes, with the kernel taps that reach it."""
    return F.conv3d(F.pad(halo, (0, 0, 0, 0, *depth_pad)), taps, None, padding=(0, pad, pad))


def corrected_conv3d(x: torch.Tensor, weight, bias, pad: int, plan: AxisPlan, line: Line,
                     tag: int) -> torch.Tensor:
    """Stride-1 'same' conv3d of a depth slab, its halo exchange hidden behind the whole slab's conv.

    The conv is linear in its input, so conv(window) = conv(slab zero-padded, as on one rank or in
    the ceiling run) + conv(halo planes alone). The first term is one full-size call, made while
    the halo travels; the second touches only the `pad` edge planes of the output and costs a thin
    conv per side. No interior/boundary split, no concatenation of partial outputs."""
    dim = 2
    ex = plan.exchange(line.index)
    st = _Halo(plan, line, dim, tag)
    xp = _Post.apply(x, st)
    out = F.conv3d(xp, weight, bias, padding=pad)
    halo_l, halo_r = _Wait.apply(xp, st)
    # output plane j < pad reads left halo planes j..pad-1 through kernel taps 0..pad-1; output
    # plane n-pad+j reads right halo planes 0..j through taps 2*pad-j..2*pad
    left = _edge_conv(halo_l, weight.narrow(dim, 0, pad), (0, pad - 1), pad) if ex["recv_l"] else None
    right = _edge_conv(halo_r, weight.narrow(dim, pad + 1, pad), (pad - 1, 0), pad) if ex["recv_r"] else None
    return _AddEdges.apply(out, left, right)


class _AddEdges(torch.autograd.Function):
    """out's first/last planes += left/right, in place; the backward hands the gradient on uncopied
    (autograd's own in-place add would clone the whole output's gradient) and runs before the
    conv's, so the halo gradients leave early."""

    @staticmethod
    def forward(ctx, out, left, right):
        ctx.mark_dirty(out)
        ctx.sizes = (0 if left is None else left.shape[2], 0 if right is None else right.shape[2])
        if left is not None:
            out.narrow(2, 0, left.shape[2]).add_(left)
        if right is not None:
            out.narrow(2, out.shape[2] - right.shape[2], right.shape[2]).add_(right)
        return out

    @staticmethod
    def backward(ctx, grad):
        nl, nr = ctx.sizes
        return (grad, grad.narrow(2, 0, nl) if nl else None,
                grad.narrow(2, grad.shape[2] - nr, nr) if nr else None)


def overlapped_conv3d(x: torch.Tensor, weight, bias, stride: int, pad: int, plan: AxisPlan, line: Line,
                      tag: int, blocking) -> torch.Tensor:
    """Conv3d of a depth slab (dim 2; height and width unpartitioned, padded by the conv) with its halo
    exchange hidden behind compute: by a halo correction for stride-1 'same' convs, else by an
    interior/boundary split; `blocking()` is the fallback for thin slabs."""
    dim, k = 2, weight.shape[2]
    ex = plan.exchange(line.index)
    if _corrects(ex, x.shape[dim], k, stride, pad):
        return corrected_conv3d(x, weight, bias, pad, plan, line, tag)
    lo, hi = ex["keep"]
    split = interior_split(ex, hi - lo, k, stride)
    if split is None:
        return blocking()
    a, j_lo, j_hi, n_out = split
    conv = dict(stride=stride, padding=(0, pad, pad))
    st = _Halo(plan, line, dim, tag)
    xp = _Post.apply(x, st)
    keep = xp.narrow(dim, lo, hi - lo)
    interior = F.conv3d(keep.narrow(dim, j_lo * stride - a, (j_hi - j_lo) * stride + k), weight, bias, **conv)
    halo_l, halo_r = _Wait.apply(xp, st)
    parts = []
    if j_lo > 0:  # outputs reading the left halo (or the zero padding at the global edge)
        left = halo_l if ex["recv_l"] else x.new_zeros(st._shape(x, ex["zeros_l"]))
        parts.append(F.conv3d(torch.cat([left, keep.narrow(dim, 0, (j_lo - 1) * stride + k - a)], dim),
                              weight, bias, **conv))
    parts.append(interior)
    if j_hi + 1 < n_out:
        start = (j_hi + 1) * stride - a
        right = halo_r if ex["recv_r"] else x.new_zeros(st._shape(x, ex["zeros_r"]))
        parts.append(F.conv3d(torch.cat([keep.narrow(dim, start, hi - lo - start), right], dim),
                              weight, bias, **conv))
    return torch.cat(parts, dim) if len(parts) > 1 else parts[0]
