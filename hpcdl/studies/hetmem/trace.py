"""Real memory-access traces of the mini-app kernels: compile, run untraced, run under valgrind's
lackey (`--trace-mem=yes`), and parse the trace into compact arrays.

The kernels (kernels.c) print their objects' address ranges and write a marker page when their
compute phase starts and ends; only the accesses between the two marker writes are kept, each with
the number of instructions executed before it (lackey prints one "I" line per instruction), so
windows can be cut by instruction count. The parser streams the file; a truncated or corrupt trace
is a TraceError naming the file and the byte offset, and nothing is written downstream (the
compact trace is written only after a complete parse, atomically).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcdl.platform import atomic_write_bytes

KERNELS_C = Path(__file__).with_name("kernels.c")
KIND_LOAD, KIND_STORE, KIND_MODIFY = 0, 1, 2
_KINDS = {b" L ": KIND_LOAD, b" S ": KIND_STORE, b" M ": KIND_MODIFY}
INSTALL_HINT = (
    "install it with `make tools` (apt-get install valgrind numactl build-essential) "
    "or your distribution's package manager, or set hetmem.valgrind / hetmem.cc to its path"
)


class ToolMissing(RuntimeError):
    """A program the study needs (the tracer or the C compiler) is not installed."""


class TraceError(ValueError):
    """A trace file that is truncated or corrupt: names the file and the byte offset."""

    def __init__(self, path: Path | str, offset: int, what: str):
        self.path, self.offset = str(path), offset
        super().__init__(f"{path}: {what} at byte offset {offset}")


@dataclass(frozen=True)
class Obj:
    name: str
    base: int
    size: int


@dataclass
class Trace:
    """The compute phase of one kernel run: accesses to its named objects, in program order."""

    app: str
    objects: list[Obj]
    addr: np.ndarray  # int64 byte address of each access
    size: np.ndarray  # int32 bytes
    kind: np.ndarray  # int8: KIND_LOAD / KIND_STORE / KIND_MODIFY
    icount: np.ndarray  # int64 instructions of the compute phase executed before the access
    instructions: int  # instructions of the whole compute phase
    other_accesses: int  # accesses of the phase outside every object (stack, globals)

    def save(self, path: Path) -> Path:
        buf = io.BytesIO()
        np.savez(
            buf,
            addr=self.addr,
            size=self.size,
            kind=self.kind,
            icount=self.icount,
            meta=np.array([self.instructions, self.other_accesses], dtype=np.int64),
            names=np.array([o.name for o in self.objects]),
            bases=np.array([o.base for o in self.objects], dtype=np.int64),
            sizes=np.array([o.size for o in self.objects], dtype=np.int64),
            app=np.array(self.app),
        )
        return atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(cls, path: Path) -> Trace:
        with np.load(path) as z:
            objs = [
                Obj(str(n), int(b), int(s))
                for n, b, s in zip(z["names"], z["bases"], z["sizes"], strict=True)
            ]
            return cls(
                str(z["app"]),
                objs,
                z["addr"],
                z["size"],
                z["kind"],
                z["icount"],
                int(z["meta"][0]),
                int(z["meta"][1]),
            )


def require_tool(name: str, what: str) -> str:
    """The full path of `name`, or ToolMissing saying how to get it."""
    found = shutil.which(name)
    if found is None:
        raise ToolMissing(f"{what} {name!r} not found on PATH: {INSTALL_HINT}")
    return found


def compile_kernels(out_dir: Path, cc: str = "cc") -> Path:
    """Compile kernels.c into out_dir (at run time, so the binary matches this machine)."""
    compiler = require_tool(cc, "C compiler")
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / "hetmem_kernels"
    tmp = out_dir / f".hetmem_kernels.{os.getpid()}"
    # -fno-tree-vectorize: scalar accesses keep every element's access visible in the trace
    proc = subprocess.run(
        [compiler, "-O2", "-fno-tree-vectorize", "-o", str(tmp), str(KERNELS_C)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {KERNELS_C} failed:\n{proc.stderr}")
    os.replace(tmp, binary)
    return binary


def _objects(stdout: str) -> tuple[list[Obj], int, float]:
    objs, marker, compute_s = [], None, float("nan")
    for line in stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["HETMEM_OBJECT"]:
            objs.append(Obj(parts[1], int(parts[2]), int(parts[3])))
        elif parts[:1] == ["HETMEM_MARKER"]:
            marker = int(parts[1])
        elif parts[:1] == ["HETMEM_COMPUTE_S"]:
            compute_s = float(parts[1])
    if not objs or marker is None:
        raise RuntimeError(f"kernel output lacks its object table or marker:\n{stdout[-2000:]}")
    return objs, marker, compute_s


UNTRACED_RUNS = 5  # untraced runs per app: the kernel's compute phase is tens of microseconds


def run_untraced(binary: Path, app: str, size: int, iters: int, runs: int = UNTRACED_RUNS) -> dict:
    """The app run `runs` times untraced: the median process wall time (fork/exec, loader, set-up and
    first touch of the objects included) and the median of the compute phase the binary times itself
    (kernels.c: CLOCK_MONOTONIC around the phase, process start-up excluded)."""
    walls, computes = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run([str(binary), app, str(size), str(iters)], capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise RuntimeError(f"{app} kernel exited {proc.returncode}: {proc.stderr.strip()}")
        computes.append(_objects(proc.stdout)[2])
    return {"untraced_wall_s": float(np.median(walls)), "untraced_compute_s": float(np.median(computes)),
            "untraced_runs": runs}


def run_traced(
    binary: Path, app: str, size: int, iters: int, trace_path: Path, valgrind: str = "valgrind"
) -> tuple[list[Obj], int, dict]:
    """Run the kernel under lackey, the trace going to trace_path; its objects, marker, timings."""
    tracer = require_tool(valgrind, "tracer (valgrind)")
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            tracer,
            "--tool=lackey",
            "--trace-mem=yes",
            f"--log-file={trace_path}",
            str(binary),
            app,
            str(size),
            str(iters),
        ],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"valgrind on the {app} kernel exited {proc.returncode}: {proc.stderr.strip()[-2000:]}"
        )
    objs, marker, compute_s = _objects(proc.stdout)
    return objs, marker, {"traced_wall_s": wall, "traced_compute_s": compute_s}


def parse_lackey(path: Path, app: str, objects: list[Obj], marker: int) -> Trace:
    """Stream a lackey trace; keep the compute phase's accesses to the named objects."""
    path = Path(path)
    addrs, sizes, kinds, icounts = [], [], [], []
    phase = 0  # 0 before the first marker write, 1 inside the compute phase, 2 after
    instr = 0
    offset = 0
    finished = False  # valgrind's exit summary seen
    with open(path, "rb") as f:
        for line in f:
            start = offset
            offset += len(line)
            if not line.endswith(b"\n"):
                raise TraceError(path, start, "truncated trace (last line incomplete)")
            head = line[:3]
            if head == b"I  ":
                if phase == 1:
                    instr += 1
                continue
            kind = _KINDS.get(head)
            if kind is None:
                if line.startswith(b"=="):
                    finished = finished or b"Exit code:" in line
                    continue
                raise TraceError(path, start, f"corrupt trace line {line[:40]!r}")
            comma = line.find(b",", 3)
            try:
                addr = int(line[3:comma], 16)
                size = int(line[comma + 1 :])
            except ValueError:
                raise TraceError(path, start, f"corrupt access record {line[:40]!r}") from None
            if addr == marker and kind != KIND_LOAD:
                phase += 1
                continue
            if phase == 1:
                addrs.append(addr)
                sizes.append(size)
                kinds.append(kind)
                icounts.append(instr)
    if phase < 2 or not finished:
        where = "before the compute phase ended" if phase < 2 else "before valgrind's exit summary"
        raise TraceError(path, offset, f"truncated trace (ends {where})")
    addr = np.asarray(addrs, dtype=np.int64)
    inside = np.zeros(len(addr), dtype=bool)
    for o in objects:
        inside |= (addr >= o.base) & (addr < o.base + o.size)
    return Trace(
        app,
        objects,
        addr[inside],
        np.asarray(sizes, dtype=np.int32)[inside],
        np.asarray(kinds, dtype=np.int8)[inside],
        np.asarray(icounts, dtype=np.int64)[inside],
        instr,
        int((~inside).sum()),
    )


