"""cuDNN engine configurations chosen by id, on CUDA, through NVIDIA's cuDNN frontend (issue 27).

PyTorch exposes only cudnn.benchmark on/off: it cannot run a cuDNN algorithm by id, report its
workspace or bound it. μ-cuDNN needs all three, so this module goes through the maintained binding,
the `nvidia-cudnn-frontend` package (Python module `cudnn`, graph API):

- a `KernelGraph` is one kernel of one layer at one micro-batch size as a one-operation cuDNN graph
  (conv_fprop: y from x and w; conv_dgrad: dx from dy and w; conv_wgrad: dw from x and dy) with the
  shapes and strides of PyTorch's NCHW tensors;
- heuristics modes A and FALLBACK list its engine configurations (execution plans); each is built
  by index and reports its workspace size and its name (cuDNN's engine id and knobs);
- a plan runs by index on the tensors PyTorch owns (the binding takes the torch tensors, views of
  the micro-batch included, by their device pointers: no copies), with a workspace allocated from
  PyTorch's caching allocator at that plan's size, on torch's current stream.

A plan's index is its place in one graph's list, which depends on the shape; its name is the same
engine at every micro-batch size. Tables therefore key engines by name and record the index too.

Micro-batch offsets (issue 42): a view [s, s + b) starts s samples into its tensor, and a sample
that is no multiple of 16 bytes (AlexNet's conv1 input at 227x227) leaves views at addresses cuDNN's
default declaration (16 bytes) does not cover. μ-cuDNN offsets raw pointers through cuDNN's older
API, which copes with any address; the graph API needs each tensor's alignment declared. Choice:
plans are picked by the pointers' real alignment, never by copying into an aligned buffer. Each graph
declares, per tensor, the alignment it has at every offset its micro-batch takes
(alignment.declared_alignment, set through the frontend's `tensor.set_alignment(bytes)`, the
Python binding of Tensor_attributes::set_alignment, default 16: cudnn-frontend python/properties.cpp
since 1.16, include/cudnn_frontend/graph_properties.h), so cuDNN lists only engines valid there and
each plan runs at every offset as timed. Release 1.32 (the one `make gpu-carry` pins) replaced the
public graph by a pure-Python one whose tensors have no such setter and are lowered at 16 bytes
(seen on the H200, 2026-11-26): there a graph that would need less than 16 is refused with the reason
(alignment.undeclarable) and its micro-batch size becomes a skipped row; the study's 224x224 layers
are 16-byte aligned at every size and run. A copy would add a micro-batch of memory and traffic beside
the workspace the division exists to save (conv1's input at b = 32 is about 19 MiB, over the 8 MiB limit)
and run at a time nobody benchmarked. `run_division` runs a division largest step first (offsets
then multiples of each power-of-two size, as benchmarked) and checks every step before any runs.

Nothing here runs on the CPU path: the binding is imported only when a CUDA graph is built. The task
app runs it where `enabled(block, device)` (microbatch.cudnn.engines and device cuda), one task per
network (hpcdl.studies.microbatch.cudnn.study, issue 38): hpcdl.studies.microbatch.cudnn.bench
benchmarks each layer's plans into a table, hpcdl.studies.microbatch.cudnn.plan plans on it under
every limit (through limits, dp and ilp), and `run_division` executes the plans and baselines.
"""

from __future__ import annotations

import torch

from hpcdl.studies.microbatch.choice.algorithms import KERNELS, KernelCall
from hpcdl.studies.microbatch.common.workloads import ConvLayer
from hpcdl.studies.microbatch.cudnn.alignment import (
    ALLOC_ALIGN,
    CUDNN_ALIGN,
    ROLES,
    Operand,
    declared_alignment,
    execution_order,
    operands,
    pow2_alignment,
    undeclarable,
)

PACKAGE = "nvidia-cudnn-frontend"


def enabled(block: dict, device: str) -> bool:
    """Whether the cuDNN-by-id path runs: microbatch.cudnn.engines, and only on CUDA."""
    return device == "cuda" and bool(block.get("cudnn", {}).get("engines", False))


_MODULE = None


