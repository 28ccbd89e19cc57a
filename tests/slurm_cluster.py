"""pytest plugin: a real Slurm for tests marked `slurm` (started by .ci/slurm.sh).

`slurm_cluster` (session scope) brings the cluster up once and always brings it down at the end of
the session, but only if this session started it (a cluster someone left running stays up). Its
default partition is this host's own node. `slurm_two_nodes` is the same cluster's partition of two
more nodes, each a slurmd in its own network namespace with its own address and hostname.
Where Slurm cannot be started (not root, no apt-get: the script exits 77), or the two nodes' network
cannot be built here, the tests skip with the reason, except under CI=true, where they fail instead:
CI must exercise the cluster path.

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


@dataclass
class TwoNodes:
    """The partition of the two namespaced nodes: a job there with -N2 has ranks on both."""

    partition: str
    nodes: tuple[str, ...]          # node names = their hostnames, in the order Slurm lists them
    addresses: dict[str, str]       # node -> its address on the cluster's bridge
    links: dict[str, str]           # node -> the host end of its veth: what its traffic crosses

    def link_bytes(self, node: str, direction: str) -> int:
        """Bytes the node sent ("tx") or received ("rx") over its link so far (the host end counts the
        node's sends as received)."""
        flip = {"tx": "rx", "rx": "tx"}[direction]
        return int(Path(f"/sys/class/net/{self.links[node]}/statistics/{flip}_bytes").read_text())


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


MULTI_PARTITION = "multi"


@pytest.fixture(scope="session")
def slurm_two_nodes(slurm_cluster):
    """The cluster's two-node partition, both nodes idle; unavailable (skip, or fail in CI) with the
    reason .ci/slurm.sh recorded when it could not build their network."""
    off = slurm_cluster.state_dir / "multi.unavailable"
    if off.exists():
        unavailable(f"no two-node partition: {off.read_text().strip()}")
    listing = slurm_cluster.state_dir / "multi.nodes"
    if not listing.exists():
        unavailable(f"{listing} is missing: the cluster was started without its two namespaced nodes")
    rows = [line.split() for line in listing.read_text().splitlines() if line.strip()]
    sinfo = subprocess.run(["sinfo", "-h", "-N", "-p", MULTI_PARTITION, "-o", "%N %t"],
                           capture_output=True, text=True, check=False, timeout=30)
    states = dict(line.split() for line in sinfo.stdout.splitlines() if line.strip())
    if sinfo.returncode != 0 or set(states) != {r[0] for r in rows} or set(states.values()) != {"idle"}:
        pytest.fail(f"partition {MULTI_PARTITION} should hold {[r[0] for r in rows]}, all idle; sinfo: "
                    f"{sinfo.stdout.strip() or sinfo.stderr.strip()}\n{slurm_cluster.log_tail()}",
                    pytrace=False)
    return TwoNodes(MULTI_PARTITION, tuple(r[0] for r in rows), {r[0]: r[1] for r in rows},
                    {r[0]: r[2] for r in rows})
