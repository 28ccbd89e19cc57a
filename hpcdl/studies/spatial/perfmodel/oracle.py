"""ParaDL-style analytical oracle: per-layer compute, alpha-beta communication and memory per rank.

Pure Python (no torch): takes the layer specs of hpcdl.common.layers and a machine description,
returns predicted seconds per iteration broken down like the measurements
(compute / halo / gather / allreduce / io / optimizer) and bytes of memory per rank.

Strategies, for P = product of the factors:
  data (d)        each rank a batch share, whole volume; all-reduce of all gradients.
  spatial (pd,ph) each rank a depth x height block of every sample; halo per conv/pool layer
                  (forward and backward), all-gather to the head, all-reduce of conv grads.
  data x spatial  both (the laptop runs and the paper's hybrid).
  filter (f)      each rank 1/f of every conv's output channels; activations all-gathered
                  in forward, input gradients all-reduced in backward.
  channel (c)     each rank 1/c of every conv's input channels; partial outputs all-reduced
                  in forward, input gradients all-gathered in backward.
Which strategies exist at a GPU count, why the others cannot run, and the pick: perfmodel.strategies;
the machine a prediction is priced on (its fits, links and measured GPU times): perfmodel.machine.
Memory per rank: weights, gradients and Adam state, the activations kept for backward, the
largest layer's gradient buffers and, on CPUs, the largest conv's im2col workspace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hpcdl.common.layers import flops, n_params, numel
from hpcdl.studies.spatial.perfmodel.machine import BYTES, Machine, allreduce_link


@dataclass(frozen=True)
class Strategy:
    data: int = 1
    depth: int = 1
    height: int = 1
    filter: int = 1
    channel: int = 1

    @property
    def ranks(self) -> int:
        return self.data * self.depth * self.height * self.filter * self.channel

    @property
    def spatial(self) -> int:
        return self.depth * self.height

    @property
    def name(self) -> str:
        parts = []
        if self.filter > 1:
            parts.append("filter")
        if self.channel > 1:
            parts.append("channel")
        if self.spatial > 1:
            parts.append("spatial")
        if self.data > 1 or not parts:
            parts.insert(0, "data")
        return " x ".join(parts)


# --- alpha-beta collectives (alpha: latency s, beta: s/byte) -------------------------------------

def t_p2p(nbytes: float, alpha: float, beta: float) -> float:
    return alpha + nbytes * beta if nbytes > 0 else 0.0


def t_allreduce(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Ring: reduce-scatter + all-gather, 2(p-1) steps of n/p bytes."""
    return 0.0 if p <= 1 else 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


def t_exchange(nbytes: float, parts: int, alpha: float, beta: float, machine=None) -> float:
    """One halo exchange of `nbytes` with each neighbour (both directions in flight at once).

    With a measured two-sided exchange (c0, k) a middle rank pays it once per neighbour;
    otherwise two alpha-beta messages per neighbour.
    """
    if parts <= 1 or nbytes <= 0:
        return 0.0
    neighbours = 2 if parts > 2 else 1
    if machine is not None and machine.exchange_ab is not None:
        c0, k = machine.exchange_ab
        return neighbours * (c0 + nbytes * k)
    return neighbours * 2 * t_p2p(nbytes, alpha, beta)


def t_allgather(nbytes_total: float, p: int, alpha: float, beta: float) -> float:
    return 0.0 if p <= 1 else (p - 1) * alpha + (p - 1) / p * nbytes_total * beta


# --- a training step on a strategy ------------------------------------------------------------------

def fresh_bytes(spec: list[dict], batch: int, frac: float = 1.0, f: int = 1, c: int = 1) -> float:
    """Bytes of fresh memory pages a CPU training step first-touches for its feature maps.

    A step allocates every feature map (per conv the halo window, the pre- and post-activation
    output; per pool the window and the output) and, in the backward, a gradient of each, and
    frees them all again. glibc's allocator serves blocks at or above its adaptive mmap threshold
    (which rises to the largest block freed so far) with new mappings, so after the first step the
    maps of the largest size are fresh pages every step: a page fault and the kernel's zeroing
    per page. `frac` of the volume (a slab), 1/f of conv outputs, 1/c of conv inputs.
    """
    maps = []
    for L in spec:
        if L["kind"] == "conv":
            maps += [numel(L["in"]) / c, numel(L["out"]) / f, numel(L["out"]) / f]
        elif L["kind"] == "pool":
            maps += [numel(L["in"]), numel(L["out"])]
    if not maps:
        return 0.0
    largest = max(maps)
    return 2 * sum(m for m in maps if m >= largest) * frac * batch * BYTES