def binding():
    """The cuDNN frontend module, imported here only (never at module import: the CPU path has none)."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    try:
        import cudnn
    except ImportError as exc:
        raise RuntimeError(
            f"microbatch.cudnn.engines: true needs the Python package {PACKAGE} (module `cudnn`), "
            f"which is not installed ({exc}); install it into the GPU environment or set "
            "microbatch.cudnn.engines: false"
        ) from None
    missing = [
        m
        for m in (
            "get_execution_plan_count",
            "build_plan_at_index",
            "get_workspace_size_plan_at_index",
            "get_plan_name_at_index",
            "execute_plan_at_index",
        )
        if not hasattr(cudnn.pygraph, m)
    ]
    if missing:
        raise RuntimeError(
            f"the installed {PACKAGE} ({getattr(cudnn, '__version__', '?')}) lacks "
            f"pygraph.{', '.join(missing)}: choosing an engine by id needs a newer release"
        )
    _MODULE = cudnn
    return cudnn


def library_record() -> dict:
    """The binding's and the cuDNN libraries' versions: the frontend must drive the cuDNN torch loads."""
    cudnn = binding()
    backend = cudnn.backend_version() if hasattr(cudnn, "backend_version") else cudnn.get_cudnn_version()
    torch_cudnn = torch.backends.cudnn.version()
    return {
        "cudnn_frontend": str(getattr(cudnn, "__version__", "")),
        "cudnn_backend_version": int(backend),
        "torch_cudnn_version": int(torch_cudnn or 0),
        "same_cudnn": int(backend) == int(torch_cudnn or -1),
    }


def frontend_declares_alignment() -> bool:
    """Whether this frontend's graph tensors take a byte alignment (1.32's do not: see the docstring)."""
    cudnn = binding()
    g = _fp32_graph(cudnn, _handle(torch.device("cuda")))
    probe = g.tensor(name="probe", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT)
    return hasattr(probe, "set_alignment")


def _fp32_graph(cudnn, handle):
    """An empty cuDNN graph whose tensors and arithmetic are all fp32."""
    f32 = cudnn.data_type.FLOAT
    return cudnn.pygraph(io_data_type=f32, intermediate_data_type=f32, compute_data_type=f32, handle=handle)


_HANDLES: dict[int, object] = {}


def _handle(device: torch.device):
    """One cuDNN handle per GPU, bound to torch's current stream at every use (the binding's
    executions then order with torch's own kernels)."""
    cudnn = binding()
    idx = device.index if device.index is not None else torch.cuda.current_device()
    h = _HANDLES.get(idx)
    if h is None:
        with torch.cuda.device(idx):
            h = _HANDLES[idx] = cudnn.create_handle()
    cudnn.set_stream(handle=h, stream=torch.cuda.current_stream(idx).cuda_stream)
    return h


def _check_cuda(kernel: str, *tensors: torch.Tensor) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; cuDNN's kernels: {', '.join(KERNELS)}")
    for t in tensors:
        if t.device.type != "cuda" or t.dtype != torch.float32:
            raise ValueError(
                f"the cuDNN-by-id path runs only on CUDA fp32 tensors, got {t.dtype} on {t.device} "
                "(microbatch.cudnn.engines is for device cuda)"
            )


