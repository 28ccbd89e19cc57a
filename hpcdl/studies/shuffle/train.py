"""The rank function: data-parallel training (DDP) with one shuffling strategy, on the rank's device.

Run by `hpcdl.platform.kit.rank_runtime.launch.run_ranks("hpcdl.studies.shuffle.train:train_rank", M,
kwargs, device=...)`; the process group is already initialised on the rank's placement
(hpcdl.platform.kit.rank_runtime.placement.current(): NCCL on the rank's GPU, gloo on the CPU or on a
shared GPU). Trains once per entry of `runs` (seed, KAKURENBO fraction, round:
hpcdl.studies.shuffle.sweep), each from a fresh model, and returns this rank's per-epoch records of
every run.

Strategies
- global: every epoch a shared permutation of all N (DistributedSampler semantics); each
  rank reads its share from the memory-mapped cache (the "shared file system").
- local: each rank reads its partition once and shuffles only it.
- partial: as local, and during epoch e's compute the rank sends k = Q*N/M of the partition's
  samples to peers and receives k, which replace the sent ones for epoch e+1 (so a rank holds at
  most N/M + k distinct samples; `samples_held` counts them from the buffers at the epoch's peak,
  `held_rows` the sample rows in memory then, staged copies included).
KAKURENBO (global only): hide easy samples from the backward pass (hpcdl.studies.shuffle.kakurenbo).
Its cost is timed apart from the work it saves: `record_s` (keeping each sample's loss, correctness
and confidence, and merging them over ranks), `select_s` (choosing the hidden samples) and
`hidden_forward_s` (the forward pass that refreshes the hidden samples' loss).

Devices. The model, batches, losses and KAKURENBO's per-sample records are on the rank's compute
device; every collective on the default group moves tensors on the placement's comm device, so NCCL
only ever sees CUDA tensors and gloo CPU ones. Where a rank holds its partition and how it exchanges
it is `exchange_device` (the study block's key, hpcdl.studies.shuffle.exchange):
- host (default): the samples stay in host memory, as read from the memory-mapped cache, and are
  exchanged over a gloo group of their own in a background thread; each batch is gathered into
  pinned memory and copied to the GPU asynchronously.
- device: the partition is copied to the GPU once and exchanged as CUDA tensors over NCCL on the
  default group; batches are indexed on the GPU. Needs one GPU per rank (NCCL refuses two ranks on
  one GPU, so shared GPUs are an error here).
On the CPU both are host memory and the same code path. Why host by default, for now: it is where
the memory-mapped cache puts the samples, it works where ranks share a GPU, its exchange never
touches the NCCL stream the gradients use, and it costs no GPU memory; the device path saves each
batch's copy to the GPU but queues the exchange ahead of the first gradient all-reduce. Which costs
more is a measurement on GPUs, still pending (no multi-GPU machine has run it):
`benchmarks/bench_shuffle.py --device cuda --ranks M` (M >= 2, one GPU each) prints the steady-state
partial-0.1 epoch time with the samples on the GPU over that with them in host memory; a ratio
clearly below 1 (beyond the run-to-run spread of three runs) makes `device` the default.

Timing on CUDA: a phase's time is read after the rank's compute stream is synchronised, so each
phase holds its own GPU work (the exchange runs on other streams and is not waited for there).

Where a rank computes and holds its samples, and its per-epoch bookkeeping: rank_state.py.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from hpcdl.platform import current_placement
from hpcdl.studies.shuffle import exchange_plan, kakurenbo, partition
from hpcdl.studies.shuffle import model as model_mod
from hpcdl.studies.shuffle.exchange import BackgroundExchange, DeviceExchange, ExchangeError
from hpcdl.studies.shuffle.rank_state import Held, Stopwatch, Where, batches, host_ids

STRATEGIES = ("global", "local", "partial")
# the rank launcher imports these once before forking the ranks (rank_runtime.forked): the DDP and
# optimizer constructors below would otherwise import torch._dynamo in every rank
RANK_PRELOAD = ("torch._dynamo",)


def _validate(net, val: tuple[torch.Tensor, torch.Tensor], where: Where) -> tuple[float, float]:
    # DDP evaluates with rank 0's buffers (BN running stats): make that explicit.
    for buf in net.module.buffers():
        where.on_comm(buf, lambda t: dist.broadcast(t, 0))
    net.module.eval()
    with torch.no_grad():
        xs, ys = val
        out = net.module(xs)
        stats = torch.tensor([(out.argmax(1) == ys).sum().item(),
                              F.cross_entropy(out, ys, reduction="sum").item(), len(ys)],
                             dtype=torch.float64, device=where.comm)
    net.module.train()
    dist.all_reduce(stats)
    stats = stats.cpu()
    return float(stats[0] / stats[2]), float(stats[1] / stats[2])


def train_rank(*, data: dict, strategy: str, q: float, partitioning: str, alpha: float, runs: list[dict],
               epochs: int, batch_size: int, lr: float, momentum: float, model: dict,
               kill: dict | None = None, exchange_timeout_s: float | None = None,
               exchange_device: str = "host", return_ids: bool = False) -> dict:
    """`runs`: [{"seed", "kakurenbo_fraction", "round", "slot"}], trained in this order. `kill` (tests)
    makes a rank die in the exchange of one epoch of the first run. `exchange_device`: host or device
    (the module's docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    exchange_plan.check_q(q)
    if not runs:
        raise ValueError("runs is empty: a point trains at least once")
    for run in runs:
        kakurenbo.check_fraction(run["kakurenbo_fraction"])
        if run["kakurenbo_fraction"] > 0 and strategy != "global":
            raise ValueError("KAKURENBO is run on top of global shuffling (strategy 'global')")
    where = Where(current_placement(), exchange_device, strategy)
    timeout = float(exchange_timeout_s or os.environ.get("HPCDL_COLLECTIVE_TIMEOUT_S", "60"))
    shared = _Shared(data, timeout, host_exchange=strategy == "partial" and where.samples_on == "host")
    records, ids = [], None
    for i, run in enumerate(runs):
        recs, ids = _train_one(shared, where, strategy=strategy, q=q, partitioning=partitioning, alpha=alpha,
                               seed=int(run["seed"]), kakurenbo_fraction=float(run["kakurenbo_fraction"]),
                               epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, model=model,
                               kill=(kill or {}) if i == 0 else {})
        records += [{**r, "seed": int(run["seed"]), "kakurenbo_fraction": float(run["kakurenbo_fraction"]),
                     "round": int(run["round"]), "slot": int(run.get("slot", 0))} for r in recs]
        # DDP's reducer holds reference cycles: free each run's model now, not at process-group teardown
        gc.collect()
    result = {"records": records}
    if return_ids and ids is not None:
        result["ids"] = ids
    return result


class _Shared:
    """What every run of a point shares: the memory-mapped data, this rank's validation slice on its
    compute device, and the host exchange's gloo group."""

    def __init__(self, data: dict, timeout: float, host_exchange: bool):
        self.timeout = timeout
        self.x_file = np.load(data["x_train"], mmap_mode="r")
        self.y_all = np.load(data["y_train"])
        self.x_val, self.y_val = np.load(data["x_val"], mmap_mode="r"), np.load(data["y_val"])
        self.xgroup = (dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout)) if host_exchange
                       else None)
        self._val = None

    def val(self, rank: int, m: int, where: Where) -> tuple[torch.Tensor, torch.Tensor]:
        if self._val is None:
            xs = torch.from_numpy(np.ascontiguousarray(self.x_val[rank::m])).to(where.compute)
            self._val = (xs, torch.from_numpy(self.y_val[rank::m]).to(where.compute))
        return self._val


