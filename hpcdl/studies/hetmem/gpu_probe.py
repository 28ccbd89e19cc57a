"""Real two-tier placements on a CUDA GPU: device memory (fast tier) vs pinned host memory mapped
into the GPU's address space (slow tier, read and written by the kernels over the host link).

    python -m hpcdl.studies.hetmem.gpu_probe --out DIR [--device auto|cuda|cpu] [--scale 1.0] [--repeats 5]

Each mini-app (STREAM triad, 3-D stencil, CG, GUPS, an MLP training step) runs in torch with its
named objects each placed in one tier: all-fast, all-slow, each object alone in fast memory, and
random object subsets. A "slow" object is a zero-copy CUDA view of pinned host memory (through
`__cuda_array_interface__`; with unified addressing the device pointer is the host pointer), so
the GPU kernels really access host memory; temporaries torch allocates stay in device memory.
The measured times are real hardware; the estimate beside them is the differential estimate at
object granularity and with a single window: T = s*T_fast + (1-s)*T_slow, with s the share of the
bytes the kernel moves that belong to the fast objects, counted from the kernel's operations
(no PEBS-like sampler exists for GPU kernels here). Writes DIR/gpu_placements.csv and
DIR/gpu_summary.json and prints both. Needs torch with CUDA; on a machine without it, says so.
Depends on torch, numpy and pandas only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd


def _device(choice: str):
    import torch

    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return None
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    return torch.device("cuda")


class _Mapped:
    """A pinned host tensor exposed to CUDA as a device array (zero-copy)."""

    def __init__(self, host):
        self._host = host  # keeps the pinned buffer alive as long as the view
        typestr = {"torch.float32": "<f4", "torch.float64": "<f8", "torch.int64": "<i8", "torch.int32": "<i4"}
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape),
            "typestr": typestr[str(host.dtype)],
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


def _check_zero_copy(dev) -> bool:
    """The mapped view aliases host memory: a GPU write is seen by the host without a copy."""
    import torch

    v = place(torch.zeros(1024), False, dev)
    v.add_(3.0)
    torch.cuda.synchronize()
    return bool((v._hetmem_host == 3.0).all()) and v.is_cuda  # noqa: SLF001


# ------------------------------------------------------------------------------------------ apps
# Each app: objects(scale) -> {name: CPU tensor}, step(objs) runs the kernel once, and bytes(objs)
# -> bytes each object moves per step (the estimator's access shares).
def _stream(scale):
    import torch

    n = int(2**24 * scale)
    objs = {
        "a": torch.zeros(n, dtype=torch.float64),
        "b": torch.rand(n, dtype=torch.float64),
        "c": torch.rand(n, dtype=torch.float64),
    }

    def step(o):
        torch.add(o["b"], o["c"], alpha=3.0, out=o["a"])

    return objs, step, {k: 8 * n for k in objs}


def _stencil(scale):
    import torch

    n = max(16, int(192 * scale ** (1 / 3)))
    objs = {"u": torch.rand(n, n, n, dtype=torch.float64), "v": torch.zeros(n, n, n, dtype=torch.float64)}

    def sweep(u, v):
        c = slice(1, -1)
        v[c, c, c] = 0.4 * u[c, c, c] + 0.1 * (
            u[:-2, c, c] + u[2:, c, c] + u[c, :-2, c] + u[c, 2:, c] + u[c, c, :-2] + u[c, c, 2:]
        )

    def step(o):  # two sweeps: u -> v -> u, so both grids play both roles
        sweep(o["u"], o["v"])
        sweep(o["v"], o["u"])

    return objs, step, {"u": 8 * n**3 * 8, "v": 8 * n**3 * 8}


def _cg(scale):
    import torch

    m = max(32, int(1024 * scale**0.5))
    n = m * m
    g = torch.arange(n)
    gy, gx = g // m, g % m
    rows, cols = [g], [g]
    for ok, nb in ((gx > 0, g - 1), (gx < m - 1, g + 1), (gy > 0, g - m), (gy < m - 1, g + m)):
        rows.append(g[ok])
        cols.append(nb[ok])
    rows, cols = torch.cat(rows), torch.cat(cols)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    rows, cols = perm[rows], perm[cols]
    vals = torch.where(rows == cols, 4.0, -1.0).to(torch.float64)
    order = torch.argsort(rows * n + cols)
    rows, cols, vals = rows[order], cols[order], vals[order]
    rowptr = torch.zeros(n + 1, dtype=torch.int64)
    rowptr[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
    objs = {
        "rowptr": rowptr,
        "colidx": cols.to(torch.int64),
        "values": vals,
        "x": torch.zeros(n, dtype=torch.float64),
        "r": torch.ones(n, dtype=torch.float64),
        "p": torch.ones(n, dtype=torch.float64),
        "q": torch.zeros(n, dtype=torch.float64),
    }

    def step(o):
        a = torch.sparse_csr_tensor(
            o["rowptr"], o["colidx"], o["values"], size=(n, n), check_invariants=False
        )
        o["q"].copy_(torch.mv(a, o["p"]))
        rr = torch.dot(o["r"], o["r"])
        alpha = rr / torch.dot(o["p"], o["q"])
        o["x"].add_(alpha * o["p"])
        o["r"].sub_(alpha * o["q"])
        beta = torch.dot(o["r"], o["r"]) / rr
        o["p"].mul_(beta).add_(o["r"])

    nnz = len(cols)
    by = {
        "rowptr": 8 * n,
        "colidx": 8 * nnz,
        "values": 8 * nnz,
        "p": 8 * nnz + 8 * n * 5,
        "q": 8 * n * 3,
        "x": 16 * n,
        "r": 8 * n * 6,
    }
    return objs, step, by


def _gups(scale):
    import torch

    log2 = max(16, int(np.log2(2**26 * scale)))
    n, updates = 2**log2, 2 ** (log2 - 2)
    g = torch.Generator().manual_seed(0)
    objs = {
        "table": torch.arange(n, dtype=torch.int64),
        "ran": torch.randint(0, 2**62, (updates,), generator=g, dtype=torch.int64),
    }

    def step(o):
        idx = o["ran"] & (n - 1)
        o["table"].index_put_((idx,), o["table"][idx] ^ o["ran"])

    return objs, step, {"table": 16 * updates, "ran": 16 * updates}


def _mlp(scale):
    import torch

    b, i, h, k = 256, 1024, max(64, int(4096 * scale**0.5)), 256
    g = torch.Generator().manual_seed(0)
    objs = {
        "inputs": torch.rand(b, i, generator=g),
        "targets": torch.rand(b, k, generator=g),
        "w1": torch.randn(i, h, generator=g) * 0.01,
        "w2": torch.randn(h, k, generator=g) * 0.01,
        "hidden": torch.zeros(b, h),
        "grad_hidden": torch.zeros(b, h),
        "grad_w1": torch.zeros(i, h),
        "grad_w2": torch.zeros(h, k),
        "outputs": torch.zeros(b, k),
    }

    def step(o):
        torch.matmul(o["inputs"], o["w1"], out=o["hidden"])
        o["hidden"].clamp_(min=0)
        torch.matmul(o["hidden"], o["w2"], out=o["outputs"])
        o["outputs"].sub_(o["targets"])
        torch.matmul(o["hidden"].T, o["outputs"], out=o["grad_w2"])
        torch.matmul(o["outputs"], o["w2"].T, out=o["grad_hidden"])
        o["grad_hidden"].mul_(o["hidden"] > 0)
        torch.matmul(o["inputs"].T, o["grad_hidden"], out=o["grad_w1"])
        o["w1"].sub_(0.01 * o["grad_w1"])
        o["w2"].sub_(0.01 * o["grad_w2"])

    uses = {
        "inputs": 2,
        "targets": 1,
        "w1": 3,
        "w2": 4,
        "hidden": 6,
        "grad_hidden": 4,
        "grad_w1": 2,
        "grad_w2": 2,
        "outputs": 5,
    }
    return objs, step, {k2: uses[k2] * v.numel() * 4 for k2, v in objs.items()}


APPS = {"stream": _stream, "stencil": _stencil, "cg": _cg, "gups": _gups, "mlp": _mlp}


def _time(step, objs, repeats: int) -> float:
    import torch

    step(objs)  # warm-up (kernel selection, caches)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(objs)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def probe_app(name: str, dev, scale: float, repeats: int, random_placements: int, seed: int) -> list[dict]:
    base, step, moved = APPS[name](scale)
    names = list(base)
    total = sum(moved.values())
    rng = np.random.default_rng(seed)
    placements = [("all_fast", set(names)), ("all_slow", set())]
    placements += [(f"object:{n}", {n}) for n in names]
    for r in range(random_placements):
        pick = {n for n in names if rng.random() < 0.5}
        placements.append((f"random#{r}", pick))
    measured = {}
    for label, fast in placements:
        objs = {n: place(base[n].clone(), n in fast, dev) for n in names}
        measured[label] = _time(step, objs, repeats)
        del objs
    t_fast, t_slow = measured["all_fast"], measured["all_slow"]
    rows = []
    for label, fast in placements:
        share = sum(moved[n] for n in fast) / total
        est = share * t_fast + (1 - share) * t_slow
        rows.append(
            {
                "app": name,
                "placement": label,
                "fast_objects": " ".join(sorted(fast)) or "(none)",
                "fast_byte_share": share,
                "measured_s": measured[label],
                "estimate_s": est,
                "error": est / measured[label] - 1,
                "reference": "hardware (GPU HBM vs mapped pinned host)",
            }
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--scale", type=float, default=1.0, help="problem-size factor (1.0: ~100-400 MB per app)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--random", type=int, default=4, help="random object subsets per app")
    ap.add_argument("--apps", default=",".join(APPS))
    args = ap.parse_args(argv)
    dev = _device(args.device)
    if dev is None:
        print(
            "gpu_probe: no CUDA device, so no second memory tier to measure here; the study's "
            "reference on this machine is the simulated one (python -m tasks.hetmem)",
            file=sys.stderr,
        )
        return 0
    import torch

    zero_copy = _check_zero_copy(dev)
    if not zero_copy:
        raise SystemExit("pinned host memory is not visible to the GPU through its host pointer (no UVA)")
    rows = []
    t0 = time.perf_counter()
    for i, name in enumerate(args.apps.split(",")):
        rows += probe_app(name, dev, args.scale, args.repeats, args.random, seed=i)
        print(f"[gpu_probe] {name} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "gpu_placements.csv", index=False)
    mixed = df[~df["placement"].isin(["all_fast", "all_slow"])]
    summary = {
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "zero_copy_verified": zero_copy,
        "mean_abs_error": float(mixed["error"].abs().mean()),
        "per_app": {
            a: {
                "mean_abs_error": float(g["error"].abs().mean()),
                "max_abs_error": float(g["error"].abs().max()),
                "all_fast_s": float(df[(df.app == a) & (df.placement == "all_fast")]["measured_s"].iloc[0]),
                "all_slow_s": float(df[(df.app == a) & (df.placement == "all_slow")]["measured_s"].iloc[0]),
            }
            for a, g in mixed.groupby("app", sort=False)
        },
        "wall_s": time.perf_counter() - t0,
    }
    (args.out / "gpu_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