class KernelGraph:
    """One kernel of one layer at micro-batch size `size`: its cuDNN plans, each runnable by index.

    Built from example tensors (x: the micro-batch's input, w: the filter, dy: the micro-batch's
    output gradient), whose shapes and strides every later call must share; their addresses may
    differ (a micro-batch view at another offset runs the same graph) as long as each is aligned to
    what `alignment` declares for its role (alignment.ROLES; default: the frontend's 16 bytes).
    """

    def __init__(
        self,
        layer: ConvLayer,
        kernel: str,
        x: torch.Tensor,
        w: torch.Tensor,
        dy: torch.Tensor,
        tf32: bool = False,
        alignment: dict[str, int] | None = None,
    ):
        _check_cuda(kernel, x, w, dy)
        cudnn = binding()
        self.layer, self.kernel, self.size = layer, kernel, int(x.shape[0])
        self.roles = ROLES[kernel]
        self.alignment = {r: CUDNN_ALIGN for r in self.roles} | (alignment or {})
        self.device = x.device
        self.handle = _handle(x.device)
        f32 = cudnn.data_type.FLOAT
        g = _fp32_graph(cudnn, self.handle)
        conv = {"padding": [layer.pad_h, layer.pad_w], "stride": [layer.stride] * 2, "dilation": [1, 1]}

        # each tensor declares its real alignment (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT): see the docstring
        def declare(made, role):
            if hasattr(made, "set_alignment"):
                made.set_alignment(self.alignment[role])
                return made
            why = undeclarable(self.alignment, self.size, f"{PACKAGE} {getattr(cudnn, '__version__', '?')}")
            if why:
                raise ValueError(f"{layer.name} {kernel}: {why}")
            return made  # every role is at the default 16 bytes, which the frontend declares itself

        def tensor(name, t):
            made = g.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=f32)
            return declare(made, name)

        def output(node, like):
            node.set_output(True).set_dim(list(like.shape)).set_stride(list(like.stride()))
            return declare(node, self.roles[2])

        # the output's shape and strides are those of the buffer PyTorch will pass
        if kernel == "forward":
            self.X, self.W = tensor("x", x), tensor("w", w)
            self.Y = output(g.conv_fprop(name="fprop", image=self.X, weight=self.W, **conv), dy)
            self._ins = (self.X, self.W)
        elif kernel == "backward_data":
            self.DY, self.W = tensor("dy", dy), tensor("w", w)
            self.Y = output(g.conv_dgrad(name="dgrad", loss=self.DY, filter=self.W, **conv), x)
            self._ins = (self.DY, self.W)
        else:
            self.X, self.DY = tensor("x", x), tensor("dy", dy)
            self.Y = output(g.conv_wgrad(name="wgrad", image=self.X, loss=self.DY, **conv), w)
            self._ins = (self.X, self.DY)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        if not tf32:  # TF32 engines round inputs to 10-bit mantissas: not exact against fp32
            g.deselect_numeric_notes(
                [cudnn.numerical_note.TENSOR_CORE, cudnn.numerical_note.DOWN_CONVERT_INPUTS]
            )
        g.check_support()
        self.graph = g
        self.count = int(g.get_execution_plan_count())
        # index -> (name, workspace bytes), or the reason the plan does not build
        self.plans: dict[int, tuple[str, int]] = {}
        self.refused: dict[int, str] = {}
        for i in range(self.count):
            try:
                err = g.build_plan_at_index(i)  # some releases raise, others return an Error
                if hasattr(err, "is_bad") and err.is_bad():
                    raise RuntimeError(err.get_message())
                self.plans[i] = (str(g.get_plan_name_at_index(i)), int(g.get_workspace_size_plan_at_index(i)))
            except Exception as exc:  # noqa: BLE001 - the binding raises its own types; the plan is not a candidate
                self.refused[i] = f"{type(exc).__name__}: {exc}"
        self.by_name = {name: i for i, (name, _) in self.plans.items()}

    def workspace(self, index: int) -> torch.Tensor:
        """A workspace of plan `index`'s size from PyTorch's allocator (at least one byte)."""
        return torch.empty(max(self.plans[index][1], 1), dtype=torch.uint8, device=self.device)

    def problems(self, inputs: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor) -> list[str]:
        """Why these tensors cannot run this graph's plans ([]: they can): an address aligned to less
        than the graph declares for its role."""
        got = zip(self.roles, (*inputs, out), strict=True)
        return [
            f"{r} at address 0x{t.data_ptr():x} is {a}-byte aligned; the graph declares {self.alignment[r]}"
            for r, t in got
            if (a := pow2_alignment(t.data_ptr(), CUDNN_ALIGN)) < self.alignment[r]
        ]

    def run(
        self,
        index: int,
        inputs: tuple[torch.Tensor, torch.Tensor],
        out: torch.Tensor,
        workspace: torch.Tensor,
    ) -> str:
        """Plan `index` on `inputs` (forward: x, w; backward_data: dy, w; backward_filter: x, dy) into
        `out`; returns the name of the plan that ran."""
        if index not in self.plans:
            raise ValueError(
                f"{self.layer.name} {self.kernel} b={self.size}: plan {index} is not built "
                f"({self.refused.get(index, 'no such index')})"
            )
        bad = self.problems(inputs, out)
        if bad:  # cuDNN would read or write past what its kernels assume
            raise ValueError(f"{self.layer.name} {self.kernel} b={self.size}: {'; '.join(bad)}")
        pack = {self._ins[0]: inputs[0], self._ins[1]: inputs[1], self.Y: out}
        self.graph.execute_plan_at_index(pack, workspace, index, handle=_handle(self.device))
        return self.plans[index][0]


