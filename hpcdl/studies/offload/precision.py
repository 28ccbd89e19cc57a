"""The training precision (`offload.precision`): fp32, or mixed precision in bf16 / fp16.

At fp32 every strategy trains as it always did (torch.optim.Adam on the parameters). At bf16 or fp16
the model's parameters, gradients and activations are in that format and every strategy keeps fp32
master weights and Adam's moments somewhere, updated in fp32 and cast back (round to nearest even)
into the parameters after each step; where they live is the strategy:

    none, activations, save_on_cpu   `MasterAdam`: fp32 master weights and moments in the fast tier,
                                     torch.optim.Adam on the masters (the mixed-precision baseline,
                                     as apex O2 / ZeRO's PyTorch baseline hold them)
    optimizer, both                  OffloadedAdam (optimizer.py): masters and moments in the slow
                                     tier, streamed through the fast tier in buckets (Myelin / AxoNN)
    zero_offload                     ZeroOffloadAdam (zero.py): masters, moments and the step on the
                                     host (ZeRO-Offload)

The loss is computed in fp32 (the model's output cast up, as autocast computes it); fp16 multiplies it
by a static `offload.loss_scale` (a power of two, so unscaling in fp32 is exact) before backward, and
every fp32 gradient is unscaled before Adam sees it; a non-finite loss or weight is an error naming
the key. bf16 has fp32's exponent range and needs no scaling.

Where two strategies run different kernels for the same fp32 update (zero_offload's host Adam against
the fast tier's), their weights agree within a stated tolerance (tolerance.py) rather than bit for bit:
every run records its final weights at SAMPLE fixed positions (`sample_positions`, `gather`) for the
claims to compare across runs.
"""

from __future__ import annotations

import math

import torch

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KEY = "offload.precision"
LOSS_SCALE_KEY = "offload.loss_scale"
# Weights sampled for the tolerance check across runs (claims.py): positions drawn from a fixed seed
SAMPLE = 256
SAMPLE_SEED = 20210118  # ZeRO-Offload's arXiv submission date; any fixed value would do


def dtype_of(precision: str) -> torch.dtype:
    if precision not in PRECISIONS:
        raise ValueError(f"config key '{KEY}': {precision!r} is not allowed; allowed: "
                         f"{', '.join(PRECISIONS)}")
    return PRECISIONS[precision]


def loss_scale_of(precision: str, loss_scale: float) -> float:
    """The static loss scale in effect: `loss_scale` under fp16, 1 otherwise."""
    dtype_of(precision)
    if precision != "fp16":
        return 1.0
    if not (loss_scale >= 1 and math.log2(loss_scale).is_integer()):
        raise ValueError(f"config key '{LOSS_SCALE_KEY}': {loss_scale!r} is not a power of two >= 1 "
                         "(unscaling must be exact)")
    return float(loss_scale)


def unscaled(grad: torch.Tensor, inv_scale: float) -> torch.Tensor:
    """A gradient in fp32, the loss scale taken out (the same arithmetic in every strategy). An fp32
    gradient at scale 1 is returned as it is (fp32 training is unchanged)."""
    g = grad.float()
    return g if inv_scale == 1.0 else g * inv_scale


def check_finite(loss: torch.Tensor, params, step: int, precision: str, scale: float) -> None:
    """fp16 under a static loss scale: an overflow shows as a non-finite loss or weight."""
    bad = not torch.isfinite(loss).item() or not all(torch.isfinite(p).all().item() for p in params)
    if bad:
        raise FloatingPointError(
            f"non-finite loss or weights at step {step} under {KEY} = {precision}: the gradients scaled by "
            f"{LOSS_SCALE_KEY} = {scale:g} overflowed fp16; lower {LOSS_SCALE_KEY}")


class MasterAdam:
    """Mixed-precision Adam with everything in the fast tier: fp32 master weights (charged as
    'master_weights'), Adam's moments ('optimizer_state') and, during the step, the fp32 gradients
    ('gradients'; each low-precision gradient is freed once it is cast up). torch.optim.Adam on the
    masters, with the configured foreach / fused setting; the masters are cast back into the parameters.
    """

    def __init__(self, params, fast, lr: float, foreach: bool = True, fused: bool = False,
                 loss_scale: float = 1.0):
        self.params = list(params)
        self.fast, self.inv = fast, 1.0 / loss_scale
        self.master = [fast.track(p.detach().float(), "master_weights") for p in self.params]
        self.opt = torch.optim.Adam(self.master, lr=lr, foreach=False if fused else foreach, fused=fused)
        self._charged = False

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.master, strict=True):
            m.grad = self.fast.track(unscaled(p.grad, self.inv), "gradients")
            p.grad = None
        self.opt.step()
        if not self._charged:  # the moments exist from the first step on
            for st in self.opt.state.values():
                self.fast.track(st["exp_avg"], "optimizer_state")
                self.fast.track(st["exp_avg_sq"], "optimizer_state")
            self._charged = True
        for p, m in zip(self.params, self.master, strict=True):
            p.copy_(m)

    def zero_grad(self) -> None:
        for p, m in zip(self.params, self.master, strict=True):
            p.grad = None
            m.grad = None


# ------------------------------------------------------------------ the weights' sample, for tolerance.py
def sample_positions(params, k: int = SAMPLE) -> torch.Tensor:
    """`k` positions in the parameters flattened in order, drawn from a fixed seed (sorted)."""
    total = sum(p.numel() for p in params)
    gen = torch.Generator().manual_seed(SAMPLE_SEED)
    return torch.randint(total, (min(k, total),), generator=gen).sort().values


def gather(params, positions: torch.Tensor) -> torch.Tensor:
    """The parameters' values at `positions` (flattened order), in fp32 on the CPU."""
    out, off = [], 0
    for p in params:
        n = p.numel()
        local = positions[(positions >= off) & (positions < off + n)] - off
        if len(local):
            out.append(p.detach().reshape(-1)[local.to(p.device)].float().cpu())
        off += n
    return torch.cat(out) if out else torch.zeros(0)


def format_sample(values: torch.Tensor) -> str:
    """Space-separated, each float32 written with 9 significant digits (it reads back exactly)."""
    return " ".join(f"{v:.9g}" for v in values.tolist())
