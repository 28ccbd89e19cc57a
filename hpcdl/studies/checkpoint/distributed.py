"""DCP save/load from N real torch.distributed ranks: gloo ranks on the CPU, or GPU ranks over NCCL.

The state is sharded like an FSDP model: every tensor is a DTensor split along dim 0 over a 1-D
device mesh of the ranks' device ("cpu", or "cuda" with each rank's shards on its own GPU: the
rank runtime gives each rank its GPU and the NCCL group, hpcdl.platform.kit.rank_runtime.placement),
so each rank writes only its shard into one shared checkpoint directory. Rank 0 stages the
directory, all ranks write and fsync their files through DCP (from the GPU, DCP copies each shard
to host memory as it writes: the copy is part of the save), then rank 0 seals it (manifest +
rename) as in the 1-rank path; a load reads the shards back onto the ranks' device.
The ceiling is the same byte count written concurrently by the same ranks (each its share, the way
a save writes: instruments.storage_ceiling), on the GPU preceded by each rank's D2H ceiling (its
shards copied into pinned host memory), instruments.CEILINGS; each rank warms its page cache before
the probe and before the save alike (instruments.warm_pages). This own probe is context (io_cost.csv's
DCP rows), no claim divides by it; the single-process points' ceiling is fio's (compute.py).
`rank_point` runs on every rank via `hpcdl.platform.kit.rank_runtime.launch.run_ranks`; `run_point`
launches it and merges the ranks.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hpcdl.studies.checkpoint import integrity
from hpcdl.studies.checkpoint.instruments import (
    CEILINGS,
    LAYER_PARAMS,
    LAYER_WIDTH,
    PeakRSS,
    check_scratch_budget,
    d2h_ceiling,
    storage_ceiling,
    warm_pages,
)


def sharded_rows(n_params: int, world: int) -> int:
    """Total rows of 1024 values: `n_params` rounded down to a multiple of 1024 * world (even shards)."""
    rows = max(world, n_params // LAYER_WIDTH)
    return rows - rows % world


def sharded_state(n_params: int, seed: int, rank: int, world: int, mesh, device: str = "cpu") -> dict:
    """DTensors of (rows, 1024) fp32 layers, dim 0 split evenly over `world` ranks, each rank's shards
    on `device` (generated on the CPU: the same values on every device)."""
    from torch.distributed.tensor import DTensor, Shard

    rows_total = sharded_rows(n_params, world)
    per_layer = max(world, (LAYER_PARAMS // LAYER_WIDTH) // world * world)
    out, i, left = {}, 0, rows_total
    while left > 0:
        rows = min(left, per_layer)
        g = torch.Generator().manual_seed(seed * 7919 + i * 131 + rank)
        local = torch.randn(rows // world, LAYER_WIDTH, generator=g).to(device)
        out[f"layers.{i}.weight"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        left -= rows
        i += 1
    return out


def _local_bytes(state: dict) -> int:
    return sum(t.to_local().numel() * t.to_local().element_size() for t in state.values())


@dataclass
class _RankRounds:
    """What each of a rank's save/load rounds works on (rank_point)."""

    st: dict
    root: Path
    rank: int
    place: object  # hpcdl.platform's Placement of this rank
    pinned: object  # saver.Snapshot on CUDA (the D2H ceiling's buffers), else None
    local_bytes: int
    rss_interval_s: float
    cold_load: bool

    @property
    def cuda(self) -> bool:
        return self.place.device == "cuda"