def _local(n: int, parts: int) -> int:
    return math.ceil(n / parts) if parts > 1 else n


@dataclass(frozen=True)
class _Layout:
    """A strategy as predict prices it: each rank's batch share and splits, the links of its groups, and
    whether its CPU ranks compute at once (then their compute follows the fits timed with all ranks busy)."""

    machine: Machine
    b: int           # samples per data group
    pd: int
    ph: int
    f: int
    c: int
    s: int           # spatial ranks per sample
    a_s: float       # spatial groups: contiguous ranks
    b_s: float
    a_m: float       # model-parallel (filter/channel) groups
    b_m: float
    busy: bool

    @property
    def measured(self):
        """The GPU calibration's times, where one serves and no filter / channel split thins a conv."""
        return self.machine.measured if self.f * self.c == 1 else None

    def frac(self, d: int, h: int) -> float:
        """The share of a d x h map a rank holds."""
        return _local(d, self.pd) / d * _local(h, self.ph) / h


@dataclass
class _Tally:
    """What predict has charged so far, layer by layer."""

    t: dict = field(default_factory=lambda: dict.fromkeys(
        ("compute", "halo", "gather", "allreduce", "io", "optimizer", "model_comm"), 0.0))
    act_elems: float = 0.0
    max_layer: float = 0.0
    workspace: float = 0.0
    conv_params: int = 0
    total_params: int = 0
    hidden_halo: float = 0.0  # halo time the interior compute hides (overlap, depth-only partitions)
    first_conv_params: int | None = None


def _layout(batch: int, strat: Strategy, machine: Machine) -> _Layout:
    f, c, s = strat.filter, strat.channel, strat.spatial
    # CPU ranks that compute at once contend for cores, caches and memory bandwidth and wait for
    # each other at every exchange
    busy = bool(machine.cores) and strat.ranks * machine.threads_per_rank > 1
    return _Layout(machine, batch // strat.data, strat.depth, strat.height, f, c, s, *machine.link(s),
                   *machine.link(f * c), busy)


def _conv_or_pool(L: dict, lay: _Layout, acc: _Tally) -> None:
    """A conv or pool layer: its compute and the activations it keeps, then its halo (_halo)."""
    kind = L["kind"]
    _, d, h, w = L["out"]
    frac = lay.frac(d, h)
    fl = flops(L) * lay.b * frac
    m = lay.measured
    f, c = lay.f, lay.c
    if kind == "conv":
        fl /= f * c
        t_layer = m.layer(L, lay.pd, lay.ph, lay.b) if m else lay.machine.layer_time(L, fl, lay.busy)
        acc.conv_params += n_params(L)
        acc.first_conv_params = n_params(L) if acc.first_conv_params is None else acc.first_conv_params
        acc.act_elems += 2 * numel(L["out"]) * frac / f  # pre- and post-activation kept for backward
        acc.max_layer = max(acc.max_layer, numel(L["out"]) * frac / f)
        # im2col (vol2col) columns of the local conv: in-channels x k^3 per output voxel
        cols = L["cin"] / c * L["kernel"] ** 3 * numel(L["out"][1:]) * frac
        acc.workspace = max(acc.workspace, cols) if lay.machine.im2col else 0.0
    else:
        t_layer = m.layer(L, lay.pd, lay.ph, lay.b) if m else lay.machine.layer_time(L, fl, lay.busy)
        acc.act_elems += numel(L["out"]) * frac
    acc.t["compute"] += t_layer
    _halo(L, lay, acc, t_layer)
    if kind == "conv" and (f > 1 or c > 1):
        out_bytes = numel(L["out"]) * frac * lay.b * BYTES
        in_bytes = numel(L["in"]) * frac * lay.b * BYTES
        a_m, b_m = lay.a_m, lay.b_m
        acc.t["model_comm"] += (t_allgather(out_bytes, f, a_m, b_m) + t_allreduce(in_bytes, f, a_m, b_m)
                                + t_allreduce(out_bytes, c, a_m, b_m)
                                + t_allgather(in_bytes, c, a_m, b_m))