def inputs_at(call: KernelCall, kernel: str, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`kernel`'s inputs on samples [start, start + size): views of the full batch, never copies."""
    sl = slice(start, start + size)
    if kernel == "forward":
        return call.x[sl], call.weight
    if kernel == "backward_data":
        return call.grad_out[sl], call.weight
    return call.x[sl], call.grad_out[sl]


def kernel_operands(call: KernelCall, kernel: str) -> tuple[Operand, ...]:
    """`kernel`'s tensors with the real alignment of the full tensors' addresses; the result buffer,
    allocated later by call.output, at what the allocator guarantees (checked again when run)."""
    full = {"x": call.x, "dx": None, "w": call.weight, "dy": call.grad_out, "y": None, "dw": None}
    bases = {r: pow2_alignment(t.data_ptr(), ALLOC_ALIGN) for r, t in full.items() if t is not None}
    return operands(call.layer, kernel, call.x.element_size(), bases)


def graph_for(call: KernelCall, kernel: str, size: int, tf32: bool = False) -> KernelGraph:
    """`kernel`'s graph at micro-batch `size`, declaring the alignment its tensors have at every
    offset the benchmark and the executor run it at (alignment.declared_alignment)."""
    oh, ow = call.layer.out_hw
    dy = (
        call.grad_out[:size] if call.grad_out is not None else call.x.new_empty(size, call.layer.cout, oh, ow)
    )
    declared = declared_alignment(kernel_operands(call, kernel), size, call.batch)
    return KernelGraph(call.layer, kernel, call.x[:size], call.weight, dy, tf32, declared)


def run_division(
    call: KernelCall,
    kernel: str,
    steps: list[tuple[str, int]],
    graphs: dict[int, KernelGraph],
    workspace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[str]]:
    """The whole mini-batch as micro-batches [(engine name, size), ...], each run by that engine's
    index in its size's graph: (the kernel's result, the names of the plans that ran, in the order
    they ran: largest micro-batch first, alignment.execution_order).

    Every step's tensors are checked against its graph's declared alignment before any step runs
    (ValueError naming each step that cannot). Forward and backward-data write each micro-batch's
    slice of the full result in place; the filter gradient is summed over micro-batches (cuDNN's
    graph has no accumulate, so each micro-batch's gradient lands in a scratch filter first). One
    workspace serves every micro-batch (they run one after another): `workspace`, or one allocated
    here at the largest need of the division's plans."""
    if sum(b for _, b in steps) != call.batch:
        raise ValueError(
            f"layer {call.layer.name} {kernel}: micro-batches {steps} do not add up to the "
            f"batch size {call.batch}"
        )
    out = call.output(kernel)
    scratch = torch.empty_like(out) if kernel == "backward_filter" and len(steps) > 1 else None
    chosen, bad, start = [], [], 0
    for name, size in execution_order(steps):
        g = graphs.get(size)
        if g is None or name not in g.by_name:
            raise ValueError(
                f"layer {call.layer.name} {kernel}: engine {name} has no built plan at micro-batch {size}"
            )
        inputs = inputs_at(call, kernel, start, size)
        if kernel == "backward_filter":
            dest = out if scratch is None else scratch
        else:
            dest = out[start : start + size]
        bad += [f"{size} at sample {start}: {why}" for why in g.problems(inputs, dest)]
        chosen.append((g, g.by_name[name], inputs, dest))
        start += size
    if bad:
        raise ValueError(f"layer {call.layer.name} {kernel}: micro-batches cannot run: {'; '.join(bad)}")
    need = max(g.plans[i][1] for g, i, _, _ in chosen)
    if workspace is None:
        workspace = torch.empty(max(need, 1), dtype=torch.uint8, device=call.x.device)
    elif workspace.numel() < need:
        raise ValueError(f"layer {call.layer.name} {kernel}: workspace of {workspace.numel()} bytes < {need}")
    ran = []
    for g, i, inputs, dest in chosen:
        ran.append(g.run(i, inputs, dest, workspace))
        if scratch is not None:
            out.add_(scratch)
    return out, ran