class _Partition:
    """This rank's partition (local, partial): its samples, labels and global ids where the rank holds
    them (`Where.samples`); a partial exchange overwrites rows of all three in place."""

    def __init__(self, ids: np.ndarray, shared: _Shared, where: Where):
        self.x = torch.from_numpy(np.ascontiguousarray(shared.x_file[ids])).to(where.samples)
        self.y = torch.from_numpy(shared.y_all[ids]).to(where.samples)
        self.ids = torch.from_numpy(ids.astype(np.int64)).to(where.samples)


@dataclass
class _Run:
    """One training run of a point on this rank: what its epochs share."""

    shared: _Shared
    where: Where
    net: DistributedDataParallel
    opt: torch.optim.Optimizer
    strategy: str
    q: float
    seed: int
    fraction: float  # KAKURENBO's
    epochs: int
    batch_size: int
    lr: float
    kill: dict
    sizes: list
    k: int  # samples sent and received each epoch (partial), else 0
    part: _Partition | None  # None: global, read from the shared file
    initial_load_s: float
    rank: int
    m: int
    stats: np.ndarray  # last loss, correct, confidence per sample (KAKURENBO)


def _train_one(shared: _Shared, where: Where, *, strategy: str, q: float, partitioning: str, alpha: float,
               seed: int, kakurenbo_fraction: float, epochs: int, batch_size: int, lr: float, momentum: float,
               model: dict, kill: dict) -> tuple[list[dict], np.ndarray | None]:
    rank, m = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    n = len(shared.y_all)
    sizes = partition.partition_sizes(n, m)
    module = model_mod.build(model["kind"], model["width"], model["depth"]).to(where.compute)
    net = DistributedDataParallel(module, device_ids=[where.compute.index] if where.cuda else None)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)

    load0 = time.perf_counter()
    part = None
    if strategy != "global":
        ids = partition.make_partition(partitioning, shared.y_all, m, seed, alpha)[rank]
        part = _Partition(ids, shared, where)
    where.sync()
    initial_load_s = time.perf_counter() - load0
    k = exchange_plan.exchange_count(n, m, q) if strategy == "partial" else 0
    stats = np.zeros((3, n))
    stats[0] = np.inf
    run = _Run(shared, where, net, opt, strategy, q, seed, kakurenbo_fraction, epochs, batch_size, lr, kill,
               sizes, k, part, initial_load_s, rank, m, stats)
    records = [_epoch(run, epoch) for epoch in range(epochs)]
    return records, (host_ids(part.ids).copy() if part is not None else None)


