"""Fail fast when the Slurm executor is selected but Slurm cannot be reached.

Without this, a missing `sbatch` surfaces only when the first job is submitted (after the DAG is
built and local rules may have run), and an unreachable controller can leave the executor polling.
The Snakefile calls `require_slurm()` when `workflow.executor` / `--executor` is "slurm".
"""

from __future__ import annotations

import os
import shutil
import subprocess

SLURM_CLIENTS = ("sbatch", "squeue", "scancel", "srun")


class SlurmUnavailable(RuntimeError):
    """The Slurm client tools are missing or the controller does not answer."""


def require_slurm(*, ping: bool = True, timeout_s: float = 20.0, path: str | None = None) -> None:
    """Raise SlurmUnavailable naming what is missing, before any job is submitted.

    `path` defaults to $PATH; `ping` also asks slurmctld (`scontrol ping`) whether it is up.
    """
    search = path if path is not None else os.environ.get("PATH", "")
    missing = [tool for tool in SLURM_CLIENTS if shutil.which(tool, path=search) is None]
    if missing:
        raise SlurmUnavailable(
            f"the Slurm executor was selected (--profile slurm / --executor slurm) but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH. "
            f"Load your site's Slurm module or run without the profile: snakemake --cores N")
    if not ping:
        return
    scontrol = shutil.which("scontrol", path=search)
    if scontrol is None:
        return  # some sites hide scontrol from users; sbatch will report a dead controller itself
    try:
        out = subprocess.run([scontrol, "ping"], capture_output=True, text=True,
                             timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"`scontrol ping` did not answer within {timeout_s:.0f} s: "
                               f"is slurmctld running?") from None
    if out.returncode != 0 or "is UP" not in out.stdout:
        detail = (out.stdout + out.stderr).strip().splitlines()
        raise SlurmUnavailable("slurmctld is not reachable (`scontrol ping`: "
                               f"{detail[0] if detail else f'exit {out.returncode}'})")


def require_slurm_for(executor: str | None) -> None:
    """Call from the Snakefile's `onstart:` with the executor's name; checks only for "slurm"."""
    if executor == "slurm":
        require_slurm()
