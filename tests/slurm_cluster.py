"""pytest plugin: a real single-node Slurm for tests marked `slurm` (started by .ci/slurm.sh).

`slurm_cluster` (session scope) brings the cluster up once and always brings it down at the end of
the session, but only if this session started it (a cluster someone left running stays up).
Where Slurm cannot be started (not root, no apt-get: the script exits 77) the tests skip with the
reason, except under CI=true, where they fail instead: CI must exercise the cluster path.

Use it with `pytest_plugins = ["tests.slurm_cluster"]` or by importing the fixture.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / ".ci" / "slurm.sh"
CANNOT_START = 77


@dataclass
class SlurmCluster:
    state_dir: Path
    started_here: bool
    up_seconds: float

    def log_tail(self, n: int = 40) -> str:
        parts = []
        for f in sorted((self.state_dir / "log").glob("*.log")):
            parts.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-n:]))
        return "\n".join(parts)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str):
    """Skip locally; fail in CI, where the Slurm tests must run."""
    if in_ci():
        pytest.fail(f"CI=true but the Slurm test cluster is unavailable: {reason}", pytrace=False)
    pytest.skip(f"Slurm test cluster unavailable: {reason}")


def _script(cmd: str, state_dir: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "HPCDL_SLURM_DIR": str(state_dir)}
    return subprocess.run(["bash", str(SCRIPT), cmd], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _already_up(state_dir: Path) -> bool:
    status = _script("status", state_dir, 30)
    return "slurmctld pid" in status.stdout and "slurmd pid" in status.stdout


@pytest.fixture(scope="session")
def slurm_cluster():
    state_dir = Path(os.environ.get("HPCDL_SLURM_DIR", "/tmp/hpcdl-slurm"))
    if not SCRIPT.exists():
        unavailable(f"{SCRIPT} is missing")
    started_here = not _already_up(state_dir)
    t0 = time.monotonic()
    try:
        # apt-get update + install can take a minute on a cold machine
        up = _script("up", state_dir, 600)
    except subprocess.TimeoutExpired:
        _script("down", state_dir, 120)
        unavailable(".ci/slurm.sh up did not finish within 600 s")
    if up.returncode == CANNOT_START:
        unavailable(up.stderr.strip().splitlines()[-1] if up.stderr.strip() else "exit 77")
    if up.returncode != 0:
        _script("down", state_dir, 120)
        pytest.fail(f".ci/slurm.sh up failed (exit {up.returncode}):\n{up.stderr[-3000:]}", pytrace=False)
    cluster = SlurmCluster(state_dir, started_here, time.monotonic() - t0)
    try:
        yield cluster
    finally:
        if started_here:
            _script("down", state_dir, 120)
