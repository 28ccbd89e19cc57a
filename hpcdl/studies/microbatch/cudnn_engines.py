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

Nothing here runs on the CPU path: the binding is imported only when a CUDA graph is built. The task
app does not call this module yet: it is to run it where `enabled(block, device)`
(microbatch.cudnn.engines and device cuda) once a GPU run has validated it against the binding
(issue 27). hpcdl.studies.microbatch.limits plans on the tables `benchmark_layer` writes.
"""

from __future__ import annotations

import time

import torch

from hpcdl.studies.microbatch.algorithms import KERNELS, KernelCall
from hpcdl.studies.microbatch.bench import cuda_peak_extra_bytes, time_rounds
from hpcdl.studies.microbatch.workloads import ConvLayer

PACKAGE = "nvidia-cudnn-frontend"
ALIGN = 16  # bytes; cuDNN's engines assume 16-byte aligned tensor addresses


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


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % ALIGN == 0


class KernelGraph:
    """One kernel of one layer at micro-batch size `size`: its cuDNN plans, each runnable by index.

    Built from example tensors (x: the micro-batch's input, w: the filter, dy: the micro-batch's
    output gradient), whose shapes and strides every later call must share; their addresses may
    differ (a micro-batch view at another offset runs the same graph).
    """

    def __init__(
        self,
        layer: ConvLayer,
        kernel: str,
        x: torch.Tensor,
        w: torch.Tensor,
        dy: torch.Tensor,
        tf32: bool = False,
    ):
        _check_cuda(kernel, x, w, dy)
        cudnn = binding()
        self.layer, self.kernel, self.size = layer, kernel, int(x.shape[0])
        self.device = x.device
        self.handle = _handle(x.device)
        f32 = cudnn.data_type.FLOAT
        g = cudnn.pygraph(
            io_data_type=f32, intermediate_data_type=f32, compute_data_type=f32, handle=self.handle
        )
        conv = {"padding": [layer.pad_h, layer.pad_w], "stride": [layer.stride] * 2, "dilation": [1, 1]}

        def tensor(name, t):
            return g.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=f32)

        def output(node, like):
            node.set_output(True).set_dim(list(like.shape)).set_stride(list(like.stride()))
            return node

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
        for t in (*inputs, out):
            if not _aligned(t):
                raise ValueError(
                    f"{self.layer.name} {self.kernel} b={self.size}: a tensor address is not "
                    f"{ALIGN}-byte aligned (micro-batch offset); cuDNN's engines need it"
                )
        pack = {self._ins[0]: inputs[0], self._ins[1]: inputs[1], self.Y: out}
        self.graph.execute_plan_at_index(pack, workspace, index, handle=_handle(self.device))
        return self.plans[index][0]


def _inputs(call: KernelCall, kernel: str, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`kernel`'s inputs on samples [start, start + size): views of the full batch, never copies."""
    sl = slice(start, start + size)
    if kernel == "forward":
        return call.x[sl], call.weight
    if kernel == "backward_data":
        return call.grad_out[sl], call.weight
    return call.x[sl], call.grad_out[sl]


def graph_for(call: KernelCall, kernel: str, size: int, tf32: bool = False) -> KernelGraph:
    oh, ow = call.layer.out_hw
    dy = (
        call.grad_out[:size] if call.grad_out is not None else call.x.new_empty(size, call.layer.cout, oh, ow)
    )
    return KernelGraph(call.layer, kernel, call.x[:size], call.weight, dy, tf32)


def run_division(
    call: KernelCall,
    kernel: str,
    steps: list[tuple[str, int]],
    graphs: dict[int, KernelGraph],
    workspace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[str]]:
    """The whole mini-batch as micro-batches [(engine name, size), ...], each run by that engine's
    index in its size's graph: (the kernel's result, the names of the plans that ran).

    Forward and backward-data write each micro-batch's slice of the full result in place; the
    filter gradient is summed over micro-batches (cuDNN's graph has no accumulate, so each
    micro-batch's gradient lands in a scratch filter first). One workspace serves every
    micro-batch (they run one after another): `workspace`, or one allocated here at the largest
    need of the division's plans."""
    if sum(b for _, b in steps) != call.batch:
        raise ValueError(
            f"layer {call.layer.name} {kernel}: micro-batches {steps} do not add up to the "
            f"batch size {call.batch}"
        )
    chosen = []
    for name, size in steps:
        g = graphs.get(size)
        if g is None or name not in g.by_name:
            raise ValueError(
                f"layer {call.layer.name} {kernel}: engine {name} has no built plan at micro-batch {size}"
            )
        chosen.append((g, g.by_name[name], size))
    need = max(g.plans[i][1] for g, i, _ in chosen)
    if workspace is None:
        workspace = torch.empty(max(need, 1), dtype=torch.uint8, device=call.x.device)
    elif workspace.numel() < need:
        raise ValueError(f"layer {call.layer.name} {kernel}: workspace of {workspace.numel()} bytes < {need}")
    out = call.output(kernel)
    scratch = torch.empty_like(out) if kernel == "backward_filter" and len(steps) > 1 else None
    ran, start = [], 0
    for g, i, size in chosen:
        inputs = _inputs(call, kernel, start, size)
        if kernel == "backward_filter":
            ran.append(g.run(i, inputs, out if scratch is None else scratch, workspace))
            if scratch is not None:
                out.add_(scratch)
        else:
            ran.append(g.run(i, inputs, out[start : start + size], workspace))
        start += size
    return out, ran


