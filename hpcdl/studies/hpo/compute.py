"""One trial's training, in epoch chunks resumable from a state dict (each chunk is one task): the
task bodies of tasks/hpo.py call run_chunk, evaluate_test and warm_up.

Every epoch's shuffle and dropout draw from a generator seeded by (seed, epoch), so training
2 epochs in one chunk gives the same weights as two 1-epoch chunks: chunking for pruning
changes when the driver looks, never what is learned.
"""

from __future__ import annotations

import functools
import math
import os
import socket
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hpcdl.common.fashion_mnist import train_val_test
from hpcdl.common.models import build

SGD_MOMENTUM = 0.9  # plain SGD at these budgets barely moves; momentum keeps the grid comparable
DIVERGENCE_LOSS = 1e3  # a mean epoch loss above this (cross-entropy starts at ~2.3) means diverged
EVAL_BATCH = 1000


class TrialDiverged(RuntimeError):
    """The loss became NaN/inf or exploded: the trial cannot produce a usable model."""


@dataclass(frozen=True)
class DataSpec:
    """Which slice of Fashion-MNIST a trial sees; hashable so workers cache the loaded arrays."""
    directory: str
    val_fraction: float = 0.2
    seed: int = 0
    train_limit: int | None = None
    test_limit: int | None = None


@functools.lru_cache(maxsize=2)
def load_data(spec: DataSpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Tensors for train/val/test; cached per worker process so chunks after the first skip the IDX read."""
    train, val, test = train_val_test(spec.directory, val_fraction=spec.val_fraction, seed=spec.seed,
                                      train_limit=spec.train_limit, test_limit=spec.test_limit)
    return {name: (torch.from_numpy(np.ascontiguousarray(s.x)), torch.from_numpy(s.y))
            for name, s in (("train", train), ("val", val), ("test", test))}


def warm_up(data: DataSpec) -> str:
    """Load the data into this worker's cache and return the worker id: startup stays out of trial times."""
    x, y = load_data(data)["train"]
    # The first optimizer step imports a lot of torch lazily (seconds): pay it here, not in trial 0.
    for name in ("adam", "sgd", "rmsprop"):
        model = make_model({"model": "mlp", "width": 8, "depth": 1, "dropout": 0.0})
        opt = make_optimizer(name, model, 1e-3)
        nn.functional.cross_entropy(model(x[:2]), y[:2]).backward()
        opt.step()
    time.sleep(0.5)  # hold this worker so the next warm-up task lands on another one
    return f"{socket.gethostname()}:{os.getpid()}"


def make_model(params: dict) -> nn.Module:
    return build(params["model"], width=int(params["width"]), depth=int(params["depth"]),
                 dropout=float(params["dropout"]))


def make_optimizer(name: str, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=SGD_MOMENTUM)
    if name == "rmsprop":
        return torch.optim.RMSprop(model.parameters(), lr=lr)
    raise ValueError(f"optimizer must be one of adam, sgd, rmsprop, got {name!r}")


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), EVAL_BATCH):
            correct += int((model(x[i:i + EVAL_BATCH]).argmax(1) == y[i:i + EVAL_BATCH]).sum())
    return correct / max(1, len(y))


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch) % (2 ** 31)


def train_epoch(model, opt, x, y, batch_size: int, seed: int, epoch: int) -> float:
    """One pass over (x, y) in seeded random order; returns the mean training loss."""
    model.train()
    gen = torch.Generator().manual_seed(_epoch_seed(seed, epoch))
    torch.manual_seed(_epoch_seed(seed, epoch))  # dropout masks
    order = torch.randperm(len(y), generator=gen)
    loss_fn = nn.CrossEntropyLoss()
    total, n = 0.0, 0
    for i in range(0, len(y), batch_size):
        idx = order[i:i + batch_size]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[idx]), y[idx])
        value = loss.detach().item()
        if not math.isfinite(value):
            raise TrialDiverged(f"training loss became {value} at epoch {epoch + 1}, "
                                f"batch {i // batch_size + 1}")
        loss.backward()
        opt.step()
        total += value * len(idx)
        n += len(idx)
    mean = total / n
    if mean > DIVERGENCE_LOSS:
        raise TrialDiverged(f"mean training loss {mean:.3g} at epoch {epoch + 1} exceeds {DIVERGENCE_LOSS:g}")
    return mean


def train_chunk(params: dict, state: dict | None, data: DataSpec, epochs: int, seed: int = 0,
                fail: bool = False) -> dict:
    """Train `epochs` more epochs from `state` (None: a fresh model); return new state and per-epoch records.

    `fail` makes the chunk raise (fault injection for the study's failure tests).
    """
    started = time.time()
    if fail:
        raise RuntimeError("injected failure (config hpo.fail_trials)")
    tensors = load_data(data)
    xtr, ytr = tensors["train"]
    xva, yva = tensors["val"]
    torch.manual_seed(seed)  # initial weights
    model = make_model(params)
    opt = make_optimizer(params["optimizer"], model, float(params["lr"]))
    done = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        done = int(state["epochs_done"])
    records = []
    for epoch in range(done, done + epochs):
        t0 = time.time()
        loss = train_epoch(model, opt, xtr, ytr, int(params["batch_size"]), seed, epoch)
        records.append({"epoch": epoch + 1, "train_loss": loss, "val_acc": accuracy(model, xva, yva),
                        "epoch_time_s": time.time() - t0})
    return {
        "state": {"model": model.state_dict(), "optimizer": opt.state_dict(), "epochs_done": done + epochs},
        "epochs_done": done + epochs,
        "records": records,
        "start_time": started,
        "end_time": time.time(),
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "train_samples": len(ytr),
        "threads": torch.get_num_threads(),
    }


def run_chunk(params: dict, state: dict | None, data: DataSpec, epochs: int, seed: int = 0,
              fail: bool = False) -> dict:
    """train_chunk that returns {"error": "..."} instead of raising, so the reason survives any runtime."""
    try:
        return train_chunk(params, state, data, epochs, seed, fail)
    except (Exception, MemoryError) as exc:  # noqa: BLE001 - any trial failure becomes a FAIL row with its reason
        return {"error": f"{type(exc).__name__}: {exc}", "worker": f"{socket.gethostname()}:{os.getpid()}",
                "end_time": time.time()}


def evaluate_test(params: dict, state: dict, data: DataSpec) -> float:
    """Accuracy of a trained trial on the held-out test set (used only for the best trials)."""
    model = make_model(params)
    model.load_state_dict(state["model"])
    x, y = load_data(data)["test"]
    return accuracy(model, x, y)
