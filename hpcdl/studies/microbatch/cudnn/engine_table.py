"""μ-cuDNN's engine table for a config's networks, on one GPU (issues 27, 42): the `make gpu` step

    python -m hpcdl.studies.microbatch.cudnn.engine_table --config configs/gpu.yaml \\
        --out 'tests/data/microbatch_cudnn_{gpu}.csv' --budget-s 55

benchmarks every conv layer of μ-cuDNN's experiment's networks (microbatch.cudnn.networks, or
microbatch.networks; DeepBench's layers as microbatch.deepbench_layers) at microbatch.batch_size and
image_size: every cuDNN plan (hpcdl.studies.microbatch.cudnn.bench) of each kernel at each micro-batch
size of microbatch.policies, `repeats`/`warmup`/`cudnn.screen_ratio` as configured, TF32 as
microbatch.cudnn.tf32, plans over the network's largest limit (microbatch.cudnn.limits_mib, DeepBench's
cudnn.deepbench_limits_mib where set) marked over_limit. `{gpu}` in --out becomes the GPU's slug
(NVIDIA H100 80GB HBM3 -> h100). The table is written header first and appended one layer at a time
(flushed), so a kill keeps every finished layer; the first layer always runs, and no later one is
started once the budget cannot cover the slowest layer so far. A sidecar <table>.provenance.json
(rewritten atomically after each layer) records the device (cuda_record), torch and cuDNN versions
(frontend, backend, torch's), the command, the setting, the dates and which layers are done (status
"running" left behind: the process was killed). Without CUDA, or without the cuDNN frontend module, it
prints why and exits 0 having written nothing; a bad config exits 2; a layer that raised gives one
skipped row naming the error, the others still run, and the exit status is 1.

Columns: FIELDS (limits.COLUMNS among them). Layer names repeat across networks (conv1), so a table
is planned one network at a time: `load(path, network)`.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import shlex
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from hpcdl.platform import (
    ConfigError,
    atomic_write_json,
    atomic_write_text,
    config_hash,
    git_commit,
    gpu_slug,
    load_config,
    provenance_path,
)
from hpcdl.studies.microbatch.common.dp import policy_sizes
from hpcdl.studies.microbatch.common.workloads import network
from hpcdl.studies.microbatch.cudnn.limits import COLUMNS, MiB
from hpcdl.studies.microbatch.cudnn.plan import cudnn_networks, network_limits_mib

FIELDS = (
    "network",
    "layer",
    "count",
    "kernel",
    "micro_batch",
    "engine",
    "plan_index",
    "plan_count",
    "status",
    "reason",
    "alignment",
    "workspace_bytes",
    "measured_workspace_bytes",
    "time_s",
    "time_median_s",
    "repeats",
    "ran",
    "bench_wall_s",
    "batch_size",
    "image_size",
)
KERNEL_COUNT = 3  # forward, backward_data, backward_filter


def setting(cfg: dict) -> dict:
    """What the table measures, from a validated config's microbatch block: μ-cuDNN's experiment's
    networks (microbatch.cudnn.networks, or microbatch.networks), each benchmarked up to its largest
    workspace limit (DeepBench's own where microbatch.cudnn.deepbench_limits_mib is set)."""
    b = cfg["microbatch"]
    batch = int(b["batch_size"])
    nets = cudnn_networks(b)
    largest = {n: int(max(network_limits_mib(b, n)) * MiB) for n in nets}
    return {
        "networks": nets,
        "batch_size": batch,
        "image_size": int(b["image_size"]),
        "deepbench_scale": float(b["deepbench_scale"]),
        "deepbench_layers": str(b.get("deepbench_layers", "subset")),
        "sizes": sorted(set().union(*(policy_sizes(p, batch) for p in b["policies"]))),
        "repeats": int(b["repeats"]),
        "warmup": int(b["warmup"]),
        "screen_ratio": b["cudnn"].get("screen_ratio"),
        "tf32": bool(b["cudnn"]["tf32"]),
        "max_workspace_bytes": max(largest.values()),
        "network_max_workspace_bytes": largest,
        "seed": int(b["seed"]),
    }


def layers_of(s: dict) -> list[tuple[str, object]]:
    """(network, ConvLayer) for every layer the table covers, in order."""
    return [(n, ly) for n in s["networks"]
            for ly in network(n, s["image_size"], s["deepbench_scale"], s.get("deepbench_layers", "subset"))]


def start_table(path: Path) -> None:
    """The table with its header only (atomic: a previous table is replaced whole)."""
    atomic_write_text(path, ",".join(FIELDS) + "\n")


def append_rows(path: Path, rows: list[dict]) -> None:
    """One finished layer's rows, appended and flushed to disk (a later kill keeps them)."""
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="raise")
        w.writerows(rows)
        f.flush()
        os.fsync(f.fileno())


