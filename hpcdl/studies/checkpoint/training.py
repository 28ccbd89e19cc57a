"""Training-state checkpoints: model + optimizer + RNG states + data-loader position.

A small MLP with dropout (so the torch RNG matters) trains with Adam (so optimizer
state matters) on seeded synthetic data, in batches drawn by a loader whose per-epoch
shuffle comes from its own generator (so the loader position matters). The whole
state goes through `state.flatten`, hence through every format.

`resume_check` trains N steps uninterrupted, and separately trains k steps, saves,
and continues to N in a *fresh interpreter* that only sees the checkpoint; the final
weights, optimizer state and next RNG draws must be bit-identical.
`overhead_run` measures training throughput with a checkpoint every k steps against a
paired no-checkpoint baseline.

On `device="cuda"` the data, model and optimizer state live on the GPU (initialised on the CPU
from the same seeds, then moved, so every device starts from the same state), dropout draws from
the GPU's generator, whose state the checkpoint holds too, and the resumed process trains on the
GPU again: bit-identical means identical GPU kernels in both processes, so both run with
deterministic algorithms (cuBLAS's fixed workspace). A checkpoint taken during training keeps the
tensors on the GPU until the checkpointer copies them (saver.py: timed, pinned for async).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hpcdl.platform import PACKAGE_ROOT, child_env
from hpcdl.studies.checkpoint import integrity, saver, state


@dataclass
class TrainSpec:
    n_samples: int = 512
    n_features: int = 64
    n_classes: int = 10
    width: int = 64
    depth: int = 2
    dropout: float = 0.1
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0


class Loader:
    """Shuffled mini-batches; the position (epoch, batch) is the whole loader state."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.epoch, self.batch = 0, 0
        self._order = None

    def _perm(self) -> torch.Tensor:
        if self._order is None:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            self._order = torch.randperm(self.n, generator=g)
        return self._order

    def next_indices(self) -> torch.Tensor:
        per_epoch = self.n // self.batch_size
        if self.batch >= per_epoch:
            self.epoch, self.batch, self._order = self.epoch + 1, 0, None
        idx = self._perm()[self.batch * self.batch_size:(self.batch + 1) * self.batch_size]
        self.batch += 1
        return idx

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.batch, self._order = int(s["epoch"]), int(s["batch"]), None


class Trainer:
    def __init__(self, spec: TrainSpec, init_seed: int | None = None, device: str = "cpu") -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        g = torch.Generator().manual_seed(spec.seed)
        self.x = torch.randn(spec.n_samples, spec.n_features, generator=g).to(self.device)
        self.y = torch.randint(0, spec.n_classes, (spec.n_samples,), generator=g).to(self.device)
        # All RNGs seeded from the spec; init_seed lets a resumed run start from different
        # weights, so matching results prove the checkpoint was really loaded.
        seed = spec.seed if init_seed is None else init_seed
        torch.manual_seed(seed)  # the GPUs' generators too
        np.random.seed(seed)
        random.seed(seed)
        layers: list[nn.Module] = []
        fan_in = spec.n_features
        for _ in range(spec.depth):
            layers += [nn.Linear(fan_in, spec.width), nn.ReLU(), nn.Dropout(spec.dropout)]
            fan_in = spec.width
        layers.append(nn.Linear(fan_in, spec.n_classes))
        self.model = nn.Sequential(*layers).to(self.device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=spec.lr)
        self.loader = Loader(spec.n_samples, spec.batch_size, spec.seed)
        self.step = 0

    def train(self, steps: int, on_step=None) -> None:
        self.model.train()
        for _ in range(steps):
            idx = self.loader.next_indices().to(self.device)
            loss = nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx])
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.step += 1
            if on_step is not None:
                on_step(self)

    def state_dict(self) -> dict:
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        if self.cuda:  # dropout on the GPU draws from the GPU's own generator
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "rng": rng,
                "loader": self.loader.state_dict(), "step": self.step}

    def load_state_dict(self, s: dict) -> None:
        if self.cuda and "cuda" not in s["rng"]:
            raise integrity.CheckpointError("the checkpoint holds no CUDA generator state (written by "
                                            "training on the CPU); a GPU run cannot resume from it exactly")
        self.model.load_state_dict(s["model"])  # copies into the parameters, on their device
        self.opt.load_state_dict(s["optimizer"])  # moves the state to its parameters' device
        torch.set_rng_state(s["rng"]["torch"])
        if self.cuda:
            torch.cuda.set_rng_state(s["rng"]["cuda"], self.device)
        np.random.set_state(s["rng"]["numpy"])
        random.setstate(s["rng"]["python"])
        self.loader.load_state_dict(s["loader"])
        self.step = int(s["step"])

    def fingerprint(self) -> dict:
        """sha256 of the final weights and optimizer state, plus the next draw of every RNG."""
        h = hashlib.sha256()
        flat = state.flatten({"model": self.model.state_dict(), "optimizer": self.opt.state_dict()})
        for k in sorted(flat):
            h.update(k.encode())
            h.update(flat[k].numpy().tobytes())
        out = {"state_sha256": h.hexdigest(), "step": self.step, "loader": self.loader.state_dict(),
               "params_on": str(next(self.model.parameters()).device),
               "next_torch": torch.rand(1).item(), "next_numpy": float(np.random.rand()),
               "next_python": random.random()}
        if self.cuda:
            out["next_cuda"] = torch.rand(1, device=self.device).item()
        return out


