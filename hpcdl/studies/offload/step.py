"""One measured training step of an offload run (train.py) and what its timeline says of it: the
step itself (`one_step`), its phase and transfer times (`step_times`), and the hidden fraction
pooled over a run's steps (`pooled_hidden_fraction`)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from hpcdl.studies.offload.optimizer import OffloadedAdam
from hpcdl.studies.offload.timeline import Timeline


def pooled_hidden_fraction(records: list[dict]) -> float:
    """1 - exposed / transfer time summed over every measured step: one step holds a few dozen
    transfers, so its own fraction swings with one late copy; the pooled one is what a run hides."""
    total = sum(r["transfer_s"] for r in records)
    if not records or total <= 0:
        return float("nan")
    return min(1.0, max(0.0, 1.0 - sum(r["exposed_transfer_s"] for r in records) / total))


def one_step(model, opt, saved, tl: Timeline, x, y, strategy, cuda, scale: float = 1.0):
    """One training step; its wall time, its timeline log (resolved later) and its loss. Below fp32
    the loss is computed in fp32 (the output cast up, as autocast does) and, under fp16, scaled."""
    stream = torch.cuda.current_stream() if cuda else None
    log = tl.start()
    saved.begin_step()
    wall0 = time.perf_counter()
    hooks = torch.autograd.graph.save_on_cpu(pin_memory=True) if strategy == "save_on_cpu" else saved.hooks()
    with tl.phase("forward", stream):
        with hooks:
            out = model(x)
            loss = F.mse_loss(out, y) if out.dtype == torch.float32 else F.mse_loss(out.float(), y.float())
    with tl.phase("backward", stream):
        if isinstance(opt, OffloadedAdam):
            opt.prefetch()
        (loss if scale == 1.0 else loss * scale).backward()
    with tl.phase("optimizer", stream):
        opt.step()
        opt.zero_grad()
    saved.end_step()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - wall0, log, loss.detach()


def step_times(wall: float, log) -> dict:
    """A step's times: each phase without the waits inside it, the exposed and total transfer time."""
    waits = [s for s in log.spans if s.lane == "wait"]
    phases = {
        s.kind: s for s in log.spans if s.lane == "compute" and s.kind in ("forward", "backward", "optimizer")
    }

    updates = [s for s in log.spans if s.lane == "compute" and s.kind == "optimizer_update"]

    def inside(spans, ph):
        return sum(w.end_s - w.start_s for w in spans if w.start_s >= ph.start_s and w.end_s <= ph.end_s)

    def compute_in(ph):
        return ph.end_s - ph.start_s - inside(waits, ph)

    # bucket updates run inside backward (optimizer in_backward): they count as optimizer time
    in_bwd = inside(updates, phases["backward"])
    hidden = log.hidden_fraction()
    return {
        "step_s": wall,
        "forward_s": compute_in(phases["forward"]),
        "backward_s": compute_in(phases["backward"]) - in_bwd,
        "optimizer_s": compute_in(phases["optimizer"]) + in_bwd,
        "exposed_transfer_s": log.exposed_s(),
        "transfer_s": log.transfer_s(),
        "hidden_frac": float("nan") if hidden is None else hidden,
        "bytes_to_slow": log.bytes("to_slow"),
        "bytes_from_slow": log.bytes("from_slow"),
    }
