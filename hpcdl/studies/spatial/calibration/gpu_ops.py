"""The timed work of the GPU calibration's items (hpcdl.studies.spatial.calibration.gpu), one item at a time.

Each layer item runs as the partitioned model runs it on a rank: the conv on its halo'd window (the
local output planes plus the halo planes on a split axis, zero padding on the others) with bias and
LeakyReLU, pool, transposed conv, dense (+ LeakyReLU); forward and backward timed apart (CUDA events
on a GPU, the host clock on the CPU). Halo: a side's planes copied into a contiguous send buffer and
a received buffer copied into the halo'd input. Face: that send buffer copied to pinned host memory
(forward column) and a received one copied from pinned host memory into the device (backward column).
Correction: the thin edge conv of overlap.py. The optimizer: zero_grad + Adam over the network's
parameter tensors. Fixed: a minimal layer of a kind (slabs.minimal_layer), `alone` timed exactly as a
layer item, `chained` CHAIN of them issued in one timed call (their forwards, then one backward over
all, as a step issues its layers) and divided by CHAIN. A step: one whole one-GPU training step on a
slab, every layer on the input shape its layer item has (the conv on its window, zero halo planes
padded on the split axes; pools rounding up and transposed convs cut to the planes the oracle charges,
so a split the papers' largest counts make, where a plain pass would thin a layer to nothing, runs
too), the dense head on the gathered size, loss, backward, Adam: the measurement claim compute_term
compares with the oracle's sum of the same layers.

An item's tensors are made once; its first call is untimed (on CUDA with cudnn.benchmark it runs
cuDNN's algorithm search for every conv shape not met before, so its wall time is recorded apart as
search_s), then its repeats run back to back. Leaf gradients are dropped before every call so each
backward writes fresh gradients, as the first one did, instead of adding into the last call's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hpcdl.studies.spatial.calibration.compute_timings import optimizer_step_fn
from hpcdl.studies.spatial.perfmodel import slabs

LEAK = 0.2


class Clock:
    """Forward / backward seconds of a call: CUDA events on a GPU, the host clock on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        return b - a

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


@dataclass
class Op:
    fn: object
    backward: bool
    leaves: list = field(default_factory=list)
    grad_out: object = None  # a tensor, or a list of them where fn returns a list
    second: object = None  # timed as the backward column where the item has no autograd backward
    per: int = 1  # layers one call runs (a chained fixed-cost item): the times are divided by it


class _Tensors:
    """Random tensors on one device; remembers those that collect a gradient."""

    def __init__(self, dev):
        self.dev, self.leaves = dev, []

    def __call__(self, shape, grad=False):
        t = torch.randn(*shape, device=self.dev, requires_grad=grad)
        if grad:
            self.leaves.append(t)
        return t