def load(path: str | Path, network_name: str) -> pd.DataFrame:
    """One network's rows of an engine table, as hpcdl.studies.microbatch.cudnn.limits plans them."""
    df = pd.read_csv(path, keep_default_na=False, na_values=[""])
    missing = [c for c in ("network", *COLUMNS, "status") if c not in df.columns]
    if missing:
        raise ValueError(f"engine table {path} lacks column(s) {', '.join(missing)}")
    got = df[df["network"] == network_name].reset_index(drop=True)
    if got.empty:
        raise ValueError(f"engine table {path} has no rows of network {network_name!r} "
                         f"(it has {', '.join(sorted(set(df['network'])))})")
    return got


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def _unavailable() -> str | None:
    """Why this machine cannot record the table (None: it can)."""
    import torch

    if not torch.cuda.is_available():
        return "the μ-cuDNN engine table needs CUDA: torch sees no GPU here; nothing written"
    if importlib.util.find_spec("cudnn") is None:
        return ("the μ-cuDNN engine table needs the cudnn frontend (Python package "
                "nvidia-cudnn-frontend, module `cudnn`), which is not installed; nothing written")
    return None


def _progress(total: int):
    if os.environ.get("HPCDL_PROGRESS", "1") == "0":
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="engine table", unit="graph", mininterval=1.0)


def budget_spent(done: int, left_s: float, slowest_s: float) -> bool:
    """Whether to stop before the next layer: once the budget left cannot cover the slowest layer so
    far. The first layer always runs (no layer has been timed yet), so every call makes progress: the
    setting up before it (the device record, the libraries' versions) can itself pass a tiny budget,
    which on the H200 of 2026-11-27 left a table with no layer."""
    return done > 0 and left_s < slowest_s


