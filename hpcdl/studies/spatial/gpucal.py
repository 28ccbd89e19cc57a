"""The GPU calibration: every item of hpcdl.studies.spatial.perfmodel.slabs timed on one device.

    python -m hpcdl spatial-calibrate --config configs/paper.yaml --device cuda --out resources/calibration/
    python -m hpcdl spatial-calibrate --config configs/paper.yaml --plan     # the items and a time budget

Each layer item runs as the partitioned model runs it on a rank: the conv on its halo'd window (the
local output planes plus the halo planes on a split axis, zero padding on the others) with bias and
LeakyReLU, pool, transposed conv, dense (+ LeakyReLU); forward and backward timed apart (CUDA events
on a GPU, the host clock on the CPU). Halo: a side's planes copied into a contiguous send buffer and
a received buffer copied into the halo'd input. Correction: the thin edge conv of overlap.py. The
optimizer: zero_grad + Adam over the network's parameter tensors. A step: one whole one-GPU training
step on a slab (every layer at its local shape, dense head on the gathered size, Adam), the
measurement claim compute_term compares with the oracle's sum.

Repeats are interleaved: round r times every item once, after one untimed round (cuDNN's algorithm
search, allocator), so drift in clocks or temperature reaches every item alike; the table keeps the
median and the spread (quartiles, min, max). On a GPU cuDNN picks its fastest algorithm per shape
(benchmark mode, as LBANN's autotuning does) and TF32 is off: the papers' V100s ran FP32.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from hpcdl.studies.spatial.calibration import optimizer_step_fn
from hpcdl.studies.spatial.perfmodel import slabs
from hpcdl.studies.spatial.perfmodel.gpu_table import COLUMNS, sidecar, slug

LEAK = 0.2


class _Clock:
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


def _rand(shape, device, grad=False):
    return torch.randn(*shape, device=device, requires_grad=grad)


def _layer_fn(it: dict, dev):
    """Forward closure of a layer item on its local shapes (input gradient wanted except for the data)."""
    L, b = it["layer"], it["batch"]
    kind = L["kind"]
    if kind == "dense":
        x, w, bias = (
            _rand((b, L["fin"]), dev, True),
            _rand((L["fout"], L["fin"]), dev, True),
            _rand((L["fout"],), dev, True),
        )
        return lambda: F.leaky_relu(F.linear(x, w, bias), LEAK) if L.get("act") else F.linear(x, w, bias)
    c, _, _, w_in = L["in"]
    d, h = it["d"], it["h"]
    first = L["in"][0] == L.get("cin", -1) and L["name"] in ("conv0", "enc0a")
    if kind == "pool":
        s = L["stride"]
        x = _rand((b, c, d * s, h * s, w_in), dev, True)
        return lambda: F.max_pool3d(x, L["kernel"], s)
    if kind == "deconv":
        s = L["stride"]
        x = _rand((b, L["cin"], max(1, d // s), max(1, h // s), w_in), dev, True)
        wt, bias = (
            _rand((L["cin"], L["cout"], L["kernel"], *(L["kernel"],) * 2), dev, True),
            _rand((L["cout"],), dev, True),
        )
        return lambda: F.conv_transpose3d(x, wt, bias, stride=s)
    k, p = L["kernel"], L["pad"]
    # split axes carry the halo planes in the input (no padding there), the others the conv's padding
    dd = d + 2 * p if it["split_d"] else d
    hh = h + 2 * p if it["split_h"] else h
    x = _rand((b, c, dd, hh, w_in), dev, not first)
    wt, bias = _rand((L["cout"], c, k, k, k), dev, True), _rand((L["cout"],), dev, True)
    pad = (0 if it["split_d"] else p, 0 if it["split_h"] else p, p)
    return lambda: F.leaky_relu(F.conv3d(x, wt, bias, padding=pad), LEAK)


def _correction_fn(it: dict, dev):
    L, b = it["layer"], it["batch"]
    p, k = L["pad"], L["kernel"]
    halo = _rand((b, L["cin"], p, it["h"], it["w"]), dev, True)
    taps = _rand((L["cout"], L["cin"], p, k, k), dev, True)
    return lambda: F.conv3d(F.pad(halo, (0, 0, 0, 0, 0, p - 1)), taps, None, padding=(0, p, p))


def _halo_fn(it: dict, dev):
    """pack: one side's planes of the local input into a send buffer; unpack: a received buffer into the
    halo region of the halo'd input (fwd = both; no backward: the backward's copies are the same)."""
    L, b, n = it["layer"], it["batch"], it["planes"]
    c, _, _, w = L["in"]
    d, h = it["d"], it["h"]
    dim = 2 if it["axis"] == "d" else 3
    x = _rand((b, c, d, h, w), dev)
    shape = list(x.shape)
    shape[dim] += 2 * n
    padded = torch.zeros(shape, device=dev)
    recv = x.narrow(dim, 0, n).contiguous()

    def fn():
        send = x.narrow(dim, x.shape[dim] - n, n).contiguous()
        padded.narrow(dim, 0, n).copy_(recv)
        return send

    return fn


class _Step:
    """A whole one-GPU training step on a slab: the network's layers at the layout's local shapes (one
    pass: slabs.consistent), the dense head on the gathered features, loss, backward, Adam."""

    def __init__(self, it: dict, dev):
        self.spec, pd, ph = it["spec"], it["depth"], it["height"]
        c, d, h, w = self.spec[0]["in"]
        self.x = _rand((1, c, slabs.local(d, pd), slabs.local(h, ph), w), dev)
        self.params = []
        for s in slabs.param_shapes(self.spec):
            self.params.append(torch.nn.Parameter(torch.randn(s, device=dev) * 0.01))
        self.opt = torch.optim.Adam(self.params, lr=1e-6)

    def __call__(self):
        ps, x, skips = iter(self.params), self.x, []
        for L in self.spec:
            k = L["kind"]
            if k == "conv":
                x = F.leaky_relu(F.conv3d(x, next(ps), next(ps), padding=L["pad"]), LEAK)
            elif k == "pool":
                skips.append(x)
                x = F.max_pool3d(x, L["kernel"], L["stride"])
            elif k == "deconv":
                x = F.conv_transpose3d(x, next(ps), next(ps), stride=L["stride"])
            elif k == "concat":
                x = torch.cat([x, skips.pop()], 1)
            elif k == "gather":  # the all-gather's output size (communication, not compute: zero-filled)
                x = F.pad(x.flatten(1), (0, L["out"][0] - x[0].numel()))
            elif k == "dense":
                x = F.linear(x, next(ps), next(ps))
                x = F.leaky_relu(x, LEAK) if L["act"] else x
        loss = x.float().pow(2).mean()
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        self.opt.step()


def _builder(it: dict, dev):
    """(closure, has_backward) of an item."""
    kind = it["kind"]
    if kind in ("conv", "pool", "deconv", "dense"):
        return _layer_fn(it, dev), True
    if kind == "correction":
        return _correction_fn(it, dev), True
    if kind == "halo":
        return _halo_fn(it, dev), False
    if kind == "optimizer":
        return optimizer_step_fn(it["shapes"], dev)[0], False
    return _Step(it, dev), False


def _once(it: dict, dev, clock: _Clock) -> tuple[float, float]:
    fn, backward = _builder(it, dev)
    t0 = clock.mark()
    y = fn()
    t1 = clock.mark()
    if not backward:
        return clock.seconds(t0, t1), 0.0
    g = torch.randn_like(y)
    t2 = clock.mark()
    y.backward(g)
    t3 = clock.mark()
    return clock.seconds(t0, t1), clock.seconds(t2, t3)


def measure(items: list[dict], device: str, repeats: int, log=None) -> list[dict]:
    """Every item once per round, one untimed round first; median and spread per item."""
    dev = torch.device(device)
    clock = _Clock(dev)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    times = {it["id"]: [] for it in items}
    for r in range(repeats + 1):
        t_round = time.perf_counter()
        for it in items:
            with torch.enable_grad():
                f, b = _once(it, dev, clock)
            if r:
                times[it["id"]].append((f, b))
        if log:
            log(
                f"round {r}/{repeats} ({'warm-up' if r == 0 else 'timed'}): "
                f"{time.perf_counter() - t_round:.1f} s"
            )
    rows = []
    for it in items:
        t = np.asarray(times[it["id"]])
        tot = t.sum(axis=1)
        rows.append(
            {
                "id": it["id"],
                "kind": it["kind"],
                "key": it["key"],
                "network": it.get("network", ""),
                "axis": it.get("axis", ""),
                "d": it.get("d", it.get("depth", 0)),
                "h": it.get("h", it.get("height", 0)),
                "w": it.get("w", 0),
                "batch": it["batch"],
                "units": it.get("units", 0),
                "flops": it["flops"],
                "bytes": it["bytes"],
                "fwd_median_s": float(np.median(t[:, 0])),
                "bwd_median_s": float(np.median(t[:, 1])),
                "median_s": float(np.median(tot)),
                "p25_s": float(np.percentile(tot, 25)),
                "p75_s": float(np.percentile(tot, 75)),
                "min_s": float(tot.min()),
                "max_s": float(tot.max()),
                "repeats": len(tot),
            }
        )
    return rows


def provenance(device: str, command: str, repeats: int) -> dict:
    from hpcdl.platform.device import cuda_record
    from hpcdl.platform.results import cpu_model, git_commit

    rec = cuda_record() if torch.device(device).type == "cuda" else {}
    return {
        "gpu_model": rec.get("gpu_model") or f"cpu {cpu_model()}",
        "device": device,
        "driver": rec.get("driver", ""),
        "cuda": rec.get("cuda", ""),
        "cudnn": rec.get("cudnn", ""),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": command,
        "git_commit": git_commit(),
        "repeats": repeats,
        "tf32": False,
        "cudnn_benchmark": torch.device(device).type == "cuda",
        "statistic": "median of interleaved repeats",
        "emulated": False,
    }


def run(block: dict, device: str, out_dir: str | Path, command: str, log=None) -> Path:
    """Measure every item of the block's papers, write <out_dir>/<gpu slug>.csv + its sidecar; the path."""
    from hpcdl.platform.results import atomic_write_json, atomic_write_text

    items = slabs.calibration_items(block)
    repeats = block["gpu_calibration"]["repeats"]
    t0 = time.perf_counter()
    rows = measure(items, device, repeats, log)
    meta = provenance(device, command, repeats) | {
        "items": len(items),
        "wall_s": time.perf_counter() - t0,
        # the networks and settings measured: the compute-term check rebuilds its steps' layers from them
        "block": {k: block[k] for k in ("papers", "extrapolate", "machine", "gpu_calibration")},
    }
    out = Path(out_dir) / f"{slug(meta['gpu_model'])}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, pd.DataFrame(rows, columns=COLUMNS).to_csv(index=False))
    atomic_write_json(sidecar(out), meta)
    return out


