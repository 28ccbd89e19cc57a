"""The storage ceiling from fio (https://fio.readthedocs.io; Debian's `fio` package, `make tools`).

One fio job writes `nbytes` sequentially (`--rw=write`, 1 MiB `pwrite`s or the largest power of
two down to 4 KiB that divides the size) into a fresh file in the save's directory
(`--fallocate=none`: no blocks reserved up front, as a save's fresh file has none) from a thread of
fio's own process (`--thread`: the job dies with the app's process group), fsyncs it at the
end (`--end_fsync=1`: fio counts the fsync in the job's runtime) and deletes it (`--unlink=1`).
fio's JSON report (`--output-format=json`) gives the bytes written and the runtime; the bandwidth
is their quotient. `measure` runs the job buffered (through the page cache, as a save writes, after
the same untimed page-cache warm-up as a save: instruments.warm_pages), then direct (`--direct=1`,
O_DIRECT: the device without the page cache) where the filesystem allows it, else records why not;
the ceiling of that moment is the faster of the two. A compute point measures it before its saves
and again after them (compute.run_point).

Where fio is not installed nothing runs and every number is NaN with `FIO_MISSING` as the reason:
the claim then says so instead of crashing.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

FIO_MISSING = "fio is not installed (apt-get install fio)"
NAN = float("nan")
BLOCK = 1 << 20     # the largest fio block size: a save's writes are MiB-scale or larger
ALIGN = 4096        # O_DIRECT needs block-aligned sizes: a job writes whole 4 KiB blocks


class FioError(RuntimeError):
    """fio did not run, failed, or reported something this module cannot read: the reason."""


@dataclass(frozen=True)
class FioRun:
    """One fio job's write: bytes written, fio's runtime (seconds, fsync included), bandwidth."""

    bytes: int
    seconds: float

    @property
    def bw_bytes_per_s(self) -> float:
        return self.bytes / self.seconds


def parse(text: str) -> FioRun:
    """The write of the single job in fio's `--output-format=json` report `text` (anything fio
    printed before the JSON object, such as notes, is skipped)."""
    start = text.find("{")
    if start < 0:
        raise FioError(f"fio printed no JSON report: {text.strip()[:200]!r}")
    try:
        report, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as e:
        raise FioError(f"fio's JSON report does not parse ({e})") from None
    jobs = report.get("jobs") or []
    if len(jobs) != 1:
        raise FioError(f"fio's report has {len(jobs)} jobs, expected 1")
    job = jobs[0]
    if job.get("error", 0):
        raise FioError(f"fio's job failed with error {job['error']} ({os.strerror(int(job['error']))})")
    write = job.get("write") or {}
    nbytes, runtime_ms = int(write.get("io_bytes", 0)), float(write.get("runtime", 0))
    if nbytes <= 0:
        raise FioError("fio's job wrote nothing")
    if runtime_ms <= 0:
        raise FioError(f"fio's job wrote {nbytes} bytes in under its 1 ms timer resolution")
    return FioRun(nbytes, runtime_ms / 1000.0)


def block_size(nbytes: int) -> int:
    """The largest power of two from 4 KiB to 1 MiB that divides `nbytes` (a multiple of 4 KiB)."""
    bs = BLOCK
    while nbytes % bs:
        bs //= 2
    return bs


def job_bytes(nbytes: int) -> int:
    """`nbytes` rounded up to whole 4 KiB blocks (O_DIRECT's alignment), at least one block."""
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


def command(exe: str, directory: Path, name: str, nbytes: int, direct: bool) -> list[str]:
    size = job_bytes(nbytes)
    return [exe, "--name=ceiling", f"--directory={directory}", f"--filename={name}", "--rw=write",
            f"--bs={block_size(size)}", f"--size={size}", "--ioengine=psync", "--numjobs=1",
            "--end_fsync=1", "--fallocate=none", "--unlink=1", f"--direct={int(direct)}",
            # the job as a thread of fio's one process: a forked job runs in a session of its own, so
            # killing the app's process group (kill -9, Ctrl-C) left it behind, asleep for good
            # (11 of 30 kills of a fio loop without this, 0 of 30 with it)
            "--thread",
            # fio's default clock calibrates the CPU's cycle counter first (60 ms a job here)
            "--clocksource=clock_gettime", "--output-format=json"]


def executable() -> str | None:
    """fio's path, None where it is not installed."""
    return shutil.which("fio")


def run(directory: Path, nbytes: int, direct: bool = False, timeout_s: float | None = None) -> FioRun:
    """One fio job of `nbytes` in `directory` (module docstring); FioError says why it has no number."""
    exe = executable()
    if exe is None:
        raise FioError(FIO_MISSING)
    name = f".fio-ceiling-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    # generous: 60 s plus the bytes at 5 MB/s, so only a hung job times out
    timeout_s = timeout_s if timeout_s is not None else 60.0 + nbytes / 5e6
    try:
        done = subprocess.run(command(exe, directory, name, nbytes, direct), capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise FioError(f"fio did not finish within {timeout_s:.0f} s") from None
    finally:
        (directory / name).unlink(missing_ok=True)  # --unlink=1 removes it unless fio died first
    if done.returncode != 0:
        # without this job's directory, file name and pids, so the reason reads the same in every run
        said = " ".join((done.stderr or done.stdout).split())
        said = said.replace(str(directory), "DIR").replace(name, "FILE")
        said = re.sub(r"\bpid=\d+", "pid=N", said)
        raise FioError(f"fio exited with status {done.returncode}: {said[:300]}")
    return parse(done.stdout)


@dataclass
class Moment:
    """The ceiling measured at one moment (before or after a point's saves): bandwidths in bytes/s
    (NaN where not measured), why direct was not measured, why nothing was (error), fio's wall time."""

    buffered: float = NAN
    direct: float = NAN
    direct_note: str = ""
    error: str = ""
    wall_s: float = 0.0

    @property
    def bw_bytes_per_s(self) -> float:
        """The faster of the buffered and the direct job (NaN where neither ran)."""
        got = [b for b in (self.buffered, self.direct) if math.isfinite(b)]
        return max(got) if got else NAN


def measure(directory: Path, nbytes: int, warm=None) -> Moment:
    """The storage ceiling of this moment: a buffered job (after `warm(directory, nbytes)`, the
    save's page-cache warm-up), then a direct one where O_DIRECT is allowed (its refusal recorded in
    `direct_note`). Never raises for fio's sake: fio missing or failing is `error`."""
    t0 = time.perf_counter()
    out = Moment()
    try:
        if warm is not None:
            warm(directory, nbytes)
        out.buffered = run(directory, nbytes, direct=False).bw_bytes_per_s
    except FioError as e:
        out.error = str(e)
        out.wall_s = time.perf_counter() - t0
        return out
    try:
        out.direct = run(directory, nbytes, direct=True).bw_bytes_per_s
    except FioError as e:
        out.direct_note = f"no O_DIRECT job, buffered only: {e}"
    out.wall_s = time.perf_counter() - t0
    return out