def _per_neighbour(axis: str, lay: _Layout) -> int:
    """Neighbours a middle rank has along a split axis."""
    return 2 if (lay.pd if axis == "d" else lay.ph) > 2 else 1


def _halo(L: dict, lay: _Layout, acc: _Tally, t_layer: float) -> None:
    """A conv's or pool's halo exchange, its copies and edge corrections, and what the overlap hides."""
    kind, machine, m, b, pd, ph = L["kind"], lay.machine, lay.measured, lay.b, lay.pd, lay.ph
    _, d, _, _ = L["out"]
    ci, di, hi, wi = L["in"]
    halo = (L["kernel"] - 1) // 2 if kind == "conv" else max(L["kernel"] - L["stride"], 0)
    # a middle rank trades `halo` planes with each neighbour, forward and again backward
    t_halo = t_latency = 0.0
    for parts, plane in ((pd, ci * _local(hi, ph) * wi), (ph, ci * _local(di, pd) * wi)):
        if parts > 1 and halo > 0:
            t_halo += 2 * t_exchange(halo * plane * b * BYTES, parts, lay.a_s, lay.b_s, machine)
            t_latency += 2 * t_exchange(1e-9, parts, lay.a_s, lay.b_s, machine)
    t_copy = 0.0
    if m and halo > 0:
        # packing a side's planes into a send buffer and unpacking the neighbour's, forward and
        # backward, per neighbour of a middle rank: GPU work, never hidden behind the compute
        for axis, one in m.halo(L, pd, ph, b).items():
            t_copy += 2 * _per_neighbour(axis, lay) * one
        if machine.halo_staging and lay.s > machine.ranks_per_node:
            # between nodes through pinned host memory: the packed planes to the host and the
            # neighbour's back, per neighbour, forward and backward: part of the transfer
            for axis, one in m.face(L, pd, ph, b).items():
                t_halo += 2 * _per_neighbour(axis, lay) * one
    acc.t["halo"] += t_halo + t_copy
    if m and machine.overlap and kind == "conv" and pd > 1 and ph == 1 and _local(d, pd) < d \
            and L["stride"] == 1 and 2 * L["pad"] == L["kernel"] - 1 and L["pad"] > 0:
        acc.t["compute"] += 2 * m.correction(L, b)  # the thin edge conv of each side (overlap.py)
    if machine.overlap and kind == "conv" and ph == 1 and t_halo > 0:
        # the transfer runs while the output planes that read no halo plane compute; the
        # per-exchange latency (wake-up, the neighbour's skew) is not hidden by it
        local_out = _local(d, pd)
        interior = max(0.0, 1.0 - 2.0 * halo / local_out) if local_out else 0.0
        acc.hidden_halo += min(t_halo - t_latency, t_layer * interior)


def _other_layer(L: dict, lay: _Layout, acc: _Tally) -> None:
    """A layer with no halo: transposed conv, skip connection, gather to the head, dense."""
    kind, machine, b = L["kind"], lay.machine, lay.b
    if kind == "deconv":
        # transposed conv (kernel = stride: no halo); the upsampled output is split like its input
        _, d, h, w = L["out"]
        frac = lay.frac(d, h)
        m = lay.measured
        acc.t["compute"] += (m.layer(L, lay.pd, lay.ph, b) if m
                             else machine.layer_time(L, flops(L) * b * frac / (lay.f * lay.c), lay.busy))
        acc.conv_params += n_params(L)
        acc.act_elems += numel(L["out"]) * frac / lay.f
        acc.max_layer = max(acc.max_layer, numel(L["out"]) * frac / lay.f)
    elif kind == "concat":
        # skip connection: the decoder's input = upsampled map + the encoder's map (stored, no compute)
        _, d, h, w = L["out"]
        acc.act_elems += numel(L["out"]) * lay.frac(d, h)
    elif kind == "gather":
        ag = machine.allgather_ab or (lay.a_s, lay.b_s)
        acc.t["gather"] += t_allgather(numel(L["in"]) * b * BYTES, lay.s, *ag)
        acc.act_elems += numel(L["in"])
    elif kind == "dense":
        acc.t["compute"] += machine.measured.layer(L, 1, 1, b) if machine.measured else machine.layer_time(
            L, flops(L) * b, lay.busy)
        acc.act_elems += L["fout"] * 2


