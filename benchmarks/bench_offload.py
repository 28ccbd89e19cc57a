"""Offload tiers and the offloaded optimizer as ratios measured in one run (never fails on a timing).

    python benchmarks/bench_offload.py [--size-mib 64] [--repeats 3] [--device cpu|cuda] [--csv out.csv]

Transfer bandwidth the slow tier achieves (its put / get of one --size-mib tensor, timed by the
tier's own timeline) divided by the tier's ceiling measured right before, in the same run:
    page_cache files   ceiling = host memcpy (torch copy_ of the same bytes)
    dontneed files     ceiling = write + fsync of the same bytes / read after dropping their pages
    cuda pinned host   ceiling = a plain pinned-memory copy of the same bytes each way
and the optimizer step time with the state offloaded (bucketed, after backward) divided by the
in-memory torch.optim.Adam step, on the same MLP.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks._common import emit, parser  # noqa: E402
from hpcdl.studies.offload.slowtier import FileTier, PinnedTier  # noqa: E402
from hpcdl.studies.offload.timeline import CudaClock, Timeline  # noqa: E402
from hpcdl.studies.offload.train import RunSpec, train  # noqa: E402


def _tier_bw(tier, tl, t: torch.Tensor, region="acts") -> tuple[float, float]:
    """(put, get) bytes/s of one tensor through a tier, from the tier's own spans."""
    log = tl.start()
    off = tier.reserve(region, t.numel() * 4)
    tier.put(t, region, off, "bench").wait()
    dst = tier.empty(t.shape, t.dtype)
    tier.get(dst, region, off, "bench").wait()
    tl.stop()
    tier.sync()
    log.resolve()
    assert torch.equal(dst.cpu(), t.cpu()), "the tier returned different bytes"
    n = t.numel() * 4
    return n / log.sum("to_slow"), n / log.sum("from_slow")