def benchmark_layer(
    call: KernelCall,
    sizes: list[int],
    repeats: int,
    warmup: int,
    max_workspace_bytes: float,
    tf32: bool = False,
    kernels: tuple[str, ...] = KERNELS,
) -> tuple[list[dict], dict]:
    """One row per (kernel, micro-batch, plan): the plan's name and index, its reported and measured
    workspace, its time (fastest and median of `repeats` rounds, all plans of a layer interleaved).

    Plans needing more than `max_workspace_bytes` (the largest limit: no limit would let them run)
    get status "over_limit" and are not timed; plans that do not build or run get "skipped" with
    the reason. Also returns the graphs, by (kernel, size), for the executor."""
    if call.device != "cuda":
        raise ValueError("cuDNN engines are benchmarked on CUDA only")
    base = {"layer": call.layer.name, "count": call.layer.count}
    rows, configs, graphs = [], [], {}
    # one workspace for every timed plan, grown to the largest need (as the executor holds one per
    # layer): a buffer per plan would hold hundreds of them, up to the largest limit each
    shared = {"ws": torch.empty(1, dtype=torch.uint8, device=call.x.device)}
    for kernel in kernels:
        for b in sizes:
            try:
                g = graph_for(call, kernel, b, tf32)
            except Exception as exc:  # noqa: BLE001 - no engine supports this graph at all
                rows.append(
                    {
                        **base,
                        "kernel": kernel,
                        "micro_batch": b,
                        "engine": "",
                        "plan_index": -1,
                        "status": "skipped",
                        "reason": f"{type(exc).__name__}: {exc}",
                    }
                )
                continue
            graphs[(kernel, b)] = g
            for i, why in g.refused.items():
                rows.append(
                    {
                        **base,
                        "kernel": kernel,
                        "micro_batch": b,
                        "engine": "",
                        "plan_index": i,
                        "status": "skipped",
                        "reason": why,
                    }
                )
            starts = list(range(0, call.batch - b + 1, b)) or [0]
            out_full = call.output(kernel)
            for i, (name, ws) in g.plans.items():
                t0 = time.perf_counter()
                row = {
                    **base,
                    "kernel": kernel,
                    "micro_batch": b,
                    "engine": name,
                    "plan_index": i,
                    "workspace_bytes": ws,
                    "plan_count": g.count,
                }
                if ws > max_workspace_bytes:
                    rows.append(
                        {
                            **row,
                            "status": "over_limit",
                            "reason": f"needs {ws} bytes > the largest limit {int(max_workspace_bytes)}",
                        }
                    )
                    continue
                if shared["ws"].numel() < ws:
                    shared["ws"] = torch.empty(ws, dtype=torch.uint8, device=call.x.device)

                def once(n=0, g=g, i=i, kernel=kernel, b=b, starts=starts, out_full=out_full, workspace=None):
                    s = starts[n % len(starts)]  # walk the batch as the executor does
                    inputs = _inputs(call, kernel, s, b)
                    out = out_full if kernel == "backward_filter" else out_full[s : s + b]
                    return g.run(i, inputs, out, shared["ws"] if workspace is None else workspace)

                def with_workspace(g=g, i=i, once=once):
                    return once(0, workspace=g.workspace(i))  # the allocation itself is what is measured

                try:
                    ran = once()
                    measured = cuda_peak_extra_bytes(with_workspace)  # beside the shared buffer
                except Exception as exc:  # noqa: BLE001 - a built plan may still refuse these pointers
                    rows.append({**row, "status": "skipped", "reason": f"{type(exc).__name__}: {exc}"})
                    continue
                configs.append((row, once, ran, measured, time.perf_counter() - t0))
    timed = time_rounds([c[1] for c in configs], "cuda", repeats, warmup)
    for (row, _, ran, measured, wall), (t, t_med, t_wall) in zip(configs, timed, strict=True):
        rows.append(
            {
                **row,
                "status": "ok",
                "reason": "",
                "ran": ran,
                "time_s": t,
                "time_median_s": t_med,
                "measured_workspace_bytes": measured,
                "bench_wall_s": wall + t_wall,
            }
        )
    return rows, graphs
