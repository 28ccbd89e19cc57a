"""One experiment point in its own process group: `python -m hpcdl.studies.malleable.driver SPEC OUT`.

The supervisor (`run_point`, called by a task body) makes the point's cgroup run directory,
starts the driver as the leader of a new session (the driver, its forkserver and every job it
starts share that process group), waits, and then - however the driver ended, SIGKILL included -
kills whatever is left of the group and removes the cgroups. The driver itself dies with the
supervisor (PR_SET_PDEATHSIG), its forkserver with the driver, each job with the forkserver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcdl.platform import PACKAGE_ROOT, HostLoad, child_env
from hpcdl.studies.malleable import cgroups

QUOTA_KINDS = ("oversub",)


def needs_cgroups(point: dict) -> bool:
    """Whether the point cannot run without writable cgroups (the rest run with threads only)."""
    return point["experiment"] in QUOTA_KINDS or (
        point["experiment"] == "response" and point["method"] == "quota"
    )


def _execute(point: dict, workdir: Path, run) -> dict:
    """{"runs": [{"variant": v, **what v logged}]}: a point's variants one after the other, in its order."""
    from hpcdl.studies.malleable import response
    from hpcdl.studies.malleable.scheduler import CoScheduler

    kind = point["experiment"]
    runs = []
    if kind == "response":
        runs.append({"variant": point["method"], **response.response_point(point, workdir, run)})
    elif kind == "oversub":
        for mode in point["modes"]:
            res = response.oversub_point({**point, "mode": mode}, workdir, run)
            runs.append({"variant": mode, **res})
    elif kind == "cosched":
        defaults = {k: point[k] for k in ("batch_size", "model", "data_dir", "seed")}
        for policy in point["policies"]:
            # its own folder: every policy's jobs have the same names (their cgroups are re-quota'd)
            sched = CoScheduler(point["jobs"], policy, point["cores"], defaults, workdir / policy, run,
                                timeout_s=point["timeout_s"])
            # the host's other load over the wave: this driver, its forkserver and the jobs are the run
            load = HostLoad().start()
            got = sched.run()
            runs.append({"variant": policy, **got, "other_load_cores": load.stop()["other_load_cores"]})
    else:
        raise ValueError(f"unknown experiment {kind!r}")
    return {"runs": runs}


def main(argv: list[str] | None = None) -> None:
    spec_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    from hpcdl.studies.malleable.job import die_with_parent

    die_with_parent()
    # SIGTERM unwinds (the scheduler's finally kills its jobs); SIGKILL is the supervisor's to clean.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    spec = json.loads(Path(spec_path).read_text())
    cg = spec.get("cgroups")
    run = cgroups.reopen(cg["version"], cg["mount"], cg["path"], cg["period_us"]) if cg else None
    result = _execute(spec["point"], Path(spec["workdir"]), run)
    tmp = f"{out_path}.tmp"
    Path(tmp).write_text(json.dumps(result))
    os.replace(tmp, out_path)


class Driver:
    """A started driver: its process (leader of its own group), cgroups and files."""

    def __init__(self, point: dict, workdir: Path, period_us: int):
        self.point, self.workdir = point, Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.run = None
        self.enforcement = "threads"
        ctrl, self.cgroup_reason = cgroups.usable()
        if ctrl is not None:
            self.run = cgroups.RunCgroups(ctrl, period_us)
            self.enforcement = "quota+threads"
        self.out = self.workdir / "result.json"
        spec = {
            "point": point,
            "workdir": str(self.workdir),
            "cgroups": None
            if self.run is None
            else {
                "version": ctrl.version,
                "mount": str(ctrl.mount),
                "path": str(self.run.path),
                "period_us": period_us,
            },
        }
        spec_path = self.workdir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        self.stderr = open(self.workdir / "driver.log", "w")  # noqa: SIM115 (closed in finish)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hpcdl.studies.malleable.driver", str(spec_path), str(self.out)],
            start_new_session=True,
            stdout=self.stderr,
            stderr=subprocess.STDOUT,
            env=child_env(PACKAGE_ROOT),
        )

    def finish(self, timeout_s: float | None = None) -> int | None:
        """Wait (killing the group after timeout_s), then kill what is left and remove the cgroups."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # our own group: the driver is its leader
            except ProcessLookupError:
                pass
            self.proc.wait()
            _wait_group_gone(self.proc.pid)
            if self.run is not None:
                self.run.remove()
            self.stderr.close()
        return self.proc.returncode


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(stat.parent.name))
    return out


def _wait_group_gone(pgid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL is delivered at once but a process takes a moment to exit: wait until none is left."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)



def run_point(point: dict, period_us: int, timeout_s: float) -> dict:
    """Run one point in a driver; {"skipped": reason} when it needs cgroups that cannot be written."""
    workdir = Path(tempfile.mkdtemp(prefix=f"hpcdl-malleable-{point['experiment']}-"))
    try:
        if needs_cgroups(point):
            ctrl, why = cgroups.usable()
            if ctrl is None:
                return {"skipped": why, "enforcement": "none"}
        t0 = time.time()
        drv = Driver(point, workdir, period_us)
        code = drv.finish(timeout_s)
        if code != 0 or not drv.out.exists():
            tail = (workdir / "driver.log").read_text()[-3000:]
            raise RuntimeError(f"{point['experiment']} driver exited with code {code}: {tail}")
        result = json.loads(drv.out.read_text())
        result.update(enforcement=drv.enforcement, cgroup_reason=drv.cgroup_reason, wall_s=time.time() - t0)
        return result
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
