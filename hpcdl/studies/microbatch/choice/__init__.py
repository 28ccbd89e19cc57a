"""The per-kernel algorithm choice: PyTorch's convolution algorithms, benchmarked per kernel and
micro-batch, planned by μ-cuDNN's DP and ILP (common/), executed as whole networks (compute.run_network).

algorithms  the candidate implementations PyTorch has (oneDNN, native im2col, cuDNN modes),
            forced one at a time, with which one really ran; KernelCall, one kernel on a micro-batch
bench       time and workspace (extra peak memory) per kernel, algorithm and micro-batch
exact       each kernel's float64 result and the distances every exactness check records
execute     MicroBatchedConv2d: a drop-in Conv2d running its plan in forward and backward
plan_timing the executed plans vs the default: whole networks' conv layers (every forward, then
            every backward) timed in interleaved rounds, executor overhead, output and gradient errors
vetting     plans vetted inside the network before they are timed: a layer whose move is not
            faster in the whole-network stack is pinned to the default and the planners rerun
heap        fixed glibc heap thresholds, so in-process timing comparisons allocate alike
"""
