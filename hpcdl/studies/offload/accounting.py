"""The fast tier's resident bytes: a registry of the tensors that live in it, under an enforced budget.

Every tensor the training step keeps in the fast tier is charged here when it is allocated and
released when it dies (a weakref finalizer, or an explicit release at a program point that does
not depend on timing): parameters, gradients, optimizer state held in memory, saved activations,
prefetched activations and the optimizer's bucket staging buffers. Transient temporaries of one
kernel (a matmul's output before it is saved) are not charged; the process's peak RSS, measured
beside it, shows everything. Exceeding the budget raises `BudgetExceeded`: that is the trial failing,
which is how the capacity search decides that a model does not fit.

Beside the peak of everything, the registry keeps the peak of the model's state alone (every kind but
the saved activations: parameters, gradients, fp32 master weights, optimizer state and staging), the
numerator of the fast tier's bytes per parameter (`state_peak`; train.py divides it by the parameters).
"""

from __future__ import annotations

import threading
import weakref

NOT_MODEL_STATE = frozenset({"activations"})  # scales with the batch, not with the parameters


class BudgetExceeded(MemoryError):
    """A charge would take the fast tier past its budget (the trial does not fit)."""


class TensorTooLarge(ValueError):
    """One tensor alone is larger than the whole budget: a configuration error, not a capacity limit."""


def fmt_bytes(n: int) -> str:
    return f"{n / 2**20:.2f} MiB ({n} bytes)"


class FastTier:
    def __init__(self, budget_bytes: int | None, budget_key: str = "offload.budget_mb"):
        self.budget = budget_bytes
        self.budget_key = budget_key
        self.resident = 0
        self.peak = 0
        self.by_kind: dict[str, int] = {}
        self.peak_by_kind: dict[str, int] = {}
        self.state_resident = 0
        self.state_peak = 0
        self._lock = threading.Lock()

    def check_single(self, nbytes: int, what: str) -> None:
        if self.budget is not None and nbytes > self.budget:
            raise TensorTooLarge(
                f"config key '{self.budget_key}': the budget {fmt_bytes(self.budget)} is smaller than the "
                f"largest single tensor, {what} of {fmt_bytes(nbytes)}; raise {self.budget_key} above it"
            )

    def charge(self, nbytes: int, kind: str, what: str = "") -> None:
        self.check_single(nbytes, what or kind)
        with self._lock:
            if self.budget is not None and self.resident + nbytes > self.budget:
                raise BudgetExceeded(
                    f"fast tier over budget: {fmt_bytes(self.resident)} resident + {what or kind} "
                    f"{fmt_bytes(nbytes)} > {self.budget_key} = {fmt_bytes(self.budget)}"
                )
            self.resident += nbytes
            self.by_kind[kind] = self.by_kind.get(kind, 0) + nbytes
            if self.resident > self.peak:
                self.peak = self.resident
                self.peak_by_kind = dict(self.by_kind)
            if kind not in NOT_MODEL_STATE:
                self.state_resident += nbytes
                self.state_peak = max(self.state_peak, self.state_resident)

    def release(self, nbytes: int, kind: str) -> None:
        with self._lock:
            self.resident -= nbytes
            self.by_kind[kind] -= nbytes
            if kind not in NOT_MODEL_STATE:
                self.state_resident -= nbytes

    def track(self, tensor, kind: str, what: str = ""):
        """Charge a tensor's bytes now and release them when the tensor is garbage collected."""
        n = tensor.numel() * tensor.element_size()
        self.charge(n, kind, what)
        weakref.finalize(tensor, self.release, n, kind)
        return tensor
