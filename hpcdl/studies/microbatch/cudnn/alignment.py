"""Address alignment of micro-batch views, and which cuDNN plan runs at which offset (pure: no torch).

A micro-batch [s, s + b) of an NCHW tensor is a view whose address is the full tensor's plus
s x (bytes per sample). cuDNN's engines assume every tensor address is aligned to what its
descriptor declares (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT; the cuDNN frontend's graph tensors declare
16 bytes unless told otherwise). A sample whose size is not a multiple of 16 puts views at offsets
that are not: AlexNet's conv1 on a 227x227 image has 3 x 227 x 227 x 4 = 618 348-byte samples
(12 mod 16), so sample 1 starts 4-byte aligned. (At the study's 224x224 it is 602 112 bytes,
4096-aligned; every other layer of AlexNet and ResNet-18 has >= 64 channels on both sides.)

Here: the alignment each tensor of a kernel has at every offset a micro-batch of size b takes (the
benchmark walks offsets k x b; the executor runs a division's steps largest first, which puts a
power-of-two step at a multiple of its size, see `execution_order`), the alignment a graph must
declare so that all its plans run at all of them, and the decision, per (plan, micro-batch, offset),
of what runs and what is skipped, with the reason. hpcdl.studies.microbatch.cudnn.engines applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcdl.studies.microbatch.common.workloads import ConvLayer

CUDNN_ALIGN = 16  # the frontend's default declaration, and the most any plan here is told to assume
# cudaMalloc returns addresses aligned to at least 256 bytes (CUDA C++ Programming Guide, "Device
# Memory Accesses"); PyTorch's caching allocator hands out 512-byte-rounded blocks of those
ALLOC_ALIGN = 256
# the tensors of each kernel: its two inputs, then its output
ROLES = {
    "forward": ("x", "w", "y"),
    "backward_data": ("dy", "w", "dx"),
    "backward_filter": ("x", "dy", "dw"),
}


def _pow2(n: int, what: str) -> int:
    if n < 1 or n & (n - 1):
        raise ValueError(f"{what} must be a power of two >= 1, got {n}")
    return n


def pow2_alignment(nbytes: int, cap: int = CUDNN_ALIGN) -> int:
    """The largest power of two dividing `nbytes`, at most `cap` (0 is aligned to anything: cap)."""
    _pow2(cap, "cap")
    if nbytes < 0:
        raise ValueError(f"a byte offset is >= 0, got {nbytes}")
    return cap if nbytes == 0 else min(nbytes & -nbytes, cap)


def starts(batch: int, micro_batch: int) -> list[int]:
    """The sample offsets the benchmark walks at micro-batch b: 0, b, 2b, ... while a whole
    micro-batch fits (as the executor runs an even division)."""
    if not 1 <= micro_batch <= batch:
        raise ValueError(f"micro-batch {micro_batch} is not within the batch size 1..{batch}")
    return list(range(0, batch - micro_batch + 1, micro_batch))


def offset_alignment(
    sample_bytes: int,
    micro_batch: int,
    base_alignment: int = ALLOC_ALIGN,
    cap: int = CUDNN_ALIGN,
    batch: int | None = None,
) -> int:
    """The largest power of two, at most min(cap, base_alignment), dividing the address of every
    micro-batch view base + k x micro_batch x sample_bytes: k = 0, 1, ... (batch None), or the
    offsets `starts(batch, micro_batch)`. A base aligned to `base_alignment` makes this exact where
    base_alignment >= cap and a lower bound otherwise. sample_bytes 0: a tensor never offset."""
    _pow2(base_alignment, "base_alignment")
    top = min(_pow2(cap, "cap"), base_alignment)
    if sample_bytes < 0:
        raise ValueError(f"sample_bytes must be >= 0, got {sample_bytes}")
    if batch is not None and len(starts(batch, micro_batch)) == 1:
        return top  # only offset 0: the full tensor's own address
    # k = 1 has the fewest factors of two of every k >= 1
    return pow2_alignment(micro_batch * sample_bytes, top)


@dataclass(frozen=True)
class Operand:
    """One tensor of a kernel: `sample_bytes` per sample along the batch (0: the filter or its
    gradient, never offset) and the alignment of the full tensor's address."""

    role: str
    sample_bytes: int
    base_alignment: int = ALLOC_ALIGN


def operands(
    layer: ConvLayer, kernel: str, itemsize: int = 4, bases: dict[str, int] | None = None
) -> tuple[Operand, ...]:
    """The tensors of `kernel` of `layer` (NCHW, contiguous), in ROLES order; `bases`: the full
    tensors' address alignments by role (default ALLOC_ALIGN)."""
    if kernel not in ROLES:
        raise ValueError(f"unknown kernel {kernel!r}; cuDNN's kernels: {', '.join(ROLES)}")
    oh, ow = layer.out_hw
    per = {
        "x": layer.cin * layer.height * layer.width,
        "dx": layer.cin * layer.height * layer.width,
        "y": layer.cout * oh * ow,
        "dy": layer.cout * oh * ow,
        "w": 0,
        "dw": 0,
    }
    bases = bases or {}
    return tuple(Operand(r, per[r] * itemsize, bases.get(r, ALLOC_ALIGN)) for r in ROLES[kernel])