def _epoch(run: _Run, epoch: int) -> dict:
    """One epoch: train on this rank's order (the exchange in flight), wait for the exchange, validate;
    its record."""
    where, k = run.where, run.k
    sw = Stopwatch(where.sync)
    wall0 = time.perf_counter()
    hidden, hiding = _hide(run, sw)
    # cosine decay settles the last epochs, so "final accuracy" is not one noisy step's luck
    epoch_lr = (run.lr * 0.5 * (1 + np.cos(np.pi * epoch / run.epochs))
                * kakurenbo.lr_scale(float(hidden.mean())))
    for g in run.opt.param_groups:
        g["lr"] = epoch_lr
    order, plan, ex = _order_and_exchange(run, epoch, hidden)
    loss_sum, steps = _train_steps(run, epoch, order, hidden, sw, ex)
    held, outcome, exposed = _exchanged(run, order, plan, ex)
    where.sync()
    epoch_s = time.perf_counter() - wall0
    val0 = time.perf_counter()
    val_acc, val_loss = _validate(run.net, run.shared.val(run.rank, run.m, where), where)
    t = sw.t
    return {
        "epoch": epoch, "rank": run.rank, "world_size": run.m,
        "device": where.label, "exchange_device": where.samples_on,
        "train_loss": loss_sum / max(1, steps), "val_acc": val_acc, "val_loss": val_loss,
        "samples_trained": len(order), "samples_sent": k if ex else 0, "samples_recv": k if ex else 0,
        "bytes_sent": outcome.bytes_sent if outcome else 0,
        "bytes_recv": outcome.bytes_recv if outcome else 0,
        "exchange_s": outcome.time_s if outcome else 0.0, "exposed_exchange_s": exposed,
        "load_s": t.get("load_s", 0.0) + (run.initial_load_s if epoch == 0 else 0.0),
        "fwd_bwd_s": t.get("fwd_bwd_s", 0.0), "update_s": t.get("update_s", 0.0),
        "hidden_forward_s": t.get("hidden_forward_s", 0.0), "record_s": t.get("record_s", 0.0),
        "select_s": t.get("select_s", 0.0),
        "compute_s": t.get("fwd_bwd_s", 0.0) + t.get("update_s", 0.0) + t.get("hidden_forward_s", 0.0),
        "epoch_s": epoch_s, "val_s": time.perf_counter() - val0,
        "samples_held": held.samples, "held_rows": held.rows,
        "hidden": int(hidden.sum()), "n_train": len(run.shared.y_all),
        "moved_back": hiding.moved_back if hiding else 0, "lr": epoch_lr,
        "partition_skew_tv": (partition.label_skew(run.shared.y_all, [host_ids(run.part.ids)])
                              if run.part is not None else float("nan")),
    }