def record(args: argparse.Namespace, cfg: dict, s: dict, out: Path) -> int:
    """Benchmark every layer into `out` (CUDA and the binding present); the exit status."""
    import torch

    from hpcdl.platform import cuda_record
    from hpcdl.studies.microbatch.choice.algorithms import KernelCall
    from hpcdl.studies.microbatch.cudnn.bench import benchmark_layer
    from hpcdl.studies.microbatch.cudnn.engines import library_record

    t0 = time.time()
    todo = layers_of(s)
    meta = {
        "table": out.name,
        "command": "python -m hpcdl.studies.microbatch.cudnn.engine_table " + shlex.join(args.argv),
        "config": str(args.config),
        "config_hash": config_hash(cfg["microbatch"]),
        "setting": s,
        "device": cuda_record(),
        "torch": torch.__version__,
        "cudnn": library_record(),
        "git_commit": git_commit(),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "budget_s": args.budget_s,
        "start_time": _iso(t0),
        "status": "running",
        "layers_done": [],
        "layers_failed": [],
        "rows": 0,
    }
    side = provenance_path(out)
    start_table(out)
    atomic_write_json(side, meta)
    per_layer = KERNEL_COUNT * len(s["sizes"])
    bar = _progress(len(todo) * per_layer)
    slowest, counts = 0.0, {}
    for i, (net, layer) in enumerate(todo):
        left = args.budget_s - (time.time() - t0) if args.budget_s else float("inf")
        if budget_spent(i, left, slowest):
            meta["status"] = "stopped at the budget"
            meta["layers_left"] = [f"{n}/{ly.name}" for n, ly in todo[i:]]
            break
        t1 = time.time()
        extra = {"network": net, "batch_size": s["batch_size"], "image_size": s["image_size"]}
        try:
            call = KernelCall(layer, s["batch_size"], "cuda", seed=s["seed"] + i)
            largest = s.get("network_max_workspace_bytes", {}).get(net, s["max_workspace_bytes"])
            rows, _ = benchmark_layer(call, s["sizes"], s["repeats"], s["warmup"], largest, s["tf32"],
                                      progress=bar, screen_ratio=s.get("screen_ratio"))
            del call
        except Exception as exc:  # noqa: BLE001 - one layer's failure is recorded; the others still run
            rows = [{"layer": layer.name, "count": layer.count, "kernel": "", "micro_batch": "",
                     "engine": "", "plan_index": -1, "status": "skipped",
                     "reason": f"the layer failed: {type(exc).__name__}: {exc}"}]
            meta["layers_failed"].append(f"{net}/{layer.name}")
        torch.cuda.empty_cache()
        if bar is not None:  # a failed layer's graphs count as done too
            bar.update((i + 1) * per_layer - bar.n)
        append_rows(out, [{**r, **extra} for r in rows])
        for r in rows:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        slowest = max(slowest, time.time() - t1)
        if f"{net}/{layer.name}" not in meta["layers_failed"]:
            meta["layers_done"].append(f"{net}/{layer.name}")
        meta.update(rows=meta["rows"] + len(rows), end_time=_iso(time.time()))
        meta["duration_s"] = round(time.time() - t0, 3)
        atomic_write_json(side, meta)
    else:
        meta["status"] = "complete" if not meta["layers_failed"] else "complete with failed layers"
    if bar is not None:
        bar.close()
    meta.update(status_counts=counts, end_time=_iso(time.time()), duration_s=round(time.time() - t0, 3))
    atomic_write_json(side, meta)
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"engine table: {meta['rows']} rows ({statuses}), {len(meta['layers_done'])}/{len(todo)} layers "
          f"in {meta['duration_s']:.1f} s, {meta['status']} -> {out}")
    return 1 if meta["layers_failed"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="config whose microbatch block sets the layers")
    parser.add_argument("--out", required=True, help="CSV path; {gpu} becomes the GPU's slug (e.g. h100)")
    parser.add_argument("--budget-s", type=float, default=55.0,
                        help="start no layer past this many seconds (0: no budget; default 55)")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(args.config)
        s = setting(cfg)
        layers_of(s)  # a bad network or image size is a config error, named before any GPU work
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"engine_table: bad config {args.config}: {exc}", file=sys.stderr)
        return 2
    if not args.out.endswith(".csv"):
        print(f"engine_table: --out must be a .csv path, got {args.out}", file=sys.stderr)
        return 2
    if args.budget_s < 0:
        print(f"engine_table: --budget-s must be >= 0, got {args.budget_s}", file=sys.stderr)
        return 2
    why = _unavailable()
    if why is not None:
        print(f"engine_table: {why}")
        return 0
    import torch

    from hpcdl.studies.microbatch.cudnn.engines import binding

    try:
        binding()  # installed, but a release without choosing plans by index is a setup error
    except RuntimeError as exc:
        print(f"engine_table: {exc}; nothing written", file=sys.stderr)
        return 1

    out = Path(args.out.replace("{gpu}", gpu_slug(torch.cuda.get_device_name(0))))
    out.parent.mkdir(parents=True, exist_ok=True)
    return record(args, cfg, s, out)


if __name__ == "__main__":
    sys.exit(main())
