"""Optuna JournalStorage in the results directory, and resuming a study after its driver died.

One journal per configuration (its name carries the hash of the hpo block and data location), so
editing the config starts fresh studies instead of mixing trials from two search spaces.
Only the driver writes to it; trial tasks never touch storage.
"""

from __future__ import annotations

import io
from pathlib import Path

import optuna
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import TrialState

from hpcdl.platform import atomic_write_bytes, config_hash

INTERRUPTED = "interrupted: the driver stopped while this trial was in flight; a replacement was queued"


def journal_path(cfg: dict) -> Path:
    key = config_hash({"hpo": cfg["hpo"], "data": cfg["data"]["fashion_mnist_dir"]})[:12]
    return Path(cfg["results_dir"]) / "hpo" / "journal" / f"journal-{key}.log"


def open_storage(path: str | Path) -> JournalStorage:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


def study_storage(cfg: dict):
    """The configured storage: hpo.storage_url (an RDB URL) if set, else the journal in the results dir."""
    url = cfg["hpo"].get("storage_url")
    if url:
        return optuna.storages.RDBStorage(url)
    return open_storage(journal_path(cfg))


def describe_storage(cfg: dict) -> str:
    url = cfg["hpo"].get("storage_url")
    return url.split("@")[-1] if url else str(journal_path(cfg))  # never print a password


class DeviceMismatch(ValueError):
    """The journal holds a study run on another device than the one this run resolves to."""


def check_device(storage, plans, key: str = "hpo.device") -> None:
    """Refuse to continue a study whose trials ran on another device (possible under `auto`, whose
    journal name is the same on a GPU host and a CPU one): its timings would mix two machines."""
    wanted = {p.name: p.device for p in plans}
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        stored = summary.user_attrs.get("plan", {}).get("device", "cpu")
        name = summary.study_name
        if name in wanted and stored != wanted[name]:
            raise DeviceMismatch(
                f"{key} resolves to {wanted[name]} here, but study {name!r} in the journal ran on {stored}: "
                f"a rerun continues the journal's studies, and their timings would mix devices; set {key}: "
                f"{stored}, or use another results_dir (or delete the journal) to start afresh")


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Mark trials left RUNNING by a dead driver as FAIL and queue a trial with the same params.

    Returns the numbers of the trials marked. A trial that died before all its params were
    sampled is not replaced: the sampler simply proposes a new one.
    """
    marked = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(t._trial_id, "fail_reason", INTERRUPTED)
        study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
        study.tell(t.number, state=TrialState.FAIL)
        if t.params and t.user_attrs.get("n_params") == len(t.params):
            study.enqueue_trial(dict(t.params), user_attrs={"replaces": t.number})
        marked.append(t.number)
    return marked


def counted(trial: optuna.trial.FrozenTrial) -> bool:
    """Trials that count towards n_trials: finished ones, except those interrupted by a driver death."""
    return (trial.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
            and not trial.user_attrs.get("interrupted", False))


def best_state_path(study_dir: Path, study_name: str) -> Path:
    return Path(study_dir) / "best" / f"{study_name}.pt"


def save_best(path: Path, trial_number: int, params: dict, value: float, state: dict) -> None:
    import torch  # only the driver's completion path needs it

    buf = io.BytesIO()
    torch.save({"trial": trial_number, "params": params, "value": value, "state": state}, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_best(path: Path) -> dict | None:
    import torch

    path = Path(path)
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)