def _hide(run: _Run, sw: Stopwatch):
    """KAKURENBO's hidden samples this epoch (none without it) and its selection."""
    hidden = np.zeros(len(run.shared.y_all), dtype=bool)
    hiding = None
    if run.fraction > 0:
        t0 = time.perf_counter()
        hiding = kakurenbo.select_hidden(run.stats[0], run.stats[1], run.stats[2], run.fraction)
        hidden = hiding.hidden
        sw.add("select_s", t0)
    return hidden, hiding


def _order_and_exchange(run: _Run, epoch: int, hidden: np.ndarray):
    """The epoch's sample order on this rank, its exchange plan (local, partial) and, where samples
    move, the exchange, issued now."""
    if run.strategy == "global":
        visible = np.flatnonzero(~hidden)
        order = visible[exchange_plan.global_indices(len(visible), run.m, run.seed, epoch, run.rank)]
        return order, None, None
    p = exchange_plan.rank_plan(run.sizes, run.q, run.seed, epoch, run.rank)
    if run.k == 0:
        return p.order, p, None
    # issued before the epoch's first step: on the device path, before DDP's all-reduces
    where, part = run.where, run.part
    pos = torch.from_numpy(p.send_pos).to(where.samples)
    die = run.kill.get("rank") == run.rank and run.kill.get("epoch") == epoch
    if where.samples_on == "device":
        ex = DeviceExchange(part.x[pos], part.y[pos], part.ids[pos], p.send_counts, p.recv_counts, epoch,
                            die_before_send=die)
    else:
        ex = BackgroundExchange(part.x[pos], part.y[pos], part.ids[pos], p.send_counts, p.recv_counts,
                                run.shared.xgroup, epoch, die_before_send=die)
    return p.order, p, ex