def _memcpy_bw(n_bytes: int) -> float:
    a, b = torch.ones(n_bytes // 4), torch.empty(n_bytes // 4)
    b.copy_(a)
    start = time.perf_counter()
    b.copy_(a)
    return n_bytes / (time.perf_counter() - start)


def _disk_bw(directory: str, n_bytes: int) -> tuple[float, float]:
    data = os.urandom(1 << 20) * (n_bytes >> 20)
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        start = time.perf_counter()
        os.write(fd, data)
        os.fsync(fd)
        write = n_bytes / (time.perf_counter() - start)
        os.posix_fadvise(fd, 0, n_bytes, os.POSIX_FADV_DONTNEED)
        start = time.perf_counter()
        got = os.pread(fd, n_bytes, 0)
        read = len(got) / (time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)
    return write, read


def _pinned_bw(n_bytes: int) -> tuple[float, float]:
    dev, host = torch.empty(n_bytes // 4, device="cuda"), torch.empty(n_bytes // 4, pin_memory=True)
    out = []
    for dst, src in ((host, dev), (dev, host)):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        out.append(n_bytes / (time.perf_counter() - start))
    return out[0], out[1]


def _library_adam_rows(n_params: int, repeats: int) -> list[dict]:
    """DeepSpeed's CPU Adam (ZeRO-Offload's optimizer) against torch.optim.Adam on the same CPU
    tensors, where deepspeed is importable (it is not in the project's environment: run this
    script with an interpreter that has it to get the row)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        print("\n(deepspeed not importable here: no DeepSpeedCPUAdam row)")
        return []
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    def timed(make):
        gen = torch.Generator().manual_seed(0)
        p = torch.nn.Parameter(torch.randn(n_params, generator=gen))
        p.grad = torch.randn(n_params, generator=gen)
        opt = make([p])
        opt.step()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - start)
        return statistics.median(times), p.detach().clone()

    ds_s, ds_w = timed(lambda ps: DeepSpeedCPUAdam(ps, lr=1e-3, adamw_mode=False))
    th_s, th_w = timed(lambda ps: torch.optim.Adam(ps, lr=1e-3, foreach=True))
    return [
        {
            "params": n_params,
            "deepspeed_cpu_adam_s": ds_s,
            "torch_adam_s": th_s,
            "deepspeed_over_torch": ds_s / th_s,
            "max_abs_diff": float((ds_w - th_w).abs().max()),
        }
    ]


def _tier_row(tier: str, ceiling: str, puts, gets, ceiling_w, ceiling_r) -> dict:
    """A tier's median put / get bandwidth and each over its ceiling measured in the same run."""
    med = statistics.median
    return {
        "tier": tier,
        "ceiling": ceiling,
        "put_mib_s": med(puts) / 2**20,
        "put_over_ceiling": med(puts) / med(ceiling_w),
        "get_mib_s": med(gets) / 2**20,
        "get_over_ceiling": med(gets) / med(ceiling_r),
    }


def _file_tier_rows(a, n: int) -> list[dict]:
    """The file tier in each io_mode against its ceiling (host memcpy; write+fsync / cold read)."""
    rows = []
    t = torch.randn(n // 4)
    for mode in ("page_cache", "dontneed"):
        puts, gets, cw, cr = [], [], [], []
        for _ in range(a.repeats):
            if mode == "page_cache":
                c = _memcpy_bw(n)
                cw.append(c)
                cr.append(c)
            else:
                w, r = _disk_bw(a.dir, n)
                cw.append(w)
                cr.append(r)
            tl = Timeline()
            tier = FileTier(a.dir, tl, mode)
            try:
                p, g = _tier_bw(tier, tl, t)
            finally:
                tier.close()
            puts.append(p)
            gets.append(g)
        ceiling = "host memcpy" if mode == "page_cache" else "write+fsync / cold read"
        rows.append(_tier_row(f"file ({mode})", ceiling, puts, gets, cw, cr))
    return rows


def _pinned_tier_rows(a, n: int) -> list[dict]:
    """The pinned host tier on CUDA streams against a plain pinned copy of the same bytes."""
    t = torch.randn(n // 4, device="cuda")
    puts, gets, cw, cr = [], [], [], []
    for _ in range(a.repeats):
        w, r = _pinned_bw(n)
        tl = Timeline(CudaClock(torch))
        p, g = _tier_bw(PinnedTier(tl, torch.device("cuda")), tl, t)
        puts.append(p)
        gets.append(g)
        cw.append(w)
        cr.append(r)
    return [_tier_row("pinned host (CUDA streams)", "plain pinned copy", puts, gets, cw, cr)]


def _optimizer_rows(a) -> tuple[list[dict], int]:
    """The offloaded optimizer step (after backward, so the step is timed alone) over the in-memory
    Adam step, on the same MLP; and its parameter count."""
    common = dict(
        width=a.width,
        depth=a.depth,
        batch=256,
        steps=2 + a.repeats,
        device=a.device,
        slow_dir=a.dir,
        bucket_mb=1.0,
        optimizer_in_backward=False,
    )
    mem = train(RunSpec("none", **common))[0]
    off = train(RunSpec("optimizer", **common))[0]
    return [
        {
            "params": mem["n_params"],
            "in_memory_step_s": mem["optimizer_s"] + 0.0,
            "offloaded_step_s": off["optimizer_s"] + off["exposed_transfer_s"],
            "offloaded_over_in_memory": (off["optimizer_s"] + off["exposed_transfer_s"]) / mem["optimizer_s"],
            "weights_equal": mem["weights_sha256"] == off["weights_sha256"],
        }
    ], mem["n_params"]


def main(argv=None) -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=float, default=64.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    ap.add_argument("--dir", default=str(REPO / "results" / "bench" / "offload-slow"))
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=8)
    a = ap.parse_args(argv)
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    n = int(a.size_mib * 2**20) // 4 * 4
    rows = _file_tier_rows(a, n) if a.device == "cpu" else _pinned_tier_rows(a, n)
    emit(rows, None)
    opt_rows, n_params = _optimizer_rows(a)
    emit(opt_rows, None)
    lib_rows = _library_adam_rows(n_params, a.repeats)
    if lib_rows:
        emit(lib_rows, None)
    if a.csv:
        import pandas as pd

        from hpcdl.platform.task_app import atomic_write_text

        atomic_write_text(a.csv, pd.concat([pd.DataFrame(rows), pd.DataFrame(opt_rows)]).to_csv(index=False))
    print(
        "\nput/get_over_ceiling: the tier's copy bandwidth / the tier's ceiling measured in this run"
        "\noffloaded_over_in_memory: optimizer step (update + exposed copies) with the state in the slow tier"
        " / torch.optim.Adam with it in memory"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