def declared_alignment(
    ops: tuple[Operand, ...], micro_batch: int, batch: int, cap: int = CUDNN_ALIGN
) -> dict[str, int]:
    """Per role, what a graph at `micro_batch` may declare: the alignment its tensor has at every
    offset of `starts(batch, micro_batch)`, at most `cap`."""
    return {o.role: offset_alignment(o.sample_bytes, micro_batch, o.base_alignment, cap, batch) for o in ops}


def undeclarable(declared: dict[str, int], micro_batch: int, frontend: str) -> str:
    """Why a frontend that cannot declare a tensor's alignment may not build this graph ("": it may).

    Such a frontend (nvidia-cudnn-frontend 1.32, whose Python graph lowers every tensor at the default
    16 bytes and has no byte-alignment setter) can only run graphs whose every tensor is 16-byte
    aligned at every offset; anything less would let cuDNN pick an engine that faults there."""
    low = {r: a for r, a in declared.items() if a < CUDNN_ALIGN}
    if not low:
        return ""
    roles = ", ".join(f"{r} is {a}-byte aligned" for r, a in low.items())
    return (f"at micro-batch {micro_batch}, {roles} at some offset; {frontend} cannot declare a tensor's "
            f"alignment (every graph tensor is lowered at {CUDNN_ALIGN} bytes), so no plan may run there")


def alignment_at(op: Operand, start: int, cap: int = CUDNN_ALIGN) -> int:
    """The alignment (at most `cap`) of `op`'s view that starts at sample `start`."""
    return min(pow2_alignment(start * op.sample_bytes, cap), op.base_alignment, cap)


def misaligned(ops: tuple[Operand, ...], declared: dict[str, int], start: int) -> list[str]:
    """What keeps a graph declaring `declared` from running at sample offset `start` ([]: nothing)."""
    cap = max(declared.values())
    out = []
    for o in ops:
        got = alignment_at(o, start, cap)
        if got < declared[o.role]:
            out.append(
                f"{o.role} at sample {start} (byte offset {start * o.sample_bytes}) is {got}-byte "
                f"aligned; the graph declares {declared[o.role]}"
            )
    return out


@dataclass(frozen=True)
class Decision:
    """What the benchmark does with one plan at one micro-batch size: "run" (timed at every offset
    in `starts`), "over_limit" or "skipped", with the reason."""

    index: int
    engine: str
    workspace_bytes: int
    status: str
    reason: str
    starts: tuple[int, ...] = ()


def decide(
    plans: dict[int, tuple[str, int]],
    refused: dict[int, str],
    ops: tuple[Operand, ...],
    declared: dict[str, int],
    offsets: list[int],
    max_workspace_bytes: float,
) -> list[Decision]:
    """One decision per plan of a graph (plans: index -> (name, workspace bytes); refused: index ->
    why it did not build), by index. Every offset is checked before anything is timed: a plan that
    cannot run at one of them is skipped with the first offending offset named (the planner's
    divisions use them all, so a plan runnable at only some is no candidate)."""
    bad = {s: why for s in offsets if (why := misaligned(ops, declared, s))}
    out = []
    for i in sorted({*plans, *refused}):
        if i in refused:
            out.append(Decision(i, "", -1, "skipped", refused[i]))
            continue
        name, ws = plans[i]
        if ws > max_workspace_bytes:
            why = f"needs {ws} bytes > the largest limit {int(max_workspace_bytes)}"
            out.append(Decision(i, name, ws, "over_limit", why))
        elif bad:
            first = min(bad)
            why = f"cannot run at {len(bad)} of {len(offsets)} micro-batch offsets: {'; '.join(bad[first])}"
            out.append(Decision(i, name, ws, "skipped", why))
        else:
            out.append(Decision(i, name, ws, "run", "", tuple(offsets)))
    return out


def probe_offsets(ops: tuple[Operand, ...], offsets: list[int], cap: int = CUDNN_ALIGN) -> list[int]:
    """The first offset of each distinct alignment of the tensors' views among `offsets`: running a
    plan once at each tries every address class it will be timed at (conv1 at 227x227, b = 1:
    samples 0, 1 and 2, whose inputs are 16-, 4- and 8-byte aligned)."""
    seen, out = set(), []
    for s in offsets:
        key = tuple(alignment_at(o, s, cap) for o in ops)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def describe(declared: dict[str, int]) -> str:
    """A graph's declared alignment as a table cell: "x:4 w:16 y:16"."""
    return " ".join(f"{r}:{a}" for r, a in declared.items())


def execution_order(steps: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """A division's micro-batches largest first (stable): its time (a sum) and workspace (a max)
    are the same in any order, and powers of two in this order each start at a multiple of their
    own size, the offsets the benchmark timed (the DP lists smaller parts first: 1 + 2 + ... would
    put the 2 at sample 1)."""
    return sorted(steps, key=lambda s: -s[1])


def step_starts(steps: list[tuple[str, int]]) -> list[int]:
    """The sample offset of each micro-batch when `steps` run in the order given."""
    out, s = [], 0
    for _, b in steps:
        out.append(s)
        s += b
    return out


def fully_aligned_sizes(
    layer: ConvLayer, batch: int, sizes: list[int], need: int = CUDNN_ALIGN, itemsize: int = 4
) -> list[int]:
    """The micro-batch sizes at which every tensor of every kernel of `layer` is `need`-byte
    aligned at every benchmarked offset (full tensors at ALLOC_ALIGN)."""
    return [
        b
        for b in sizes
        if all(
            min(declared_alignment(operands(layer, k, itemsize), b, batch, need).values()) >= need
            for k in ROLES
        )
    ]
