"""The tolerance within which two runs' weights are equal when they compute the same fp32 Adam update
with different kernels (zero_offload's host Adam, torch's CPU `fused` kernel or the CPU's `foreach`,
against `none`'s fast-tier Adam: `foreach` on the CPU or on a GPU). numpy only: the claims stage reads
it without torch.

    deviation   ||w_a - w_b|| / ||ulp(w_b)||: the two runs' final weights apart, in units in the last
                place of the training format, root mean square over the weights compared
    tolerance   sqrt(steps) / 2 of those units

Why: the two kernels evaluate the same expression with correctly rounded fp32 operations in another
order (fused: one pass; foreach: a pass per operation; a GPU may contract a multiply-add), so one
step's updated weight differs between them by at most half a unit of fp32 in its last place, or
not at all. In fp32 training that is the weights' own last place; below it the master weights are
cast to bf16 / fp16 after the step, which hides the difference unless a master lies within it of
a rounding midpoint, when the two parameters land one unit of the training format apart. Either
way one step moves each weight by at most half a unit in the last place of the training format,
with either sign, and the next steps' forward and backward passes, fed weights that differ in
their last bits, add differences of the same size. Independent half units, one a step, add up to
sqrt(steps) / 2 in the root mean square. Measured on CPU tensors (MLPs of width 32-256, lr 1e-3;
tests/test_offload_zero.py): fused against foreach reads 0.41 of a unit at fp32 after 13 steps and
0.72 after 40, 0 to 0.19 at bf16 and fp16 (the cast hides most differences), inside sqrt(13)/2 = 1.8
and sqrt(40)/2 = 3.2. Another computation lies outside: the weights one step short read 7e4 units at
fp32 after 13 steps (2.7e4 after 40) and 3.3 at fp16 after 40; untrained weights 20-25 at bf16. bf16
cannot tell one step of lr 1e-3 among 13 or 40 apart (0.6-1 of its units): that is the format's
resolution, which no tolerance of bf16 weights can beat.
"""

from __future__ import annotations

import math

import numpy as np

# significant bits (p) and the smallest normal exponent of each training format
FORMATS = {"fp32": (24, -126), "bf16": (8, -126), "fp16": (11, -14)}


def ulp(x, precision: str) -> np.ndarray:
    """The unit in the last place of each value of `x` in the training format (normal range; a zero
    or subnormal value gets the smallest normal's unit)."""
    p, emin = FORMATS[precision]
    a = np.abs(np.asarray(x, dtype=np.float64))
    e = np.floor(np.log2(np.maximum(a, 2.0**emin)))
    return np.exp2(e - (p - 1))


def deviation(weights, reference, precision: str) -> float:
    """||weights - reference|| / ||ulp(reference)||: in units in the last place, root mean square."""
    a = np.asarray(weights, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"weights to compare must be equal, non-empty samples: {a.shape} and {b.shape}")
    return float(np.linalg.norm(a - b) / np.linalg.norm(ulp(b, precision)))


def tolerance(steps: int) -> float:
    """The largest `deviation` of two runs that differ only in their Adam kernels, after `steps` steps."""
    return math.sqrt(max(1, int(steps))) / 2.0


def parse_sample(text) -> list[float]:
    """A sample written by precision.format_sample (space-separated floats); [] for none."""
    return [float(x) for x in str(text).split()] if isinstance(text, str) and text.strip() else []
