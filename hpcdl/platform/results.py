"""Writing results: atomic files, figures, tidy tables with provenance sidecars
(docs/architecture.md, "Results")."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from functools import cache
from importlib import metadata
from pathlib import Path

import pandas as pd

PROVENANCE_PACKAGES = ("torch", "numpy", "pandas", "matplotlib", "snakemake", "optuna", "safetensors",
                       "h5py", "jsonschema", "pycompss")


@cache
def _umask() -> int:
    """The process's umask, read once, on first use rather than at import. Linux shows it in
    /proc/self/status; elsewhere reading it means setting it (to 0, for a moment) and back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write to a temp file in the same directory, fsync, rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(obj):
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Render a matplotlib figure to PNG in memory, write it atomically, close the figure.

    A study's figure (`<study_dir>/figures/<name>.png`) is stamped in its lower left corner with
    the device its run was measured on (`study_measured_on`), so the image says it wherever it goes.
    """
    import io

    import matplotlib.pyplot as plt

    path = Path(path)
    if path.parent.name == "figures":
        device = study_measured_on(path.parent.parent)
        if device:  # under everything already drawn (legends below the axes included)
            fig.draw_without_rendering()  # runs a layout engine first, as savefig will
            box = fig.get_tightbbox(fig.canvas.get_renderer())
            width, height = fig.get_size_inches()
            fig.text(box.x0 / width, box.y0 / height, f"measured on {device}", ha="left", va="top",
                     fontsize=7, color="dimgray")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def mark_no_data(ax, why: str) -> None:
    """Say on an axes why it is empty (a figure the workflow expects is still written)."""
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True, transform=ax.transAxes)


def config_hash(obj) -> str:
    """sha256 of the canonical JSON form: equal configs hash equal whatever the key order."""
    canon = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha256(canon.encode()).hexdigest()


def git_commit(repo: Path | None = None) -> str:
    repo = repo or Path(__file__).resolve().parents[2]
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


def measured_on(records: list[dict]) -> str:
    """The device a run was measured on, from its provenance records: "GPU: <model>" where they
    name a GPU, else "CPU: <model> (<n> cores)"; "" without records. Distinct values are joined
    with " / " (tables from different machines)."""
    if not records:
        return ""
    gpus = sorted({str(r["gpu_model"]) for r in records if r.get("gpu_model")})
    if gpus:
        return "GPU: " + " / ".join(gpus)
    cpus = sorted({f"{r.get('cpu_model') or 'unknown model'} ({r.get('cores', '?')} cores)" for r in records})
    return "CPU: " + " / ".join(cpus)


def run_sidecars(study_dir: str | Path) -> list[dict]:
    """A study run's provenance: its raw tables' sidecars (the derived tables' where there are none)."""
    study_dir = Path(study_dir)
    return read_sidecars(study_dir / "raw") or read_sidecars(study_dir / "tables")


def study_measured_on(study_dir: str | Path) -> str:
    """`measured_on` of a study's run (`run_sidecars`)."""
    return measured_on(run_sidecars(study_dir))


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def runtime_record() -> dict:
    """The task backend this process chose (and the PyCOMPSs binding's version where there is one)."""
    # imported here so that writing a table from compute code loads nothing of the task runtime
    from hpcdl.platform.task_runtime.backend import backend_info

    return backend_info().as_dict()


def _task_runtimes(table_path: Path) -> list[dict]:
    """For a derived table in <study>/tables/: the backends recorded by the raw tables it came from."""
    if table_path.parent.name != "tables":
        return []
    seen = []
    for rec in read_sidecars(table_path.parent.parent / "raw"):
        if rec.get("runtime") and rec["runtime"] not in seen:
            seen.append(rec["runtime"])
    return seen


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
        "runtime": runtime_record(),
    }


# What a sidecar says about the device (hpcdl.platform.device.device_record).
DEVICE_KEYS = ("device_requested", "device", "gpu_model", "gpu_count", "gpu_capability", "gpu_memory_bytes",
               "driver", "cuda", "cudnn", "nccl")


def device_provenance(table_path: Path, cfg: dict) -> dict:
    """The device of the run a table comes from. A raw table's is resolved here, in the process that
    measured it; a derived table (<study>/tables/) copies its raw tables', since the stage that
    writes it may run on another host. {} where the config is not one study's."""
    if table_path.parent.name == "tables":
        for rec in read_sidecars(table_path.parent.parent / "raw"):
            if rec.get("device"):
                return {k: rec[k] for k in DEVICE_KEYS if k in rec}
        return {}
    studies = cfg.get("studies") or []
    if len(studies) != 1 or not isinstance(cfg.get(studies[0]), dict):
        return {}
    from hpcdl.platform.config import ConfigError
    from hpcdl.platform.device import device_record

    try:
        return device_record(cfg, studies[0])
    except ConfigError as exc:  # provenance informs, it never stops a write
        return {"device_requested": cfg[studies[0]].get("device", "auto"), "device": f"unresolved: {exc}"}


def provenance_path(table_path: str | Path) -> Path:
    table_path = Path(table_path)
    return table_path.with_name(table_path.stem + ".provenance.json")


def read_sidecars(directory: str | Path, table: str = "*") -> list[dict]:
    """The provenance sidecars of the tables in `directory` (or of one `table`), in name order.

    A sidecar that cannot be read or parsed is left out: provenance informs, it never stops a stage.
    """
    records = []
    for side in sorted(Path(directory).glob(f"{table}.provenance.json")):
        try:
            records.append(json.loads(side.read_text()))
        except (OSError, ValueError):
            continue
    return [r for r in records if isinstance(r, dict)]


def write_table(df: pd.DataFrame, path: str | Path, cfg: dict, started_at: float) -> Path:
    """A tidy CSV (one row per measurement) plus its `<name>.provenance.json` sidecar, both atomic."""
    path = Path(path)
    if path.suffix != ".csv":
        raise ValueError(f"tables are CSV files, got {path}")
    atomic_write_text(path, df.to_csv(index=False))
    meta = provenance(cfg, started_at)
    meta.update(table=path.name, rows=len(df), columns=list(map(str, df.columns)))
    meta.update(device_provenance(path, cfg))
    task_runtimes = _task_runtimes(path)
    if task_runtimes:
        meta["task_runtime"] = task_runtimes
    atomic_write_json(provenance_path(path), meta)
    return path


def read_table(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"table {path} does not exist (run the study's earlier rules first)")
    return pd.read_csv(path)