# cuBLAS fixes its workspace at its first use in a process, and a different workspace may pick
# different GEMM kernels: every process of a GPU resume check starts with this one.
GPU_DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def deterministic(device: str) -> None:
    """Make GPU kernels repeat bit for bit from process to process (on the CPU the single-threaded
    kernels already do). Call before the process's first GPU work."""
    if device == "cuda":
        for k, v in GPU_DETERMINISTIC_ENV.items():
            os.environ.setdefault(k, v)
        torch.use_deterministic_algorithms(True, warn_only=True)


def save_training_state(trainer: Trainer, root: Path, fmt: str) -> saver.SaveTiming:
    return saver.save(state.flatten(trainer.state_dict()), root, f"step-{trainer.step:09d}", fmt)


def resume_from(root: Path, spec: TrainSpec, steps_total: int, device: str = "cpu") -> dict:
    """Fresh-process side: load the newest committed checkpoint onto `device`, train to `steps_total`."""
    torch.set_num_threads(1)
    deterministic(device)
    path = integrity.latest(root)
    if path is None:
        raise integrity.CheckpointError(f"no committed checkpoint under {root}")
    trainer = Trainer(spec, init_seed=spec.seed + 12345, device=device)
    trainer.load_state_dict(state.unflatten(saver.load(path)))
    trainer.train(steps_total - trainer.step)
    return trainer.fingerprint()


def _phase(phase: str, root: Path, spec: TrainSpec, steps: int, device: str, fmt: str) -> dict:
    """One phase of a resume check, in this process: `reference` trains `steps` uninterrupted and
    fingerprints; `first` trains `steps` and checkpoints; `resume` loads and continues to `steps`."""
    if phase == "resume":
        return resume_from(root, spec, steps, device)
    torch.set_num_threads(1)  # same kernels, same reduction order, in every process
    deterministic(device)
    trainer = Trainer(spec, device=device)
    trainer.train(steps)
    if phase == "reference":
        return trainer.fingerprint()
    return {"checkpoint_bytes": save_training_state(trainer, root, fmt).file_bytes}


