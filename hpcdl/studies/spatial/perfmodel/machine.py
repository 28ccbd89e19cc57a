"""A machine as the oracle prices it (pure Python): compute fits per layer kind, shape and family, the
links between ranks, memory, and a GPU calibration's measured times where one serves (gpu_table.Measured).

A fit is a line (c0, k) over a layer's units, or one of fitted_time's other shapes (perfmodel.fit makes
them from microbenchmark rows; Machine.from_description from a paper's peak rate). allreduce_link: the
(alpha, beta) a ring all-reduce sees on a machine, NCCL's bus bandwidth between nodes where configured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hpcdl.common.layers import layer_family, layer_key

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
