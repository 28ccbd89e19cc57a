"""The host's load from outside a run while one of its repeats is timed, read from /proc.

/proc/stat gives the CPU seconds every core spent busy (user, nice, system, irq, softirq) and stolen
by the hypervisor (steal). The run's own CPU seconds are those of the process that times the repeat
and of every process below it (/proc/<pid>/stat: utime + stime, and cutime + cstime for the children
it has already reaped), so a local backend's worker pool and a job's forkserver count as the run.
Other load = (machine busy + steal - the run's own CPU) / wall seconds: the cores something else took
while the repeat was timed. A repeat above its study's `disturbed_load_cores` is left out of the claim
that pairs it (docs/architecture.md, "Results"). Ticks are 1/CLK_TCK s (10 ms): time repeats of many
iterations, not one.
"""

from __future__ import annotations

import os
import time

_TICK = 1.0 / os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> tuple[float, float]:
    """(busy CPU seconds of all cores, seconds stolen by the hypervisor) since boot."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan"), float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) * _TICK, steal * _TICK


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks of the process and of its reaped children)."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:  # gone between the listing and the read
            continue
        # the command name may hold spaces and parentheses: the fields start after the last ')'
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(entry.name)] = (int(fields[1]), sum(int(v) for v in fields[11:15]))
    return out


def process_tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds of `root` (default: this process) and every live process below it, the children
    they have reaped included."""
    root = os.getpid() if root is None else root
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    ticks, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            ticks += procs[pid][1]
            todo.extend(children.get(pid, ()))
    return ticks * _TICK


def other_load_cores(machine_busy_s: float, steal_s: float, run_cpu_s: float, wall_s: float) -> float:
    """Cores' worth of CPU taken by anything outside the run during `wall_s` seconds."""
    if not wall_s > 0:
        return float("nan")
    return max(0.0, machine_busy_s + steal_s - run_cpu_s) / wall_s


class HostLoad:
    """The host's other load over one timed repeat: `start()` before it, `stop()` after."""

    def __init__(self):
        self.wall = self.run_cpu = self.busy = self.steal = 0.0

    def start(self) -> HostLoad:
        self.busy, self.steal = machine_cpu_s()
        self.run_cpu = process_tree_cpu_s()
        self.wall = time.perf_counter()
        return self

    def stop(self) -> dict:
        """{"wall_s", "machine_busy_s", "steal_s", "run_cpu_s", "other_load_cores"} over the repeat."""
        wall = time.perf_counter() - self.wall
        run_cpu = process_tree_cpu_s() - self.run_cpu
        busy, steal = machine_cpu_s()
        got = {"wall_s": wall, "machine_busy_s": busy - self.busy, "steal_s": steal - self.steal,
               "run_cpu_s": run_cpu}
        return {**got, "other_load_cores": other_load_cores(got["machine_busy_s"], got["steal_s"], run_cpu,
                                                            wall)}