def _in_fresh_process(phase: str, root: Path, spec: TrainSpec, steps: int, device: str, fmt: str,
                      timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "hpcdl.studies.checkpoint.training", "--phase", phase, "--root", str(root),
           "--spec", json.dumps(asdict(spec)), "--steps", str(steps), "--device", device, "--format", fmt]
    env = child_env(PACKAGE_ROOT, OMP_NUM_THREADS="1", **(GPU_DETERMINISTIC_ENV if device == "cuda" else {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{phase} process for format {fmt} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def resume_check(fmt: str, scratch_dir: str, spec: dict, steps_total: int, stop_at: int,
                 timeout_s: float = 300.0, device: str = "cpu") -> dict:
    """Uninterrupted vs stop-save-reload-in-a-fresh-process-continue, training on `device`; one record.

    On the CPU the uninterrupted run and the first leg run in this process; on the GPU each runs in a
    fresh process of its own, as the resumed leg does, so all three start with the same cuBLAS
    configuration (GPU_DETERMINISTIC_ENV) whatever this process has already run on the GPU."""
    if not 0 < stop_at < steps_total:
        raise ValueError(f"need 0 < stop_at < steps_total, got stop_at={stop_at}, steps_total={steps_total}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be a resolved device, cpu or cuda; got {device!r}")
    tspec = TrainSpec(**spec)
    root = Path(scratch_dir) / f"resume-{fmt}-{os.getpid()}"
    shutil.rmtree(root, ignore_errors=True)
    try:
        if device == "cuda":
            want = _in_fresh_process("reference", root, tspec, steps_total, device, fmt, timeout_s)
            first = _in_fresh_process("first", root, tspec, stop_at, device, fmt, timeout_s)
        else:
            want = _phase("reference", root, tspec, steps_total, device, fmt)
            first = _phase("first", root, tspec, stop_at, device, fmt)
        got = _in_fresh_process("resume", root, tspec, steps_total, device, fmt, timeout_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mismatched = sorted(k for k in want if want[k] != got.get(k))
    return {"device": device, "resumed_on": got.get("params_on", ""),
            "format": fmt, "steps_total": steps_total, "stop_at": stop_at,
            "checkpoint_bytes": first["checkpoint_bytes"], "bit_identical": not mismatched,
            "mismatched": ",".join(mismatched), "state_sha256_uninterrupted": want["state_sha256"],
            "state_sha256_resumed": got["state_sha256"]}


def overhead_run(mode: str, interval: int, fmt: str, scratch_dir: str, spec: dict, steps: int,
                 warmup_steps: int = 2, keep: int = 2, device: str = "cpu") -> dict:
    """Throughput of `steps` training steps with a checkpoint every `interval` steps, against a
    paired baseline without checkpoints measured in the same process around it.

    The baseline is split, half before and half after the checkpointed segment, so slow drift
    of the machine (other load, frequency) hits both alike. The stall per checkpoint is its
    blocking time; the final async drain is reported apart (`drain_s`) and not counted. On cuda the
    model trains on the GPU and each checkpoint copies its state from there (saver.py).
    """
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be sync or async, got {mode!r}")
    if interval < 1:
        raise ValueError(f"interval must be >= 1 step, got {interval}")
    tspec = TrainSpec(**spec)
    root = Path(scratch_dir) / f"overhead-{mode}-{interval}-{os.getpid()}"
    shutil.rmtree(root, ignore_errors=True)
    # Training on one thread leaves the task's other core(s) to the async persist thread, as a
    # GPU would leave the CPU; it also keeps OpenMP spin-waiting out of an oversubscribed machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    trainer = Trainer(tspec, device=device)
    trainer.train(warmup_steps)
    stalls: list[float] = []
    ckpt = saver.AsyncCheckpointer(root, fmt) if mode == "async" else None
    if ckpt is not None:
        ckpt.prepare(state.flatten(trainer.state_dict(), keep_device=True))

    def on_step(t: Trainer) -> None:
        if (t.step - start) % interval:
            return
        name = f"step-{t.step:09d}"
        flat = state.flatten(t.state_dict(), keep_device=True)  # the save copies GPU state itself
        if ckpt is None:
            stalls.append(saver.save(flat, root, name, fmt).blocking_s)
        else:
            stalls.append(ckpt.save(flat, name))
        integrity.prune(root, keep)

    def timed(n: int, hook=None) -> float:
        t0 = time.perf_counter()
        trainer.train(n, hook)
        if trainer.cuda:  # the steps' kernels finished, not just queued
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    try:
        before = timed(steps // 2)
        start = trainer.step
        train_s = timed(steps, on_step)
        t1 = time.perf_counter()
        if ckpt is not None:
            ckpt.wait()
        drain_s = time.perf_counter() - t1
        after = timed(steps - steps // 2)
        state_bytes = state.tensor_bytes(state.flatten(trainer.state_dict()))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        torch.set_num_threads(threads)
    baseline_s = before + after
    return {"device": device, "mode": mode, "interval_steps": interval, "format": fmt, "steps": steps,
            "train_s": train_s, "steps_per_s": steps / train_s, "baseline_train_s": baseline_s,
            "baseline_steps_per_s": steps / baseline_s, "overhead_frac": train_s / baseline_s - 1.0,
            "drain_s": drain_s, "n_checkpoints": len(stalls),
            "stall_mean_s": float(np.mean(stalls)) if stalls else 0.0,
            "stall_total_s": float(np.sum(stalls)), "state_bytes": state_bytes}


def young_daly_interval_s(mtbf_s: float, cost_s: float) -> float:
    """Young/Daly first-order optimal checkpoint interval sqrt(2 * MTBF * C)."""
    if mtbf_s <= 0 or cost_s < 0:
        raise ValueError(f"need MTBF > 0 and cost >= 0, got MTBF={mtbf_s}, C={cost_s}")
    return float(np.sqrt(2.0 * mtbf_s * cost_s))


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(description="One phase of a bit-identical resume check, in a fresh process.")
    p.add_argument("--phase", choices=["reference", "first", "resume"], default="resume")
    p.add_argument("--root", required=True)
    p.add_argument("--spec", required=True, help="TrainSpec as JSON")
    p.add_argument("--steps", type=int, required=True,
                   help="steps to train to (from step 0, or from the checkpoint)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--format", default="torch", help="the checkpoint format of the `first` phase")
    a = p.parse_args(argv)
    out = _phase(a.phase, Path(a.root), TrainSpec(**json.loads(a.spec)), a.steps, a.device, a.format)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
