"""Writing results: figures and tidy tables with their provenance sidecars (docs/architecture.md,
"Results"); the files are written atomically (hpcdl.platform.kit.atomic) and the sidecars read back
by hpcdl.platform.kit.sidecars."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import pandas as pd

from hpcdl.platform.kit.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text, json_default
from hpcdl.platform.kit.sidecars import provenance_path
from hpcdl.platform.kit.study_dir import FIGURES, TABLES, StudyDir

PROVENANCE_PACKAGES = ("torch", "numpy", "pandas", "matplotlib", "snakemake", "optuna", "safetensors",
                       "h5py", "jsonschema", "pycompss")


# The PNG text chunk in which save_figure records what a figure shows: MEASURED (this run's
# measurements, the default) or MODEL (a model's prediction only). The figures stage writes each
# caption's run part from it (hpcdl.platform.orchestration.captions).
FIGURE_BASIS_KEY = "hpcdl-basis"
MEASURED, MODEL = "measured", "model"


def save_figure(fig, path: str | Path, dpi: int = 120, model_only: bool = False) -> Path:
    """Render a matplotlib figure to PNG in memory, write it atomically, close the figure.

    A study's figure (`<study_dir>/figures/<name>.png`) is stamped in its lower left corner with
    the device its run was measured on (StudyDir.measured_on), so the image says it wherever it goes;
    a `model_only` figure (a model's prediction, nothing in it measured) is stamped "model" instead.
    Either is recorded in the PNG (`figure_basis`).
    """
    import io

    import matplotlib.pyplot as plt

    path = Path(path)
    stamp = "model: a prediction, nothing in this figure is measured" if model_only else ""
    held = StudyDir.holding(path)
    if held and held[1] == FIGURES and not model_only:
        device = held[0].measured_on()
        stamp = f"measured on {device}" if device else ""
    if stamp:  # under everything already drawn (legends below the axes included)
        fig.draw_without_rendering()  # runs a layout engine first, as savefig will
        box = fig.get_tightbbox(fig.canvas.get_renderer())
        width, height = fig.get_size_inches()
        fig.text(box.x0 / width, box.y0 / height, stamp, ha="left", va="top", fontsize=7, color="dimgray")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight",
                metadata={FIGURE_BASIS_KEY: MODEL if model_only else MEASURED})
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def figure_basis(path: str | Path) -> str:
    """MODEL or MEASURED, as save_figure recorded it in the PNG; MEASURED where the file records
    nothing (a PNG from elsewhere), "" where there is no readable PNG."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return str(getattr(img, "text", {}).get(FIGURE_BASIS_KEY, MEASURED))
    except (OSError, UnidentifiedImageError):
        return ""


def mark_no_data(ax, why: str) -> None:
    """Say on an axes why it is empty (a figure the workflow expects is still written)."""
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True, transform=ax.transAxes)


def config_hash(obj) -> str:
    """sha256 of the canonical JSON form: equal configs hash equal whatever the key order."""
    canon = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=json_default)
    return hashlib.sha256(canon.encode()).hexdigest()


def git_commit(repo: Path | None = None) -> str:
    repo = repo or Path(__file__).resolve().parents[3]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not sha:
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def package_versions(names=PROVENANCE_PACKAGES) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (platform.processor() where there is no /proc)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


# The task backend this process runs under, as the task runtime records it when it chooses one
# (hpcdl.platform.orchestration.task_runtime.backend): this wing reads it here, never asks a runtime.
_TASK_BACKEND: dict = {}


def record_task_backend(record: dict) -> None:
    """Called by the task runtime once it has chosen this process's backend; every table written
    afterwards names it in its provenance (`runtime`). A process that runs no task app (a stage)
    chooses none, and its tables carry their raw tables' backends instead (`task_runtime`)."""
    _TASK_BACKEND.clear()
    _TASK_BACKEND.update(record)


def provenance(cfg: dict, started_at: float, ended_at: float | None = None) -> dict:
    ended_at = time.time() if ended_at is None else ended_at
    slurm = {k: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_NTASKS",
                                        "SLURM_CPUS_PER_TASK", "SLURM_JOB_NODELIST") if k in os.environ}
    return {
        "config_hash": config_hash(cfg),
        "git_commit": git_commit(),
        "packages": package_versions(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cores": available_cores(),
        "cpu_model": cpu_model(),
        "start_time": _iso(started_at),
        "end_time": _iso(ended_at),
        "duration_s": round(ended_at - started_at, 3),
        "slurm": slurm,
        **({"runtime": dict(_TASK_BACKEND)} if _TASK_BACKEND else {}),
    }


def device_provenance(table_path: Path, cfg: dict) -> dict:
    """The device of the run a table comes from: the record its task app made once, at its start
    (StudyDir.record_device), whichever process writes the table; a derived table on another host
    copies it. A raw table written outside a recorded run (a benchmark, a test) resolves it here.
    {} where the config is not one study's."""
    held = StudyDir.holding(table_path)
    if held:
        recorded = held[0].device()
        if recorded or held[1] == TABLES:
            return recorded
    studies = cfg.get("studies") or []
    if len(studies) != 1 or not isinstance(cfg.get(studies[0]), dict):
        return {}
    from hpcdl.platform.kit.config import ConfigError
    from hpcdl.platform.kit.device import device_record

    try:
        return device_record(cfg, studies[0])
    except ConfigError as exc:  # provenance informs, it never stops a write
        return {"device_requested": cfg[studies[0]].get("device", "auto"), "device": f"unresolved: {exc}"}


def write_table(df: pd.DataFrame, path: str | Path, cfg: dict, started_at: float) -> Path:
    """A tidy CSV (one row per measurement) plus its `<name>.provenance.json` sidecar, both atomic."""
    path = Path(path)
    if path.suffix != ".csv":
        raise ValueError(f"tables are CSV files, got {path}")
    atomic_write_text(path, df.to_csv(index=False))
    meta = provenance(cfg, started_at)
    meta.update(table=path.name, rows=len(df), columns=list(map(str, df.columns)))
    meta.update(device_provenance(path, cfg))
    held = StudyDir.holding(path)
    task_runtimes = held[0].task_runtimes() if held and held[1] == TABLES else []
    if task_runtimes:
        meta["task_runtime"] = task_runtimes
    atomic_write_json(provenance_path(path), meta)
    return path


def read_table(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"table {path} does not exist (run the study's earlier rules first)")
    return pd.read_csv(path)