def _allreduce(strat: Strategy, lay: _Layout, acc: _Tally) -> float:
    """Seconds of the gradient all-reduce over the spatial group and over the data groups, the part the
    backward does not hide where buckets overlap it."""
    machine, s, fc = lay.machine, lay.s, lay.f * lay.c
    ar_s = machine.allreduce_ab or allreduce_link(machine, s)
    ar_d = machine.allreduce_ab or allreduce_link(machine, strat.data, stride=s * fc)
    t = (t_allreduce(acc.conv_params * BYTES / fc, s, *ar_s)
         + t_allreduce(acc.total_params * BYTES / fc, strat.data, *ar_d))
    if machine.overlap and t > 0:
        # buckets reduce during the backward (about 2/3 of the compute); the first layer's bucket is
        # ready only at the end of the backward, so at least its all-reduce stays exposed
        last = (t_allreduce((acc.first_conv_params or 0) * BYTES / fc, s, *ar_s)
                + t_allreduce((acc.first_conv_params or 0) * BYTES / fc, strat.data, *ar_d))
        t = max(last, t - 2.0 / 3.0 * acc.t["compute"])
    return t


def predict(spec: list[dict], batch: int, strat: Strategy, machine: Machine) -> dict:
    """Predicted seconds per iteration (by component) and memory bytes per rank of the slowest rank."""
    if batch % strat.data:
        raise ValueError(f"oracle: batch {batch} not divisible by {strat.data} data groups")
    lay = _layout(batch, strat, machine)
    b, pd, ph, f, c = lay.b, lay.pd, lay.ph, lay.f, lay.c
    acc = _Tally()
    for L in spec:
        if L["kind"] in ("conv", "pool"):
            _conv_or_pool(L, lay, acc)
        else:
            _other_layer(L, lay, acc)
        acc.total_params += n_params(L)
    t = acc.t
    t["halo"] -= acc.hidden_halo
    c_in = spec[0]["in"]
    in_elems = numel(c_in) / (pd * ph) if pd * ph > 1 else numel(c_in)
    in_bytes = in_elems * b * BYTES
    t["io"] = machine.io[0] * b + in_bytes * machine.io[1]
    t["allreduce"] = _allreduce(strat, lay, acc)
    t["optimizer"] = (machine.measured.optimizer(acc.total_params) if machine.measured and f * c == 1
                      else machine.optimizer_time(acc.total_params / (f * c), lay.busy))
    t["compute"] += machine.fault_time(fresh_bytes(spec, b, lay.frac(c_in[1], c_in[2]), f, c), lay.busy)
    if machine.cores:
        # CPU ranks beyond the cores time-share them: everything a rank does, including driving
        # its communication, stretches by ranks / cores
        slow = max(1.0, strat.ranks * machine.threads_per_rank / machine.cores)
        for k in t:
            t[k] *= slow
    t["total"] = sum(t.values())
    params_bytes = acc.total_params / (f * c) * BYTES * 4  # weights, grads, Adam m and v
    # saved activations + the input, gradient buffers of the largest layer live at once in backward,
    # and (CPU) the largest conv's column workspace (forward columns and their gradient)
    mem = params_bytes + (acc.act_elems + in_elems + 2 * acc.max_layer + 2 * acc.workspace) * b * BYTES
    return {**{f"{k}_s": v for k, v in t.items()}, "memory_bytes": mem,
            "feasible": mem <= machine.memory_bytes}
