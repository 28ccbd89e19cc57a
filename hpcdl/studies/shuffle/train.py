"""The rank function: data-parallel training (DDP over gloo) with one shuffling strategy.

Run by `hpcdl.platform.rank_runtime.launch.run_ranks("hpcdl.studies.shuffle.train:train_rank", M,
kwargs)`; the process group is already initialised. Trains once per entry of `runs` (seed, KAKURENBO
fraction, round: hpcdl.studies.shuffle.sweep), each from a fresh model, and returns this rank's
per-epoch records of every run.

Strategies
- global: every epoch a shared permutation of all N (DistributedSampler semantics); each
  rank reads its share from the memory-mapped cache (the "shared file system").
- local: each rank reads its partition once and shuffles only it.
- partial: as local, and during epoch e's compute a background thread sends k = Q*N/M of
  the partition's samples to peers and receives k, which replace the sent ones for epoch
  e+1 (so a rank holds at most N/M + k distinct samples; `samples_held` counts them from the
  buffers at the epoch's peak, `held_rows` the sample rows in memory then, staged copies included).
KAKURENBO (global only): hide easy samples from the backward pass (hpcdl.studies.shuffle.kakurenbo).
Its cost is timed apart from the work it saves: `record_s` (keeping each sample's loss, correctness
and confidence, and merging them over ranks), `select_s` (choosing the hidden samples) and
`hidden_forward_s` (the forward pass that refreshes the hidden samples' loss).
"""

from __future__ import annotations

import gc
import os
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from hpcdl.studies.shuffle import exchange_plan, kakurenbo, partition
from hpcdl.studies.shuffle import model as model_mod
from hpcdl.studies.shuffle.exchange import BackgroundExchange, ExchangeError

STRATEGIES = ("global", "local", "partial")


class _Stopwatch:
    def __init__(self):
        self.t = {}

    def add(self, key: str, t0: float) -> float:
        now = time.perf_counter()
        self.t[key] = self.t.get(key, 0.0) + now - t0
        return now


class _Held:
    """What a rank holds, counted from its buffers: distinct sample ids, and sample rows in memory
    (a staged copy of a sample being sent is a second row of the same sample)."""

    def __init__(self, samples: int, rows: int):
        self.samples, self.rows = samples, rows

    @classmethod
    def count(cls, buffers) -> _Held:
        """`buffers`: (data, ids) pairs; data's first axis must match its ids row for row."""
        ids = []
        for data, idx in buffers:
            if len(data) != len(idx):
                raise RuntimeError(f"buffer holds {len(data)} samples but {len(idx)} ids")
            ids.append(np.asarray(idx).ravel())
        all_ids = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
        return cls(int(len(np.unique(all_ids))), int(len(all_ids)))


def _batches(n: int, batch_size: int) -> list[slice]:
    # drop nothing: the last, smaller batch still trains (every rank has the same count)
    return [slice(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


def _validate(net, x_val, y_val, rank, m) -> tuple[float, float]:
    # DDP evaluates with rank 0's buffers (BN running stats): make that explicit.
    for buf in net.module.buffers():
        dist.broadcast(buf, 0)
    net.module.eval()
    with torch.no_grad():
        xs, ys = torch.from_numpy(np.ascontiguousarray(x_val[rank::m])), torch.from_numpy(y_val[rank::m])
        out = net.module(xs)
        stats = torch.tensor([(out.argmax(1) == ys).sum().item(),
                              F.cross_entropy(out, ys, reduction="sum").item(), len(ys)], dtype=torch.float64)
    net.module.train()
    dist.all_reduce(stats)
    return float(stats[0] / stats[2]), float(stats[1] / stats[2])


def train_rank(*, data: dict, strategy: str, q: float, partitioning: str, alpha: float, runs: list[dict],
               epochs: int, batch_size: int, lr: float, momentum: float, model: dict,
               kill: dict | None = None, exchange_timeout_s: float | None = None,
               return_ids: bool = False) -> dict:
    """`runs`: [{"seed", "kakurenbo_fraction", "round", "slot"}], trained in this order. `kill` (tests)
    makes a rank die in the exchange of one epoch of the first run."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    exchange_plan.check_q(q)
    if not runs:
        raise ValueError("runs is empty: a point trains at least once")
    for run in runs:
        kakurenbo.check_fraction(run["kakurenbo_fraction"])
        if run["kakurenbo_fraction"] > 0 and strategy != "global":
            raise ValueError("KAKURENBO is run on top of global shuffling (strategy 'global')")
    timeout = float(exchange_timeout_s or os.environ.get("HPCDL_COLLECTIVE_TIMEOUT_S", "60"))
    shared = _Shared(data, timeout, partial=strategy == "partial")
    records, ids = [], None
    for i, run in enumerate(runs):
        recs, ids = _train_one(shared, strategy=strategy, q=q, partitioning=partitioning, alpha=alpha,
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
    """What every run of a point shares: the memory-mapped data and the exchange's gloo group."""

    def __init__(self, data: dict, timeout: float, partial: bool):
        self.timeout = timeout
        self.x_file = np.load(data["x_train"], mmap_mode="r")
        self.y_all = np.load(data["y_train"])
        self.x_val, self.y_val = np.load(data["x_val"], mmap_mode="r"), np.load(data["y_val"])
        self.xgroup = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout)) if partial else None