def rank_point(n_params: int, scratch_dir: str, repeats: int = 1, seed: int = 0,
               cold_load: bool = True, rss_interval_s: float = 0.002) -> list[dict]:
    """Per-rank timings of `repeats` DCP save/load rounds (called on every rank), on the device the
    rank runtime placed the rank on."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hpcdl.platform import current_placement
    from hpcdl.studies.checkpoint.saver import Snapshot

    place = current_placement()
    cuda = place.device == "cuda"
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
    st = sharded_state(n_params, seed, rank, world, mesh, place.compute)
    local_bytes = _local_bytes(st)
    pinned = Snapshot() if cuda else None  # the D2H ceiling's buffers, allocated outside the timings
    if pinned is not None:
        pinned.prepare(_locals(st))
        torch.cuda.synchronize()
    root = Path(scratch_dir) / f"dcp-ranks{world}-{n_params}"
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    dist.barrier()
    run = _RankRounds(st, root, rank, place, pinned, local_bytes, rss_interval_s, cold_load)
    try:
        rows = [_round(run, rep) for rep in range(repeats)]
        dist.barrier()
    finally:
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def _round(run: _RankRounds, rep: int) -> dict:
    """One round: the ceilings, then a timed save and a timed, checked load; this rank's row."""
    import torch.distributed as dist

    dist.barrier()
    d2h_s = d2h_ceiling(_locals(run.st), run.pinned) if run.pinned is not None else 0.0
    storage_s = storage_ceiling(run.root / f"ceiling-{run.rank}", run.local_bytes)
    dist.barrier()
    ceiling_all_s = _max_over_ranks(d2h_s + storage_s, run.place.comm)
    d2h_all_s = _max_over_ranks(d2h_s, run.place.comm) if run.cuda else float("nan")
    name = f"rep-{rep:03d}"
    save = _timed_save(run, name)
    load = _timed_load(run, run.root / name)
    if run.rank == 0:
        shutil.rmtree(run.root / name)
        integrity.fsync_dir(run.root)
    return {"repeat": rep, "rank": run.rank, "local_bytes": run.local_bytes, "placement": run.place.label,
            "d2h_ceiling_s": d2h_all_s, "file_bytes": save["file_bytes"],
            "durable_local_s": save["durable_local_s"], "durable_s": save["durable_s"],
            "commit_s": save["commit_s"], "verify_s": load["verify_s"], "load_s": load["load_s"],
            "ceiling_s": ceiling_all_s, "save_peak_extra_rss_bytes": save["peak_extra_rss_bytes"],
            "load_peak_extra_rss_bytes": load["peak_extra_rss_bytes"], "roundtrip_ok": load["ok"]}


def _timed_save(run: _RankRounds, name: str) -> dict:
    """Every rank writes its shards through DCP into rank 0's staging directory; rank 0 seals it."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    tmp_holder = [str(integrity.new_tmp_dir(run.root, name)) if run.rank == 0 else None]
    dist.broadcast_object_list(tmp_holder, src=0)
    tmp = Path(tmp_holder[0])
    warm_pages(run.root, run.local_bytes)  # as the probe did before its timed write
    dist.barrier()
    file_bytes = None
    t0 = time.perf_counter()
    with PeakRSS(run.rss_interval_s) as save_mem:
        dcp.save(run.st, storage_writer=dcp.FileSystemWriter(str(tmp)))  # fsyncs its files
        durable_local = time.perf_counter() - t0
        dist.barrier()
        durable_s = time.perf_counter() - t0  # rank 0's below includes its fsync sweep
        if run.rank == 0:
            c = integrity.commit(tmp, run.root / name, "dcp")
            file_bytes, durable_s = c.file_bytes, c.durable_at - t0
        dist.barrier()
    return {"file_bytes": file_bytes, "durable_local_s": durable_local, "durable_s": durable_s,
            "commit_s": time.perf_counter() - t0, "peak_extra_rss_bytes": save_mem.peak_extra_bytes}


def _timed_load(run: _RankRounds, path: Path) -> dict:
    """Rank 0 verifies the sealed checkpoint, every rank loads its shards back (cold where asked)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    if run.rank == 0 and run.cold_load:
        integrity.evict_from_page_cache(path)
    dist.barrier()
    t1 = time.perf_counter()
    with PeakRSS(run.rss_interval_s) as load_mem:
        if run.rank == 0:
            integrity.verify(path)
        dist.barrier()
        verify_s = time.perf_counter() - t1
        back = {k: _empty_like_dtensor(v) for k, v in run.st.items()}
        dcp.load(back, storage_reader=dcp.FileSystemReader(str(path)))
        if run.cuda:  # clocks read after GPU work read its end
            torch.cuda.synchronize()
        dist.barrier()
    load_s = time.perf_counter() - t1
    ok = all(torch.equal(back[k].to_local(), st.to_local()) for k, st in run.st.items())
    return {"verify_s": verify_s, "load_s": load_s, "ok": ok,
            "peak_extra_rss_bytes": load_mem.peak_extra_bytes}