def _layer_fn(it: dict, r: _Tensors):
    """Forward closure of a layer item on its local shapes (input gradient wanted except for the data)."""
    L, b = it["layer"], it["batch"]
    kind = L["kind"]
    if kind == "dense":
        x, w, bias = r((b, L["fin"]), True), r((L["fout"], L["fin"]), True), r((L["fout"],), True)
        return lambda: F.leaky_relu(F.linear(x, w, bias), LEAK) if L.get("act") else F.linear(x, w, bias)
    c, _, _, w_in = L["in"]
    d, h = it["d"], it["h"]
    first = L["in"][0] == L.get("cin", -1) and L["name"] in ("conv0", "enc0a")
    if kind == "pool":
        s = L["stride"]
        x = r((b, c, d * s, h * s, w_in), True)
        return lambda: F.max_pool3d(x, L["kernel"], s)
    if kind == "deconv":
        s = L["stride"]
        x = r((b, L["cin"], max(1, d // s), max(1, h // s), w_in), True)
        wt = r((L["cin"], L["cout"], L["kernel"], *(L["kernel"],) * 2), True)
        bias = r((L["cout"],), True)
        return lambda: F.conv_transpose3d(x, wt, bias, stride=s)
    k, p = L["kernel"], L["pad"]
    # split axes carry the halo planes in the input (no padding there), the others the conv's padding
    dd = d + 2 * p if it["split_d"] else d
    hh = h + 2 * p if it["split_h"] else h
    x = r((b, c, dd, hh, w_in), not first)
    wt, bias = r((L["cout"], c, k, k, k), True), r((L["cout"],), True)
    pad = (0 if it["split_d"] else p, 0 if it["split_h"] else p, p)
    return lambda: F.leaky_relu(F.conv3d(x, wt, bias, padding=pad), LEAK)


def _correction_fn(it: dict, r: _Tensors):
    L, b = it["layer"], it["batch"]
    p, k = L["pad"], L["kernel"]
    halo = r((b, L["cin"], p, it["h"], it["w"]), True)
    taps = r((L["cout"], L["cin"], p, k, k), True)
    return lambda: F.conv3d(F.pad(halo, (0, 0, 0, 0, 0, p - 1)), taps, None, padding=(0, p, p))


def _face_fns(it: dict, r: _Tensors):
    """(device -> pinned host, pinned host -> device) copies of one side's packed halo planes."""
    L, b, n = it["layer"], it["batch"], it["planes"]
    c, _, _, w = L["in"]
    dim = 2 if it["axis"] == "d" else 3
    x = r((b, c, it["d"], it["h"], w))
    send = x.narrow(dim, x.shape[dim] - n, n).contiguous()
    pinned = r.dev.type == "cuda"
    host_out = torch.empty(send.shape, pin_memory=pinned)
    host_in = torch.randn(send.shape).pin_memory() if pinned else torch.randn(send.shape)
    recv = torch.empty_like(send)

    def d2h():
        host_out.copy_(send, non_blocking=pinned)
        return host_out

    def h2d():
        recv.copy_(host_in, non_blocking=pinned)
        return recv

    return d2h, h2d


def _fixed_op(it: dict, dev) -> Op:
    """A minimal layer of the item's kind, once (`alone`) or CHAIN of them in one call (`chained`)."""
    n = slabs.CHAIN if it["mode"] == "chained" else 1
    if it["layer_kind"] == "optimizer":
        steps = [optimizer_step_fn(it["shapes"], dev)[0] for _ in range(n)]

        def run():
            for f in steps:
                f()
        return Op(run, False, per=n)
    r = _Tensors(dev)
    layer = slabs.layer_item(slabs.minimal_layer(it["layer_kind"]), 1, 1, 1)
    fns = [_layer_fn(layer, r) for _ in range(n)]
    if n == 1:
        return Op(fns[0], True, r.leaves)
    return Op(lambda: [f() for f in fns], True, r.leaves, per=n)


def _halo_fn(it: dict, r: _Tensors):
    """pack: one side's planes of the local input into a send buffer; unpack: a received buffer into the
    halo region of the halo'd input (fwd = both; no backward: the backward's copies are the same)."""
    L, b, n = it["layer"], it["batch"], it["planes"]
    c, _, _, w = L["in"]
    dim = 2 if it["axis"] == "d" else 3
    x = r((b, c, it["d"], it["h"], w))
    shape = list(x.shape)
    shape[dim] += 2 * n
    padded = torch.zeros(shape, device=r.dev)
    recv = x.narrow(dim, 0, n).contiguous()

    def fn():
        send = x.narrow(dim, x.shape[dim] - n, n).contiguous()
        padded.narrow(dim, 0, n).copy_(recv)
        return send

    return fn


class _Step:
    """A whole one-GPU training step on a slab: every conv / pool / transposed conv on the input shape its
    layer item has (slabs.step_layer_items: the local planes the oracle charges), the dense head on the
    gathered features, loss, backward, Adam."""

    def __init__(self, it: dict, dev):
        self.spec, pd, ph = it["spec"], it["depth"], it["height"]
        c, d, h, w = self.spec[0]["in"]
        self.x = torch.randn(1, c, slabs.local(d, pd), slabs.local(h, ph), w, device=dev)
        self.out = {id(L): (slabs.local(L["out"][1], pd), slabs.local(L["out"][2], ph)) for L in self.spec
                    if L["kind"] in ("conv", "pool", "deconv", "concat")}
        self.params = [
            torch.nn.Parameter(torch.randn(s, device=dev) * 0.01) for s in slabs.param_shapes(self.spec)
        ]
        self.opt = torch.optim.Adam(self.params, lr=1e-6)

    def _conv(self, L: dict, x, w, b):
        """The conv on its window: zero halo planes on a split axis (as received at a global edge), the
        conv's own padding on the others, so the kernels see the layer item's shapes (slabs.layer_item)."""
        p = L["pad"]
        d, h = self.out[id(L)]
        sd, sh = d < L["out"][1], h < L["out"][2]
        if p and (sd or sh):
            x = F.pad(x, (0, 0, p if sh else 0, p if sh else 0, p if sd else 0, p if sd else 0))
        return F.conv3d(x, w, b, padding=(0 if sd else p, 0 if sh else p, p))

    def __call__(self):
        ps, x, skips = iter(self.params), self.x, []
        for L in self.spec:
            k = L["kind"]
            if k == "conv":
                x = F.leaky_relu(self._conv(L, x, next(ps), next(ps)), LEAK)
            elif k == "pool":
                skips.append(x)
                # rounding up: a rank's slab pools to the planes the oracle charges (ceil of the global
                # output per rank), which a slab of one plane (a 512^3 sample on 32 ranks) needs
                x = F.max_pool3d(x, L["kernel"], L["stride"], ceil_mode=True)
            elif k == "deconv":
                x = F.conv_transpose3d(x, next(ps), next(ps), stride=L["stride"])
                d, h = self.out[id(L)]
                x = x[:, :, :d, :h]  # a split no power of two divides upsamples a plane past its share
            elif k == "concat":
                x = torch.cat([x, skips.pop()], 1)
            elif k == "gather":  # the all-gather's output size (communication, not compute: zero-filled)
                x = F.pad(x.flatten(1), (0, max(0, L["out"][0] - x[0].numel())))[:, : L["out"][0]]
            elif k == "dense":
                x = F.linear(x, next(ps), next(ps))
                x = F.leaky_relu(x, LEAK) if L["act"] else x
        loss = x.float().pow(2).mean()
        # a training step's own zeroing (set_to_none=False keeps the buffers, as a steady loop does)
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        self.opt.step()


def build(it: dict, dev) -> Op:
    """The item's tensors on `dev` and the call that is timed."""
    kind = it["kind"]
    r = _Tensors(dev)
    if kind in ("conv", "pool", "deconv", "dense"):
        return Op(_layer_fn(it, r), True, r.leaves)
    if kind == "correction":
        return Op(_correction_fn(it, r), True, r.leaves)
    if kind == "halo":
        return Op(_halo_fn(it, r), False)
    if kind == "face":
        d2h, h2d = _face_fns(it, r)
        return Op(d2h, False, second=h2d)
    if kind == "fixed":
        return _fixed_op(it, dev)
    if kind == "optimizer":
        return Op(optimizer_step_fn(it["shapes"], dev)[0], False)
    if kind in ("step", "heldout_step"):
        return Op(_Step(it, dev), False)
    raise ValueError(f"calibration item {it['id']}: no timed work for kind {kind!r}")


def call(op: Op, clock: Clock) -> tuple[float, float]:
    """(forward, backward) seconds of one call of an item."""
    for t in op.leaves:
        t.grad = None
    t0 = clock.mark()
    y = op.fn()
    t1 = clock.mark()
    if op.second is not None:
        op.second()
        t3 = clock.mark()
        return clock.seconds(t0, t1) / op.per, clock.seconds(t1, t3) / op.per
    if not op.backward:
        return clock.seconds(t0, t1) / op.per, 0.0
    many = isinstance(y, list)
    if op.grad_out is None:
        op.grad_out = [torch.randn_like(v) for v in y] if many else torch.randn_like(y)
    t2 = clock.mark()
    if many:  # one backward over every output, as a step's one backward runs its layers'
        torch.autograd.backward(y, op.grad_out)
    else:
        y.backward(op.grad_out)
    t3 = clock.mark()
    return clock.seconds(t0, t1) / op.per, clock.seconds(t2, t3) / op.per


def time_item(it: dict, dev, clock: Clock, repeats: int) -> tuple[float, list[tuple[float, float]]]:
    """(seconds of the first, untimed call: cuDNN's search and any other first-call cost, the item's
    repeats' (forward, backward) seconds), its repeats run back to back after that call."""
    with torch.enable_grad():
        op = build(it, dev)
        clock.sync()
        t = time.perf_counter()
        call(op, clock)
        clock.sync()
        search = time.perf_counter() - t
        return search, [call(op, clock) for _ in range(repeats)]


def warm_up(dev, clock: Clock) -> None:
    """A tiny call of each kind of op the items run, untimed: loads the device's libraries (cuDNN, cuBLAS,
    oneDNN) before the first item, so its search_s is its own and the budget's pace is not skewed."""
    with torch.enable_grad():
        x = torch.randn(1, 2, 4, 4, 4, device=dev, requires_grad=True)
        w = torch.nn.Parameter(torch.randn(2, 2, 3, 3, 3, device=dev))
        up = torch.nn.Parameter(torch.randn(2, 2, 2, 2, 2, device=dev))
        y = F.conv_transpose3d(F.max_pool3d(F.conv3d(x, w, padding=1), 2), up, stride=2)
        lin = torch.nn.Parameter(torch.randn(4, y[0].numel(), device=dev))
        F.leaky_relu(F.linear(y.flatten(1), lin), LEAK).sum().backward()
        torch.optim.Adam([w, up, lin]).step()
    clock.sync()


class Reference:
    """A fixed matmul timed after every item (median of 3): the device's own speed over the run, so a
    drift in clocks or temperature between items measured minutes apart shows in the table (ref_s)."""

    def __init__(self, dev, clock: Clock):
        n = 2048 if dev.type == "cuda" else 256
        self.a, self.clock = torch.randn(n, n, device=dev), clock

    def seconds(self) -> float:
        out = []
        for _ in range(3):
            t0 = self.clock.mark()
            torch.mm(self.a, self.a)
            out.append(self.clock.seconds(t0, self.clock.mark()))
        return sorted(out)[1]
