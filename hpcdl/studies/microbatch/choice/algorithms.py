"""Candidate convolution algorithms: the implementations PyTorch really has, forced one at a time.

CPU: oneDNN (mkldnn enabled) and the native im2col + GEMM path (mkldnn disabled, which dispatches
to `aten::_slow_conv2d_*`; its columns buffer is the workspace), each with contiguous (NCHW) and
channels-last (NHWC) tensors. CUDA: cuDNN with `cudnn.benchmark` on (cuDNN times its algorithms
and PyTorch keeps the fastest) or off (cuDNN's heuristic pick), each NCHW / NHWC, TF32 off so
every candidate computes in fp32. PyTorch exposes no way to request a cuDNN algorithm by id, so
the CUDA candidates are these four switches; the kernels cuDNN launched are recorded per call.

A kernel is one of forward, backward-data and backward-filter of a layer; `KernelCall` runs one
kernel of one layer on the micro-batch [start, start + size) with one algorithm, reading from and
writing into full-batch tensors, exactly as the executor (hpcdl.studies.microbatch.choice.execute) does.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass

import torch

from hpcdl.studies.microbatch.common.workloads import ConvLayer

KERNELS = ("forward", "backward_data", "backward_filter")
# PyTorch's own backward computes the input and weight gradients in one convolution_backward call;
# that fused kernel is a fourth candidate the planner may pick instead of the separate two.
FUSED = "backward"
ALL_KERNELS = (*KERNELS, FUSED)
_ONEDNN_PROP = {
    "forward": "forward",
    "backward_data": "backward_data",
    "backward_filter": "backward_weights",
    FUSED: "backward_data",
}


@dataclass(frozen=True)
class Algorithm:
    name: str
    device: str  # cpu | cuda
    backend: str  # onednn | native | cudnn
    channels_last: bool
    benchmark: bool = False  # cuDNN benchmark mode (CUDA only)

    def context(self):
        """Force this algorithm's backend for the calls made inside."""
        stack = contextlib.ExitStack()
        if self.device == "cpu":
            # mkldnn.flags() also resets oneDNN's TF32 switch and warns that it is for Intel GPUs
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
            stack.enter_context(torch.backends.mkldnn.flags(enabled=self.backend == "onednn"))
        else:
            stack.enter_context(
                torch.backends.cudnn.flags(
                    enabled=True, benchmark=self.benchmark, deterministic=False, allow_tf32=False
                )
            )
        return stack

    @property
    def memory_format(self):
        return torch.channels_last if self.channels_last else torch.contiguous_format


ALGORITHMS = {
    a.name: a
    for a in (
        Algorithm("onednn-nchw", "cpu", "onednn", False),
        Algorithm("onednn-nhwc", "cpu", "onednn", True),
        Algorithm("native-nchw", "cpu", "native", False),
        Algorithm("native-nhwc", "cpu", "native", True),
        Algorithm("cudnn-heuristic-nchw", "cuda", "cudnn", False, False),
        Algorithm("cudnn-heuristic-nhwc", "cuda", "cudnn", True, False),
        Algorithm("cudnn-benchmark-nchw", "cuda", "cudnn", False, True),
        Algorithm("cudnn-benchmark-nhwc", "cuda", "cudnn", True, True),
    )
}
# What the framework does when nobody asks: fp32 NCHW, oneDNN on CPU, cuDNN's heuristic on CUDA.
DEFAULT = {"cpu": "onednn-nchw", "cuda": "cudnn-heuristic-nchw"}


def candidates(device: str, names: list[str] | None) -> list[str]:
    """The configured algorithm names, or every algorithm of the device."""
    if names:
        unknown = [n for n in names if n not in ALGORITHMS]
        if unknown:
            raise ValueError(f"unknown algorithm(s) {unknown}; known: {', '.join(ALGORITHMS)}")
        return list(names)
    return [n for n, a in ALGORITHMS.items() if a.device == device]


def unavailable_reason(alg: Algorithm, device: str) -> str | None:
    """Why `alg` cannot run here (None: it can)."""
    if alg.device != device:
        return f"{alg.name} is a {alg.device} algorithm and this run is on {device}"
    if alg.backend == "onednn" and not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if alg.backend == "cudnn" and not (torch.cuda.is_available() and torch.backends.cudnn.is_available()):
        return "cuDNN is not available on this build/machine"
    return None