def _empty_like_dtensor(t):
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(torch.empty_like(t.to_local()), t.device_mesh, t.placements, run_check=False)


def _locals(state: dict) -> dict:
    return {k: t.to_local() for k, t in state.items()}


def _max_over_ranks(x: float, comm: str = "cpu") -> float:
    """The largest `x` of all ranks, through the default group on its collectives' device `comm`
    (a CUDA tensor over NCCL, a CPU tensor over gloo)."""
    import torch.distributed as dist

    t = torch.tensor([x], dtype=torch.float64, device=comm)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def run_point(ranks: int, n_params: int, scratch_dir: str, *, repeats: int = 1, seed: int = 0,
              cold_load: bool = True, rss_interval_s: float = 0.002,
              scratch_limit_mb: float | None = None, timeout_s: float = 600.0,
              device: str = "cpu", gpu_sharing: bool = False) -> list[dict]:
    """Launch `ranks` ranks on `device` for one DCP point; one record per repeat (times = slowest
    rank). On cuda one rank per GPU over NCCL; ranks sharing a GPU (gpu_sharing) talk over gloo
    and their rows say so (`placement`)."""
    from hpcdl.platform import run_ranks

    Path(scratch_dir).mkdir(parents=True, exist_ok=True)
    state_bytes = sharded_rows(n_params, ranks) * LAYER_WIDTH * 4
    check_scratch_budget(Path(scratch_dir), 2 * state_bytes + (1 << 20),
                         None if scratch_limit_mb is None else int(scratch_limit_mb * 2**20))
    per_rank = run_ranks("hpcdl.studies.checkpoint.distributed:rank_point", ranks,
                         {"n_params": n_params, "scratch_dir": str(Path(scratch_dir).resolve()),
                          "repeats": repeats, "seed": seed, "cold_load": cold_load,
                          "rss_interval_s": rss_interval_s},
                         # glibc defaults: the peak-RSS columns must mean what they mean for the
                         # formats saved outside ranks
                         timeout_s=timeout_s, threads_per_rank=1, keep_heap=False,
                         device=device, gpu_sharing=gpu_sharing)
    rows = []
    for rep in range(repeats):
        rr = [r[rep] for r in per_rank]
        nbytes = sum(r["local_bytes"] for r in rr)
        durable = max(r["durable_s"] for r in rr)
        rows.append({
            "device": device, "placement": " / ".join(sorted({r["placement"] for r in rr})),
            "format": "dcp", "mode": "sync", "process_group": True, "ranks": ranks, "n_params": nbytes // 4,
            "repeat": rep, "state_bytes": nbytes, "file_bytes": rr[0]["file_bytes"],
            "blocking_s": max(r["commit_s"] for r in rr),
            "durable_s": durable, "commit_s": max(r["commit_s"] for r in rr),
            "load_s": max(r["load_s"] for r in rr), "verify_s": max(r["verify_s"] for r in rr),
            "write_bw_bytes_per_s": rr[0]["file_bytes"] / durable, "ceiling_s": rr[0]["ceiling_s"],
            "ceiling_bw_bytes_per_s": nbytes / rr[0]["ceiling_s"], "ceiling": CEILINGS[device],
            "ceiling_source": "own probe",  # not fio's (compute.py): the ranks write it concurrently
            "d2h_ceiling_s": rr[0]["d2h_ceiling_s"],
            "save_peak_extra_rss_bytes": sum(r["save_peak_extra_rss_bytes"] for r in rr),
            "load_peak_extra_rss_bytes": sum(r["load_peak_extra_rss_bytes"] for r in rr),
            "roundtrip_ok": all(r["roundtrip_ok"] for r in rr), "cold_load": bool(cold_load)})
    return rows

