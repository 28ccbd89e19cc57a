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
Which strategies exist at a GPU count, why the others cannot run, and the pick: perfmodel.strategies.
Memory per rank: weights, gradients and Adam state, the activations kept for backward, the
largest layer's gradient buffers and, on CPUs, the largest conv's im2col workspace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hpcdl.common.layers import flops, layer_family, layer_key, n_params, numel

BYTES = 4  # fp32 activations and gradients
_FIT_KIND = {"deconv": "conv"}  # a transposed conv runs at the rate of a conv (same GEMMs, transposed)


def fitted_time(fit: tuple, units: float) -> float:
    """Seconds of a fit (hpcdl.studies.spatial.perfmodel.fit) at `units`: (c0, k) a line;
    (c0 < 0, k, floor) superlinear in size, max(c0 + k u, floor u); (c0, k, rate, x_min) the line
    from x_min up and rate per unit below it (proportional_below)."""
    if len(fit) == 4:
        c0, k, rate, x_min = fit
        return c0 + units * k if units >= x_min else units * rate
    if len(fit) == 3:
        c0, k, floor = fit
        return max(c0 + units * k, units * floor)
    c0, k = fit
    return c0 + units * k


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


# --- machine ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Machine:
    """Compute: per-kind linear fits t = c0 + units * k (fwd+bwd), from microbenchmarks or a peak rate.

    Links: intra-node (alpha, beta) for groups inside a node, inter-node for groups spanning
    nodes; `ranks_per_node` ranks share a node; `cores` > 0 models oversubscribed CPU ranks.
    """

    conv: tuple[float, float]        # (c0 s, s per forward flop) of conv+activation fwd+bwd
    pool: tuple[float, float]        # (c0 s, s per output element x kernel^3) fwd+bwd
    dense: tuple[float, float]       # (c0 s, s per forward flop) fwd+bwd
    optimizer: tuple                 # (c0 s, s per parameter), or (c0, k, rate, x_min): fitted_time
    io: tuple[float, float]          # (c0 s per sample, s per byte)
    alpha_intra: float
    beta_intra: float
    alpha_inter: float
    beta_inter: float
    ranks_per_node: int
    memory_bytes: float = math.inf
    cores: int = 0                   # 0: one device per rank, no oversubscription
    threads_per_rank: int = 1
    # layer_key -> (c0, k), (c0, k, floor) where time grows faster than size, or (c0, k, rate, x_min)
    # proportional below the smallest timed size: per-layer fits (fitted_time); optimizer likewise
    layers: dict = field(default_factory=dict)
    # layer_family -> the same fits over every timed in-plane size of a family: a layer shape with no
    # fit of its own takes its family's (same work per voxel at another grid) before its kind's line
    families: dict = field(default_factory=dict)
    im2col: bool = False  # CPU conv3d materialises vol2col columns; cuDNN's implicit GEMM does not
    # measured on 2 ranks: (alpha, beta) of ring all-reduce / all-gather steps and of a two-sided
    # halo exchange; None = derive from the point-to-point alpha, beta of the group's link
    allreduce_ab: tuple[float, float] | None = None
    allgather_ab: tuple[float, float] | None = None
    exchange_ab: tuple[float, float] | None = None
    # compute fits timed with `busy["ranks"]` ranks computing at once (keys conv/pool/dense/optimizer,
    # layers and families, as above): used when a run keeps more than one core busy; None = the solo fits
    busy: dict | None = None
    # (c0 s, s per byte) of first-touching freshly mapped memory (page fault + zeroing), charged on
    # fresh_bytes(); zero on GPUs (a caching allocator reuses device memory) and, for now, in the
    # laptop fit too (see hpcdl.studies.spatial.perfmodel.fit.fit_machine)
    fault: tuple[float, float] = (0.0, 0.0)
    # communication hidden as production codes do (hpcdl.studies.spatial.overlap / buckets): a halo
    # exchange overlaps its layer's interior compute, the gradient all-reduce the backward
    overlap: bool = False
    # fat-tree: groups spanning more than `rack_nodes` nodes cross the rack uplinks, which carry
    # 1/`rack_oversubscription` of the nodes' injection bandwidth
    rack_nodes: int = 0
    rack_oversubscription: float = 1.0
    # per-layer times of a GPU calibration at the layouts' exact slab shapes
    # (hpcdl.studies.spatial.perfmodel.gpu_table.Measured): replaces the fits above for conv, pool,
    # deconv, dense and the optimizer, and adds the halo pack/unpack and the overlap's edge corrections
    measured: object | None = None
    # halos between nodes staged through pinned host memory: each exchange of a group spanning nodes adds
    # the measured copies of its planes to and from the host (Measured.face), as part of the transfer
    halo_staging: bool = False
    # NCCL's ring all-reduce between nodes: (alpha s per ring step, s per byte at the node's bus bandwidth),
    # shared and tapered as the point-to-point link is (link); None: the link's own bandwidth
    allreduce_nccl: tuple[float, float] | None = None

    def fault_time(self, nbytes: float, busy: bool = False) -> float:
        c0, k = (self.busy.get("fault") if busy and self.busy else None) or self.fault
        return c0 + nbytes * k if nbytes > 0 else 0.0

    def layer_time(self, layer: dict, units: float, busy: bool = False) -> float:
        fits = self.busy if busy and self.busy else {
            "layers": self.layers, "families": self.families, "conv": self.conv, "pool": self.pool,
            "dense": self.dense}
        fit = (fits["layers"].get(layer_key(layer)) or fits["families"].get(layer_family(layer))
               or fits[_FIT_KIND.get(layer["kind"], layer["kind"])])
        return fitted_time(fit, units)

    def optimizer_time(self, n_params: float, busy: bool = False) -> float:
        return fitted_time(self.busy["optimizer"] if busy and self.busy else self.optimizer, n_params)

    @classmethod
    def from_description(cls, m: dict) -> Machine:
        """A GPU machine from paper-style numbers (peak TFLOP/s x efficiency, link GB/s)."""
        rate = m["peak_tflops"] * 1e12 * m.get("efficiency", 0.5)
        k = 3.0 / rate  # backward ~ 2x forward
        return cls(overlap=bool(m.get("overlap", False)), rack_nodes=int(m.get("rack_nodes", 0)),
                   rack_oversubscription=float(m.get("rack_oversubscription", 1.0)),
                   conv=(m.get("kernel_overhead_s", 2e-5), k), pool=(m.get("kernel_overhead_s", 2e-5),
                                                                     3 * BYTES / (m["memory_gbs"] * 1e9)),
                   dense=(m.get("kernel_overhead_s", 2e-5), k),
                   optimizer=(m.get("kernel_overhead_s", 2e-5), 16 * BYTES / (m["memory_gbs"] * 1e9)),
                   io=(0.0, 1.0 / (m["io_gbs"] * 1e9)),
                   alpha_intra=m["alpha_intra_s"], beta_intra=1.0 / (m["intra_gbs"] * 1e9),
                   alpha_inter=m["alpha_inter_s"], beta_inter=1.0 / (m["inter_gbs"] * 1e9),
                   ranks_per_node=int(m["gpus_per_node"]), memory_bytes=m["memory_gb"] * 1e9,
                   halo_staging=m.get("halo_staging", "direct") == "host",
                   allreduce_nccl=((m["alpha_inter_s"], 1.0 / (m["allreduce_busbw_gbs"] * 1e9))
                                   if m.get("allreduce_busbw_gbs") else None))

    def link(self, group: int, stride: int = 1) -> tuple[float, float]:
        """(alpha, beta) of a group of `group` ranks `stride` apart; groups leaving a node share its NIC."""
        if group <= 1 or group * stride <= self.ranks_per_node:
            return self.alpha_intra, self.beta_intra
        sharing = max(1, self.ranks_per_node // max(stride, 1)) if stride < self.ranks_per_node else 1
        nodes = group * stride / self.ranks_per_node
        taper = self.rack_oversubscription if self.rack_nodes and nodes > self.rack_nodes else 1.0
        return self.alpha_inter, self.beta_inter * sharing * taper


def allreduce_link(machine: Machine, group: int, stride: int = 1) -> tuple[float, float]:
    """(alpha, beta) of a ring all-reduce over `group` ranks `stride` apart: within a node the link's; between
    nodes NCCL's bus bandwidth of the node (Machine.allreduce_nccl) in place of the link's, shared by a
    node's ranks and tapered beyond a rack exactly as the link is; the link's own where no NCCL figure is
    configured."""
    if machine.allreduce_nccl is None or group <= 1 or group * stride <= machine.ranks_per_node:
        return machine.link(group, stride)
    alpha, beta = machine.allreduce_nccl
    _, shared = machine.link(group, stride)  # beta_inter x the node's sharing x the rack taper
    return alpha, beta * shared / machine.beta_inter


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


def predict(spec: list[dict], batch: int, strat: Strategy, machine: Machine) -> dict:
    """Predicted seconds per iteration (by component) and memory bytes per rank of the slowest rank."""
    if batch % strat.data:
        raise ValueError(f"oracle: batch {batch} not divisible by {strat.data} data groups")
    b = batch // strat.data
    pd, ph, f, c = strat.depth, strat.height, strat.filter, strat.channel
    s = strat.spatial
    a_s, b_s = machine.link(s)                       # spatial groups: contiguous ranks
    a_m, b_m = machine.link(f * c)                   # model-parallel (filter/channel) groups
    # CPU ranks that compute at once contend for cores, caches and memory bandwidth and wait for
    # each other at every exchange: their compute follows the fits timed with all ranks busy
    busy = bool(machine.cores) and strat.ranks * machine.threads_per_rank > 1
    t = dict.fromkeys(("compute", "halo", "gather", "allreduce", "io", "optimizer", "model_comm"), 0.0)
    act_elems = max_layer = workspace = 0.0
    conv_params = total_params = 0
    hidden_halo = 0.0  # halo time the interior compute hides (overlap, depth-only partitions)
    first_conv_params = None
    for L in spec:
        kind = L["kind"]
        if kind in ("conv", "pool"):
            _, d, h, w = L["out"]
            ci, di, hi, wi = L["in"]
            frac = _local(d, pd) / d * _local(h, ph) / h
            fl = flops(L) * b * frac
            m = machine.measured if f * c == 1 else None
            if kind == "conv":
                fl /= f * c
                t_layer = m.layer(L, pd, ph, b) if m else machine.layer_time(L, fl, busy)
                conv_params += n_params(L)
                first_conv_params = n_params(L) if first_conv_params is None else first_conv_params
                act_elems += 2 * numel(L["out"]) * frac / f  # pre- and post-activation kept for backward
                max_layer = max(max_layer, numel(L["out"]) * frac / f)
                # im2col (vol2col) columns of the local conv: in-channels x k^3 per output voxel
                cols = L["cin"] / c * L["kernel"] ** 3 * numel(L["out"][1:]) * frac
                workspace = max(workspace, cols) if machine.im2col else 0.0
            else:
                t_layer = m.layer(L, pd, ph, b) if m else machine.layer_time(L, fl, busy)
                act_elems += numel(L["out"]) * frac
            t["compute"] += t_layer
            halo = (L["kernel"] - 1) // 2 if kind == "conv" else max(L["kernel"] - L["stride"], 0)
            # a middle rank trades `halo` planes with each neighbour, forward and again backward
            t_halo = t_latency = 0.0
            for parts, plane in ((pd, ci * _local(hi, ph) * wi), (ph, ci * _local(di, pd) * wi)):
                if parts > 1 and halo > 0:
                    t_halo += 2 * t_exchange(halo * plane * b * BYTES, parts, a_s, b_s, machine)
                    t_latency += 2 * t_exchange(1e-9, parts, a_s, b_s, machine)
            t_copy = 0.0
            if m and halo > 0:
                # packing a side's planes into a send buffer and unpacking the neighbour's, forward and
                # backward, per neighbour of a middle rank: GPU work, never hidden behind the compute
                for axis, one in m.halo(L, pd, ph, b).items():
                    t_copy += 2 * (2 if (pd if axis == "d" else ph) > 2 else 1) * one
                if machine.halo_staging and s > machine.ranks_per_node:
                    # between nodes through pinned host memory: the packed planes to the host and the
                    # neighbour's back, per neighbour, forward and backward: part of the transfer
                    for axis, one in m.face(L, pd, ph, b).items():
                        t_halo += 2 * (2 if (pd if axis == "d" else ph) > 2 else 1) * one
            t["halo"] += t_halo + t_copy
            if m and machine.overlap and kind == "conv" and pd > 1 and ph == 1 and _local(d, pd) < d \
                    and L["stride"] == 1 and 2 * L["pad"] == L["kernel"] - 1 and L["pad"] > 0:
                t["compute"] += 2 * m.correction(L, b)  # the thin edge conv of each side (overlap.py)
            if machine.overlap and kind == "conv" and ph == 1 and t_halo > 0:
                # the transfer runs while the output planes that read no halo plane compute; the
                # per-exchange latency (wake-up, the neighbour's skew) is not hidden by it
                local_out = _local(d, pd)
                interior = max(0.0, 1.0 - 2.0 * halo / local_out) if local_out else 0.0
                hidden_halo += min(t_halo - t_latency, t_layer * interior)
            if kind == "conv" and (f > 1 or c > 1):
                out_bytes = numel(L["out"]) * frac * b * BYTES
                in_bytes = numel(L["in"]) * frac * b * BYTES
                t["model_comm"] += (t_allgather(out_bytes, f, a_m, b_m) + t_allreduce(in_bytes, f, a_m, b_m)
                                    + t_allreduce(out_bytes, c, a_m, b_m)
                                    + t_allgather(in_bytes, c, a_m, b_m))
        elif kind == "deconv":
            # transposed conv (kernel = stride: no halo); the upsampled output is split like its input
            _, d, h, w = L["out"]
            frac = _local(d, pd) / d * _local(h, ph) / h
            m = machine.measured if f * c == 1 else None
            t["compute"] += (m.layer(L, pd, ph, b) if m
                             else machine.layer_time(L, flops(L) * b * frac / (f * c), busy))
            conv_params += n_params(L)
            act_elems += numel(L["out"]) * frac / f
            max_layer = max(max_layer, numel(L["out"]) * frac / f)
        elif kind == "concat":
            # skip connection: the decoder's input = upsampled map + the encoder's map (stored, no compute)
            _, d, h, w = L["out"]
            act_elems += numel(L["out"]) * _local(d, pd) / d * _local(h, ph) / h
        elif kind == "gather":
            ag = machine.allgather_ab or (a_s, b_s)
            t["gather"] += t_allgather(numel(L["in"]) * b * BYTES, s, *ag)
            act_elems += numel(L["in"])
        elif kind == "dense":
            t["compute"] += machine.measured.layer(L, 1, 1, b) if machine.measured else machine.layer_time(
                L, flops(L) * b, busy)
            act_elems += L["fout"] * 2
        total_params += n_params(L)
    t["halo"] -= hidden_halo
    c_in = spec[0]["in"]
    in_elems = numel(c_in) / (pd * ph) if pd * ph > 1 else numel(c_in)
    in_bytes = in_elems * b * BYTES
    t["io"] = machine.io[0] * b + in_bytes * machine.io[1]
    ar_s = machine.allreduce_ab or allreduce_link(machine, s)
    ar_d = machine.allreduce_ab or allreduce_link(machine, strat.data, stride=s * f * c)
    t["allreduce"] = (t_allreduce(conv_params * BYTES / (f * c), s, *ar_s)
                      + t_allreduce(total_params * BYTES / (f * c), strat.data, *ar_d))
    if machine.overlap and t["allreduce"] > 0:
        # buckets reduce during the backward (about 2/3 of the compute); the first layer's bucket is
        # ready only at the end of the backward, so at least its all-reduce stays exposed
        p_s, p_d = (s, strat.data)
        last = (t_allreduce((first_conv_params or 0) * BYTES / (f * c), p_s, *ar_s)
                + t_allreduce((first_conv_params or 0) * BYTES / (f * c), p_d, *ar_d))
        t["allreduce"] = max(last, t["allreduce"] - 2.0 / 3.0 * t["compute"])
    t["optimizer"] = (machine.measured.optimizer(total_params) if machine.measured and f * c == 1
                      else machine.optimizer_time(total_params / (f * c), busy))
    frac_s = _local(spec[0]["in"][1], pd) / spec[0]["in"][1] * _local(spec[0]["in"][2], ph) / spec[0]["in"][2]
    t["compute"] += machine.fault_time(fresh_bytes(spec, b, frac_s, f, c), busy)
    if machine.cores:
        # CPU ranks beyond the cores time-share them: everything a rank does, including driving
        # its communication, stretches by ranks / cores
        slow = max(1.0, strat.ranks * machine.threads_per_rank / machine.cores)
        for k in t:
            t[k] *= slow
    t["total"] = sum(t.values())
    params_bytes = total_params / (f * c) * BYTES * 4  # weights, grads, Adam m and v
    # saved activations + the input, gradient buffers of the largest layer live at once in backward,
    # and (CPU) the largest conv's column workspace (forward columns and their gradient)
    mem = params_bytes + (act_elems + in_elems + 2 * max_layer + 2 * workspace) * b * BYTES
    return {**{f"{k}_s": v for k, v in t.items()}, "memory_bytes": mem,
            "feasible": mem <= machine.memory_bytes}