def compact(raw: Path, app: str, objects: list[Obj], marker: int, out: Path) -> Trace:
    """Parse the lackey trace and write the compact one; a bad trace raises before anything is written."""
    trace = parse_lackey(raw, app, objects, marker)
    trace.save(out)
    return trace


def trace_app(
    app: str,
    size: int,
    iters: int,
    work_dir: Path,
    valgrind: str = "valgrind",
    cc: str = "cc",
    keep_raw: bool = False,
) -> tuple[Trace, dict]:
    """Compile, time untraced, trace, parse; the compact trace is saved as work_dir/<app>.npz."""
    binary = compile_kernels(work_dir / "bin" / app, cc)
    timing = run_untraced(binary, app, size, iters)
    raw = work_dir / f"{app}.lackey"
    objs, marker, traced = run_traced(binary, app, size, iters, raw, valgrind)
    t0 = time.perf_counter()
    trace = compact(raw, app, objs, marker, work_dir / f"{app}.npz")
    parse_s = time.perf_counter() - t0
    raw_mb = raw.stat().st_size / 2**20
    if not keep_raw:
        raw.unlink()
    return trace, {
        **timing,
        **traced,
        "parse_s": parse_s,
        "raw_trace_mb": raw_mb,
        "accesses": int(len(trace.addr)),
        "instructions": trace.instructions,
        "other_accesses": trace.other_accesses,
    }
