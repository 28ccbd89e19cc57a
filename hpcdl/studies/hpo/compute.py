"""One trial's training, in epoch chunks resumable from a state dict (each chunk is one task): the
task bodies of tasks/hpo.py call run_chunk, evaluate_test and warm_up.

Every epoch's shuffle and dropout draw from a generator seeded by (seed, epoch), so training
2 epochs in one chunk gives the same weights as two 1-epoch chunks: chunking for pruning
changes when the driver looks, never what is learned.

Device: `DataSpec.device` is the study's device, resolved once in the task app. On `cuda` a task
trains on its own GPU (the pool or COMPSs binds it as cuda:0): the whole train/val/test tensors go
to the GPU once per worker process (load_data's cache) and batches are indexed there, the shuffle
order is drawn on the CPU generator (the same order as on the CPU) and moved once per epoch, and the
loss is summed on the GPU and read once per epoch (a per-batch .item() would stall the GPU every
step). The state a chunk returns is always on the CPU: it travels to the main program, which may
have no GPU, and a CUDA tensor pickled out of a worker that then exits cannot be opened.
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
    device: str = "cpu"  # the study's resolved device: "cpu" or "cuda" (the task's own GPU)


def _torch_device(spec: DataSpec) -> torch.device:
    if spec.device not in ("cpu", "cuda"):
        raise ValueError(f"DataSpec.device must be a resolved device (cpu or cuda), got {spec.device!r}")
    if spec.device == "cuda":
        _deterministic_cuda()
    return torch.device(spec.device)


def _deterministic_cuda() -> None:
    """The deterministic settings torch offers on CUDA: cuDNN's deterministic kernels, no autotuning,
    and deterministic algorithms where they exist (warn_only: an op torch lists without one, e.g.
    NLLLoss on CUDA, warns instead of failing the trial). cuBLAS reads its workspace setting when it
    starts: this runs before the process's first CUDA tensor (load_data), so it is in time."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


@functools.lru_cache(maxsize=2)
def load_data(spec: DataSpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Tensors for train/val/test on the spec's device; cached per worker process so chunks after the
    first skip the IDX read (and, on CUDA, the host-to-device copy: it happens once per process)."""
    device = _torch_device(spec)
    train, val, test = train_val_test(spec.directory, val_fraction=spec.val_fraction, seed=spec.seed,
                                      train_limit=spec.train_limit, test_limit=spec.test_limit)
    return {name: (torch.from_numpy(np.ascontiguousarray(s.x)).to(device), torch.from_numpy(s.y).to(device))
            for name, s in (("train", train), ("val", val), ("test", test))}


def worker_id(spec: DataSpec) -> str:
    """Host and process of the task and, on CUDA, the GPU it held: its CUDA_VISIBLE_DEVICES entry,
    the id the local pool or COMPSs handed out (the GPU model is in the tables' provenance)."""
    base = f"{socket.gethostname()}:{os.getpid()}"
    if spec.device != "cuda":
        return base
    return f"{base} gpu {os.environ.get('CUDA_VISIBLE_DEVICES') or 'all'}"


def warm_up(data: DataSpec) -> str:
    """Load the data into this worker's cache and return the worker id: startup stays out of trial times.

    On CUDA this also creates the CUDA context and cuBLAS handle and puts the data on the GPU; the
    local backend keeps a GPU's worker for the next task on that GPU, so the trials find them there."""
    x, y = load_data(data)["train"]
    model_device = x.device
    # The first optimizer step imports a lot of torch lazily (seconds): pay it here, not in trial 0.
    for name in ("adam", "sgd", "rmsprop"):
        model = make_model({"model": "mlp", "width": 8, "depth": 1, "dropout": 0.0}).to(model_device)
        opt = make_optimizer(name, model, 1e-3)
        nn.functional.cross_entropy(model(x[:2]), y[:2]).backward()
        opt.step()
    if model_device.type == "cuda":
        torch.cuda.synchronize()
    time.sleep(0.5)  # hold this worker so the next warm-up task lands on another one
    return worker_id(data)


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
    correct = torch.zeros((), dtype=torch.int64, device=y.device)  # summed where y lives: one read at the end
    with torch.no_grad():
        for i in range(0, len(y), EVAL_BATCH):
            correct += (model(x[i:i + EVAL_BATCH]).argmax(1) == y[i:i + EVAL_BATCH]).sum()
    return int(correct) / max(1, len(y))


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch) % (2 ** 31)


def train_epoch(model, opt, x, y, batch_size: int, seed: int, epoch: int) -> float:
    """One pass over (x, y) in seeded random order; returns the mean training loss.

    On the CPU the loss is read every batch (a diverged trial stops at its first non-finite batch);
    on CUDA it is summed on the GPU and read, and checked, once at the end of the epoch."""
    model.train()
    gen = torch.Generator().manual_seed(_epoch_seed(seed, epoch))
    torch.manual_seed(_epoch_seed(seed, epoch))  # dropout masks (every device's generator)
    order = torch.randperm(len(y), generator=gen).to(y.device)
    loss_fn = nn.CrossEntropyLoss()
    on_gpu = y.device.type == "cuda"
    total = torch.zeros((), dtype=torch.float64, device=y.device) if on_gpu else 0.0
    n = 0
    for i in range(0, len(y), batch_size):
        idx = order[i:i + batch_size]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[idx]), y[idx])
        if on_gpu:
            total += loss.detach().double() * len(idx)
        else:
            value = loss.detach().item()
            if not math.isfinite(value):
                raise TrialDiverged(f"training loss became {value} at epoch {epoch + 1}, "
                                    f"batch {i // batch_size + 1}")
            total += value * len(idx)
        loss.backward()
        opt.step()
        n += len(idx)
    if on_gpu:
        total = float(total)
        if not math.isfinite(total):
            raise TrialDiverged(f"training loss became {total} during epoch {epoch + 1}")
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
    torch.manual_seed(seed)  # initial weights: drawn on the CPU, then moved, so every device starts alike
    model = make_model(params).to(xtr.device)
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
        "state": {"model": _to_cpu(model.state_dict()), "optimizer": _to_cpu(opt.state_dict()),
                  "epochs_done": done + epochs} if xtr.device.type == "cuda" else
                 {"model": model.state_dict(), "optimizer": opt.state_dict(), "epochs_done": done + epochs},
        "epochs_done": done + epochs,
        "records": records,
        "start_time": started,
        "end_time": time.time(),
        "worker": worker_id(data),
        "train_samples": len(ytr),
        "threads": torch.get_num_threads(),
        "device": data.device,
    }


def _to_cpu(obj):
    """A state dict with every tensor on the CPU (the same objects where they already are)."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def run_chunk(params: dict, state: dict | None, data: DataSpec, epochs: int, seed: int = 0,
              fail: bool = False) -> dict:
    """train_chunk that returns {"error": "..."} instead of raising, so the reason survives any runtime."""
    try:
        return train_chunk(params, state, data, epochs, seed, fail)
    except (Exception, MemoryError) as exc:  # noqa: BLE001 - any trial failure becomes a FAIL row with its reason
        return {"error": f"{type(exc).__name__}: {exc}", "worker": worker_id(data),
                "end_time": time.time()}


def evaluate_test(params: dict, state: dict, data: DataSpec) -> float:
    """Accuracy of a trained trial on the held-out test set (used only for the best trials)."""
    x, y = load_data(data)["test"]
    model = make_model(params).to(x.device)
    model.load_state_dict(state["model"])
    return accuracy(model, x, y)