def main(argv: list[str]) -> int:
    from hpcdl.platform.config import ConfigError, load_config

    ap = argparse.ArgumentParser(
        prog="python -m hpcdl spatial-calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--config", default="configs/paper.yaml")
    ap.add_argument("--device", default="cuda", help="cuda (the calibration) or cpu (toy configs, tests)")
    ap.add_argument("--out", default=None, help="directory (default <data.resources_dir>/calibration)")
    ap.add_argument("--plan", action="store_true", help="list the items and a time budget; measure nothing")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    block = cfg["spatial"]
    items = slabs.calibration_items(block)
    if args.plan:
        kinds = pd.Series([it["kind"] for it in items]).value_counts().to_dict()
        est = slabs.estimate_seconds(items, 67, 3350, block["gpu_calibration"]["repeats"])
        print(
            json.dumps(
                {
                    "items": len(items),
                    "by_kind": kinds,
                    "repeats": block["gpu_calibration"]["repeats"],
                    "estimated_h100_s_without_cudnn_search": round(est, 1),
                },
                indent=1,
            )
        )
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda: torch sees no CUDA GPU here", file=sys.stderr)
        return 2
    out = Path(args.out or Path(cfg["data"]["resources_dir"]) / "calibration")
    command = shlex.join(["python", "-m", "hpcdl", "spatial-calibrate", *argv])
    path = run(
        block, args.device, out, command, log=lambda m: print(f"[spatial-calibrate] {m}", file=sys.stderr)
    )
    print(path)
    return 0