class KernelCall:
    """One layer's full-batch tensors and the three kernels on any micro-batch, with any algorithm."""

    def __init__(
        self,
        layer: ConvLayer,
        batch: int,
        device: str,
        seed: int | None = 0,
        x: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
        grad_out: torch.Tensor | None = None,
        weights: dict | None = None,
    ):
        """Tensors not given are drawn from `seed` (benchmarks); the executor passes its own and
        seed=None (grad_out then arrives in backward)."""
        self.layer, self.batch, self.device = layer, batch, device
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        oh, ow = layer.out_hw
        if x is None:
            x = torch.randn(batch, layer.cin, layer.height, layer.width, generator=gen).to(device)
        if weight is None:
            weight = (
                torch.randn(layer.cout, layer.cin, layer.kh, layer.kw, generator=gen)
                / (layer.cin * layer.kh * layer.kw) ** 0.5
            ).to(device)
        if grad_out is None and gen is not None:
            grad_out = torch.randn(batch, layer.cout, oh, ow, generator=gen).to(device)
        self.x, self.weight, self.grad_out = x, weight, grad_out
        # the filter per memory format; the executor shares its cache across iterations
        self._weights = weights if weights is not None else {}
        self.args = ([layer.stride] * 2, [layer.pad_h, layer.pad_w], [1, 1], False, [0, 0], 1)

    def weight_for(self, alg: Algorithm) -> torch.Tensor:
        """The filter in the algorithm's memory format, converted once per weight version (an
        optimizer step bumps the version; the conversion is then redone)."""
        key = alg.channels_last
        stamp = (self.weight._version, self.weight.data_ptr())  # detach() shares the version counter
        got = self._weights.get(key)
        if got is None or got[0] != stamp:
            got = (stamp, None, self.weight.contiguous(memory_format=alg.memory_format))
            self._weights[key] = got
        return got[2]

    def output(self, kernel: str):
        """A full-batch result buffer of the kernel: uninitialised where every element gets written
        (forward, backward-data), zeros where micro-batch results accumulate (backward-filter);
        the fused backward's is the pair (input gradient, weight gradient)."""
        if kernel == FUSED:
            return self.output("backward_data"), self.output("backward_filter")
        if kernel == "forward":
            oh, ow = self.layer.out_hw
            return self.x.new_empty(self.batch, self.layer.cout, oh, ow)
        if kernel == "backward_data":
            return torch.empty_like(self.x, memory_format=torch.contiguous_format)
        return torch.zeros_like(self.weight, memory_format=torch.contiguous_format)

    def run(
        self, kernel: str, alg: Algorithm, start: int, size: int, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The kernel on samples [start, start + size) with `alg`: into `out` (weights: accumulated),
        or, with out=None (the undivided case), the result itself (NCHW), with no buffer."""
        fmt = alg.memory_format
        w = self.weight_for(alg)
        xs = self.x[start : start + size].contiguous(memory_format=fmt)
        with alg.context():
            if kernel == "forward":
                res = torch.ops.aten.convolution(xs, w, None, *self.args)
            else:
                gys = self.grad_out[start : start + size].contiguous(memory_format=fmt)
                if kernel == "backward_data":
                    res = torch.ops.aten.convolution_backward(
                        gys, xs, w, None, *self.args, [True, False, False]
                    )[0]
                elif kernel == "backward_filter":
                    res = torch.ops.aten.convolution_backward(
                        gys, xs, w, None, *self.args, [False, True, False]
                    )[1]
                elif kernel == FUSED:
                    res = torch.ops.aten.convolution_backward(
                        gys, xs, w, None, *self.args, [True, True, False]
                    )[:2]
                else:
                    raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(ALL_KERNELS)}")
        if out is None:
            # the layer's contract is NCHW in and out: a channels-last result is converted here, so
            # the benchmark times the conversion the executor (and autograd's layout rules) pay
            return tuple(r.contiguous() for r in res) if kernel == FUSED else res.contiguous()
        if kernel == FUSED:
            out[0][start : start + size].copy_(res[0])
            out[1].add_(res[1])
        elif kernel == "backward_filter":
            out.add_(res)
        else:
            out[start : start + size].copy_(res)
        return None

    def run_division(self, kernel: str, steps: list[tuple[str, int]]):
        """The whole mini-batch as a list of (algorithm name, micro-batch size): the kernel's result
        (for the fused backward: the pair of gradients)."""
        if sum(b for _, b in steps) != self.batch:
            raise ValueError(
                f"layer {self.layer.name} {kernel}: micro-batches {steps} do not add up to "
                f"the batch size {self.batch}"
            )
        if len(steps) == 1:
            return self.run(kernel, ALGORITHMS[steps[0][0]], 0, self.batch, None)
        out = self.output(kernel)
        start = 0
        for name, size in steps:
            self.run(kernel, ALGORITHMS[name], start, size, out)
            start += size
        return out


# ------------------------------------------------------------------ which implementation really ran


@contextlib.contextmanager
def _captured_stdout():
    """oneDNN's verbose log goes to the C-level stdout: capture file descriptor 1 (and 2, where the
    profiler's libkineto logs a line per start and stop) into a temp file read back at the end."""
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as f:
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        for fd in saved:
            os.dup2(f.fileno(), fd)
        box = {}
        try:
            yield box
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, old in saved.items():
                os.dup2(old, fd)
                os.close(old)
            f.seek(0)
            box["text"] = f.read().decode(errors="replace")


def _backend_of(log_text: str, ops: set[str], kernel: str) -> tuple[str, str]:
    """(backend, implementation) of a CPU call from oneDNN's verbose log and the ATen ops it ran."""
    prop = _ONEDNN_PROP[kernel]
    lines = [
        ln.split(",") for ln in log_text.splitlines() if ",exec,cpu,convolution," in ln and (f",{prop}" in ln)
    ]
    slow = sorted(op for op in ops if "slow_conv2d" in op or "thnn_conv2d" in op)
    if lines and not slow:
        impl = lines[0][lines[0].index("convolution") + 1]
        return "onednn", f"oneDNN convolution {prop} ({impl})"
    if slow and not lines:
        return "native", " + ".join(slow)
    return "unknown", f"oneDNN log lines {len(lines)}, native ops {slow}"


def instrumented(call: KernelCall, kernel: str, alg: Algorithm, size: int, memory: bool = True):
    """One call under the profiler (+ oneDNN's verbose log on CPU).

    Returns (backend that ran, what ran, the profiler's raw kineto events: ATen ops, CUDA kernels
    and, with `memory`, the allocator's [memory] events the caller integrates to a workspace).
    """
    from torch.autograd.profiler import profile

    out = None if size == call.batch else call.output(kernel)  # as the benchmark and executor run it
    if alg.device == "cuda":
        with _captured_stdout(), profile(use_device="cuda", use_kineto=True) as prof:
            call.run(kernel, alg, 0, size, out)
            torch.cuda.synchronize()
        events = prof.kineto_results.events()
        ops = {e.name() for e in events if e.name().startswith("aten::")}
        kernels = sorted({e.name() for e in events if e.device_type() == torch.autograd.DeviceType.CUDA})
        cudnn = sorted(op for op in ops if "cudnn" in op)
        conv = [k for k in kernels if not k.startswith(("void at::native::", "Memcpy", "Memset"))]
        backend = (
            "cudnn"
            if (cudnn or any("cudnn" in k.lower() or "xmma" in k or "conv" in k.lower() for k in conv))
            else "unknown"
        )
        return backend, "; ".join([*cudnn, *(k[:80] for k in conv[:3])]), events
    with (
        _captured_stdout() as log,
        torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON),
        profile(profile_memory=memory, use_kineto=True) as prof,
    ):
        call.run(kernel, alg, 0, size, out)
    events = prof.kineto_results.events()
    backend, ran = _backend_of(log["text"], {e.name() for e in events}, kernel)
    return backend, ran, events


def verify(call: KernelCall, kernel: str, alg: Algorithm, size: int) -> str:
    """Run the kernel once; say which implementation ran; raise if it is not the forced backend."""
    backend, ran, _ = instrumented(call, kernel, alg, size, memory=False)
    if backend != alg.backend:
        raise RuntimeError(
            f"{alg.name} {kernel} at micro-batch {size}: forced {alg.backend} but {backend} ran ({ran})"
        )
    return ran