def _train_steps(run: _Run, epoch: int, order: np.ndarray, hidden: np.ndarray, sw: Stopwatch, ex):
    """The epoch's steps over `order` (KAKURENBO's per-sample records kept and merged); the summed
    loss and the step count. A peer lost while the exchange is in flight is an ExchangeError."""
    where, part, net, opt = run.where, run.part, run.net, run.opt
    loss_sum, steps = 0.0, 0
    seen = {"ids": [], "loss": [], "correct": [], "conf": []}
    try:
        for sl in batches(len(order), run.batch_size):
            t0 = time.perf_counter()
            idx = order[sl]
            if run.strategy == "global":
                rows = np.sort(idx)       # sequential reads from the file
                xb, yb = where.batch(run.shared.x_file, rows), where.batch(run.shared.y_all, rows)
                bid = rows
            else:                         # (KAKURENBO, the only reader of bid, runs on global only)
                xb, yb, bid = where.batch(part.x, idx), where.batch(part.y, idx), None
            t0 = sw.add("load_s", t0)
            out = net(xb)
            per_sample = F.cross_entropy(out, yb, reduction="none")
            loss = per_sample.mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            t0 = sw.add("fwd_bwd_s", t0)
            opt.step()
            sw.add("update_s", t0)
            loss_sum += float(loss.item())
            steps += 1
            if run.fraction > 0:
                t0 = time.perf_counter()
                with torch.no_grad():     # kept on the compute device until the epoch's merge
                    seen["ids"].append(bid)
                    seen["loss"].append(per_sample.detach())
                    seen["correct"].append(out.argmax(1) == yb)
                    seen["conf"].append(out.softmax(1).max(1).values)
                sw.add("record_s", t0)
        if run.fraction > 0:
            _refresh_hidden(net, run.shared, where, hidden, seen, run.stats, sw, run.rank, run.m)
    except RuntimeError as exc:
        if ex is not None and not isinstance(exc, ExchangeError):
            raise ExchangeError(f"rank {run.rank}: lost a peer in epoch {epoch} while its shuffle exchange "
                                f"was in flight: {exc}") from exc
        raise
    return loss_sum, steps


def _exchanged(run: _Run, order: np.ndarray, plan, ex):
    """What the rank holds at the epoch's peak, the exchange's outcome and its exposed time; the
    received samples then replace the sent ones."""
    exposed, outcome, part = 0.0, None, run.part
    if run.strategy == "global":
        held = Held.count([(np.asarray(order), np.asarray(order))])  # read from the shared file
    else:
        held = Held.count([(part.x, part.ids)])
    if ex is not None:
        outcome, exposed = ex.wait(run.shared.timeout)
        # The epoch's peak: the partition, the staged copies of the sent samples and the received
        # ones are all in memory now, until the received ones overwrite the sent slots below.
        held = Held.count([(part.x, part.ids), (ex.staged[0], ex.staged[2]), (outcome.x, outcome.ids)])
        ex.staged = None
        # received samples overwrite the sent ones: the partition keeps its size
        pos = torch.from_numpy(plan.send_pos).to(run.where.samples)
        part.x[pos], part.y[pos], part.ids[pos] = outcome.x, outcome.y, outcome.ids
    return held, outcome, exposed


def _refresh_hidden(net, shared: _Shared, where: Where, hidden: np.ndarray, seen: dict, stats: np.ndarray,
                    sw: Stopwatch, rank: int, m: int) -> None:
    """KAKURENBO's epoch end: a forward pass over this rank's share of the hidden samples refreshes
    their loss; every rank's records are merged (summed over ranks on the comm device, then averaged
    per sample) into `stats`."""
    t0 = time.perf_counter()
    hid = np.flatnonzero(hidden)[rank::m]
    if len(hid):
        with torch.no_grad():       # hidden samples: forward only, to refresh their loss
            xb, yb = where.batch(shared.x_file, hid), where.batch(shared.y_all, hid)
            out = net.module(xb)
            seen["ids"].append(hid)
            seen["loss"].append(F.cross_entropy(out, yb, reduction="none"))
            seen["correct"].append(out.argmax(1) == yb)
            seen["conf"].append(out.softmax(1).max(1).values)
    t0 = sw.add("hidden_forward_s", t0)
    n = stats.shape[1]
    merged = torch.zeros((4, n), dtype=torch.float64, device=where.comm)
    sid = torch.from_numpy(np.concatenate(seen["ids"])).to(where.comm)
    for row, key in enumerate(("loss", "correct", "conf")):
        merged[row].index_add_(0, sid, torch.cat(seen[key]).to(where.comm, torch.float64))
    merged[3].index_add_(0, sid, torch.ones(len(sid), dtype=torch.float64, device=where.comm))
    dist.all_reduce(merged)
    merged = merged.cpu()
    cnt = merged[3].numpy()
    got = cnt > 0
    stats[:, got] = merged[:3, got].numpy() / cnt[got]
    sw.add("record_s", t0)