def _train_one(shared: _Shared, *, strategy: str, q: float, partitioning: str, alpha: float, seed: int,
               kakurenbo_fraction: float, epochs: int, batch_size: int, lr: float, momentum: float,
               model: dict, kill: dict) -> tuple[list[dict], np.ndarray | None]:
    rank, m = dist.get_rank(), dist.get_world_size()
    timeout, xgroup = shared.timeout, shared.xgroup
    x_file, y_all, x_val, y_val = shared.x_file, shared.y_all, shared.x_val, shared.y_val
    torch.manual_seed(seed)
    n = len(y_all)
    sizes = partition.partition_sizes(n, m)
    net = DistributedDataParallel(model_mod.build(model["kind"], model["width"], model["depth"]))
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)

    load0 = time.perf_counter()
    if strategy == "global":
        ids = None
    else:
        ids = partition.make_partition(partitioning, y_all, m, seed, alpha)[rank]
        x_part = torch.from_numpy(np.ascontiguousarray(x_file[ids]))
        y_part = torch.from_numpy(y_all[ids])
        ids_part = torch.from_numpy(ids.astype(np.int64))
    initial_load_s = time.perf_counter() - load0
    k = exchange_plan.exchange_count(n, m, q) if strategy == "partial" else 0

    stats = np.zeros((3, n))          # last loss, correct, confidence per sample (KAKURENBO)
    stats[0] = np.inf
    records = []
    for epoch in range(epochs):
        sw = _Stopwatch()
        wall0 = time.perf_counter()
        hidden = np.zeros(n, dtype=bool)
        hiding = None
        if kakurenbo_fraction > 0:
            t0 = time.perf_counter()
            hiding = kakurenbo.select_hidden(stats[0], stats[1], stats[2], kakurenbo_fraction)
            hidden = hiding.hidden
            sw.add("select_s", t0)
        # cosine decay settles the last epochs, so "final accuracy" is not one noisy step's luck
        epoch_lr = lr * 0.5 * (1 + np.cos(np.pi * epoch / epochs)) * kakurenbo.lr_scale(float(hidden.mean()))
        for g in opt.param_groups:
            g["lr"] = epoch_lr
        ex = None
        if strategy == "global":
            visible = np.flatnonzero(~hidden)
            order = visible[exchange_plan.global_indices(len(visible), m, seed, epoch, rank)]
            source_x, source_y, source_ids = x_file, y_all, None
        else:
            p = exchange_plan.rank_plan(sizes, q, seed, epoch, rank)
            order = p.order
            source_x, source_y, source_ids = x_part, y_part, ids_part
            if k > 0:
                pos = torch.from_numpy(p.send_pos)
                ex = BackgroundExchange(
                    x_part[pos], y_part[pos], ids_part[pos], p.send_counts,
                    p.recv_counts, xgroup, epoch,
                    die_before_send=(kill.get("rank") == rank and kill.get("epoch") == epoch))
        loss_sum, steps = 0.0, 0
        seen = {"ids": [], "loss": [], "correct": [], "conf": []}
        try:
            for sl in _batches(len(order), batch_size):
                t0 = time.perf_counter()
                idx = order[sl]
                if strategy == "global":
                    rows = np.sort(idx)       # sequential reads from the file
                    xb = torch.from_numpy(np.ascontiguousarray(source_x[rows]))
                    yb = torch.from_numpy(source_y[rows])
                    bid = rows
                else:
                    ti = torch.from_numpy(idx)
                    xb, yb, bid = source_x[ti], source_y[ti], source_ids[ti].numpy()
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
                if kakurenbo_fraction > 0:
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        prob = out.softmax(1)
                        seen["ids"].append(bid)
                        seen["loss"].append(per_sample.detach().numpy())
                        seen["correct"].append((out.argmax(1) == yb).numpy())
                        seen["conf"].append(prob.max(1).values.numpy())
                    sw.add("record_s", t0)
            if kakurenbo_fraction > 0:
                t0 = time.perf_counter()
                hid = np.flatnonzero(hidden)[rank::m]
                if len(hid):
                    with torch.no_grad():       # hidden samples: forward only, to refresh their loss
                        xb = torch.from_numpy(np.ascontiguousarray(x_file[hid]))
                        yb = torch.from_numpy(y_all[hid])
                        out = net.module(xb)
                        seen["ids"].append(hid)
                        seen["loss"].append(F.cross_entropy(out, yb, reduction="none").numpy())
                        seen["correct"].append((out.argmax(1) == yb).numpy())
                        seen["conf"].append(out.softmax(1).max(1).values.numpy())
                t0 = sw.add("hidden_forward_s", t0)
                merged = torch.zeros((4, n), dtype=torch.float64)
                sid = np.concatenate(seen["ids"])
                for row, key in enumerate(("loss", "correct", "conf")):
                    merged[row].index_add_(0, torch.from_numpy(sid), torch.from_numpy(
                        np.concatenate(seen[key]).astype(np.float64)))
                merged[3].index_add_(0, torch.from_numpy(sid), torch.ones(len(sid), dtype=torch.float64))
                dist.all_reduce(merged)
                cnt = merged[3].numpy()
                got = cnt > 0
                stats[:, got] = merged[:3, got].numpy() / cnt[got]
                sw.add("record_s", t0)
        except RuntimeError as exc:
            if ex is not None and not isinstance(exc, ExchangeError):
                raise ExchangeError(f"rank {rank}: lost a peer in epoch {epoch} while its shuffle exchange "
                                    f"was in flight: {exc}") from exc
            raise
        exposed, outcome = 0.0, None
        if strategy == "global":
            held = _Held.count([(np.asarray(order), np.asarray(order))])  # read from the shared file
        else:
            held = _Held.count([(x_part, ids_part)])
        if ex is not None:
            outcome, exposed = ex.wait(timeout)
            # The epoch's peak: the partition, the staged copies of the sent samples and the received
            # ones are all in memory now, until the received ones overwrite the sent slots below.
            held = _Held.count([(x_part, ids_part), (ex.staged[0], ex.staged[2]), (outcome.x, outcome.ids)])
            ex.staged = None
            # received samples overwrite the sent ones: the partition keeps its size
            pos = torch.from_numpy(p.send_pos)
            x_part[pos], y_part[pos], ids_part[pos] = outcome.x, outcome.y, outcome.ids
        epoch_s = time.perf_counter() - wall0
        val0 = time.perf_counter()
        val_acc, val_loss = _validate(net, x_val, y_val, rank, m)
        t = sw.t
        records.append({
            "epoch": epoch, "rank": rank, "world_size": m,
            "train_loss": loss_sum / max(1, steps), "val_acc": val_acc, "val_loss": val_loss,
            "samples_trained": len(order), "samples_sent": k if ex else 0, "samples_recv": k if ex else 0,
            "bytes_sent": outcome.bytes_sent if outcome else 0,
            "bytes_recv": outcome.bytes_recv if outcome else 0,
            "exchange_s": outcome.time_s if outcome else 0.0, "exposed_exchange_s": exposed,
            "load_s": t.get("load_s", 0.0) + (initial_load_s if epoch == 0 else 0.0),
            "fwd_bwd_s": t.get("fwd_bwd_s", 0.0), "update_s": t.get("update_s", 0.0),
            "hidden_forward_s": t.get("hidden_forward_s", 0.0), "record_s": t.get("record_s", 0.0),
            "select_s": t.get("select_s", 0.0),
            "compute_s": t.get("fwd_bwd_s", 0.0) + t.get("update_s", 0.0) + t.get("hidden_forward_s", 0.0),
            "epoch_s": epoch_s, "val_s": time.perf_counter() - val0,
            "samples_held": held.samples, "held_rows": held.rows,
            "hidden": int(hidden.sum()), "n_train": n, "moved_back": hiding.moved_back if hiding else 0,
            "lr": epoch_lr,
            "partition_skew_tv": (partition.label_skew(y_all, [ids_part.numpy()]) if ids is not None
                                  else float("nan")),
        })
    return records, (ids_part.numpy().copy() if ids is not None else None)
