"""CPU quotas through real cgroups: v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`) or v2 (`cpu.max`).

Every cgroup this study creates lives under one parent, `<cpu mount>/hpcdl-malleable/`, in a run
directory named `run-<owner pid>-<owner start time>-<random>`; the owner (the process that made
the run directory) removes it when the run ends, and `sweep_stale` removes run directories whose
owner is dead (a SIGKILLed owner cannot clean up after itself). cgroupfs accepts no ordinary
files, so the owner is encoded in the directory name; the start time guards against pid reuse.
"""

from __future__ import annotations

import errno
import math
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

PARENT = "hpcdl-malleable"
MIN_QUOTA_US = 1000  # the kernel refuses smaller quotas


class CgroupUnavailable(RuntimeError):
    """cgroups cannot be created or written here; str() says why."""


@dataclass(frozen=True)
class CpuController:
    version: int  # 1 or 2
    mount: Path  # where the hierarchy holding the cpu controller is mounted

    @property
    def base(self) -> Path:
        return self.mount / PARENT

    def set_quota(self, cgroup: Path, cores: float | None, period_us: int) -> None:
        """Limit `cgroup` to `cores` CPUs per period (None: unlimited)."""
        quota = None if cores is None else max(MIN_QUOTA_US, int(round(cores * period_us)))
        if self.version == 1:
            # The period first: a quota larger than the parent's allows is refused, not the period.
            _write(cgroup / "cpu.cfs_period_us", str(period_us))
            _write(cgroup / "cpu.cfs_quota_us", str(-1 if quota is None else quota))
        else:
            _write(cgroup / "cpu.max", f"{'max' if quota is None else quota} {period_us}")

    def quota_cores(self, cgroup: Path) -> float | None:
        return read_quota(cgroup, self.version)


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) from /proc/self/mountinfo."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) >= 5 and len(rest) >= 3:
            out.append((fields[4], rest[0], rest[2]))
    return out


def detect() -> CpuController:
    """The hierarchy that holds the cpu controller (v1 preferred: on a hybrid host it owns cpu)."""
    mounts = _mounts()
    for point, fstype, opts in mounts:
        if fstype == "cgroup" and "cpu" in opts.split(","):
            return CpuController(1, Path(point))
    for point, fstype, _ in mounts:
        controllers = Path(point) / "cgroup.controllers"
        if fstype == "cgroup2" and controllers.exists() and "cpu" in controllers.read_text().split():
            return CpuController(2, Path(point))
    raise CgroupUnavailable("no cgroup hierarchy with the cpu controller is mounted")


def usable() -> tuple[CpuController | None, str]:
    """(controller, "") when this process can create and write cgroups; (None, why) otherwise."""
    try:
        ctrl = detect()
    except (CgroupUnavailable, OSError) as exc:
        return None, str(exc)
    probe = ctrl.base / f"probe-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        _ensure_parent(ctrl)
        probe.mkdir()
        try:
            ctrl.set_quota(probe, 1.0, 100000)
        finally:
            probe.rmdir()
    except OSError as exc:
        why = {
            errno.EACCES: "permission denied",
            errno.EPERM: "not permitted (not root?)",
            errno.EROFS: "read-only cgroup file system",
        }.get(exc.errno, exc.strerror or str(exc))
        return None, f"cannot write cgroups under {ctrl.base}: {why}"
    return ctrl, ""


def _ensure_parent(ctrl: CpuController) -> None:
    ctrl.base.mkdir(exist_ok=True)
    if ctrl.version == 2:  # v2: a child sees the cpu files only if its parent delegates cpu
        for d in (ctrl.mount, ctrl.base):
            ctl = d / "cgroup.subtree_control"
            if "cpu" not in ctl.read_text().split():
                _write(ctl, "+cpu")


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # field 22: start time in clock ticks since boot


def _owner_alive(name: str) -> bool:
    parts = name.split("-")
    if len(parts) != 4 or parts[0] != "run" or not parts[1].isdigit():
        return True  # not ours to judge
    return _start_time(int(parts[1])) == parts[2]


def remove_tree(path: Path, timeout_s: float = 5.0) -> None:
    """Kill what is still inside (only processes of this study's own cgroups), then rmdir bottom-up."""
    if not path.exists():
        return
    dirs = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for d in [*dirs, path]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                for pid in _procs(d):
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass
                time.sleep(0.05)


def _procs(cgroup: Path) -> list[int]:
    try:
        return [int(x) for x in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def sweep_stale(ctrl: CpuController) -> list[str]:
    """Remove run directories whose owner process is gone; the names removed."""
    removed = []
    if not ctrl.base.is_dir():
        return removed
    for d in sorted(ctrl.base.iterdir()):
        if d.is_dir() and d.name.startswith("run-") and not _owner_alive(d.name):
            remove_tree(d)
            removed.append(d.name)
    return removed


class RunCgroups:
    """One run's cgroups: `<base>/run-<pid>-<start>-<rand>/job-<name>`, owned by this process."""

    def __init__(self, ctrl: CpuController, period_us: int):
        self.ctrl, self.period_us = ctrl, period_us
        _ensure_parent(ctrl)
        self.swept = sweep_stale(ctrl)
        self.path = ctrl.base / f"run-{os.getpid()}-{_start_time(os.getpid())}-{secrets.token_hex(4)}"
        self.path.mkdir()
        if ctrl.version == 2:
            _write(self.path / "cgroup.subtree_control", "+cpu")

    def job(self, name: str, cores: float | None) -> Path:
        path = self.path / f"job-{name}"
        path.mkdir(exist_ok=True)
        self.ctrl.set_quota(path, cores, self.period_us)
        return path

    def set_quota(self, path: Path, cores: float | None) -> None:
        self.ctrl.set_quota(path, cores, self.period_us)

    def remove(self) -> None:
        remove_tree(self.path)


def attach(cgroup: str | Path, pid: int = 0) -> None:
    """Move process `pid` (0: the caller) into `cgroup`."""
    _write(Path(cgroup) / "cgroup.procs", str(pid or os.getpid()))


def read_quota(cgroup: str | Path, version: int | None = None) -> float | None:
    """The cgroup's CPU quota in cores (None: unlimited)."""
    cgroup = Path(cgroup)
    if version == 2 or (version is None and (cgroup / "cpu.max").exists()):
        quota, period = (cgroup / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    quota = int((cgroup / "cpu.cfs_quota_us").read_text())
    period = int((cgroup / "cpu.cfs_period_us").read_text())
    return None if quota < 0 else quota / period


def own_cgroup() -> Path | None:
    """The cgroup directory holding this process's cpu controller (from /proc/self/cgroup)."""
    try:
        ctrl = detect()
    except (CgroupUnavailable, OSError):
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hier, controllers, rel = line.split(":", 2)
        if (ctrl.version == 1 and "cpu" in controllers.split(",")) or (ctrl.version == 2 and hier == "0"):
            return ctrl.mount / rel.lstrip("/")
    return None



def threads_for(quota_cores: float | None, max_threads: int) -> int:
    """The thread count that fits a quota: the nearest whole number of cores, at least 1."""
    if quota_cores is None:
        return max_threads
    return max(1, min(max_threads, math.floor(quota_cores + 0.5)))


def reopen(ctrl_version: int, mount: str, path: str, period_us: int) -> RunCgroups:
    """A handle on a run directory another process made (the driver uses its supervisor's)."""
    run = RunCgroups.__new__(RunCgroups)
    run.ctrl, run.period_us, run.swept = CpuController(ctrl_version, Path(mount)), period_us, []
    run.path = Path(path)
    return run
