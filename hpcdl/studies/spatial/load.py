"""The machine's other load during a timed phase, read from /proc.

/proc/stat gives the CPU seconds every core spent busy (user, nice, system, irq, softirq) and
stolen by the hypervisor (steal), in clock ticks; each rank's own CPU seconds come from its
process clock. Load from outside the run during a phase = machine busy + steal - the run's own
CPU seconds, per second of the phase: the cores other processes (or the hypervisor) took while
the phase was timed. Ticks are 1/CLK_TCK s (10 ms), so judge phases of many iterations, not one.
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


class PhaseLoad:
    """Snapshots taken at a phase's start and end on one process of the run."""

    def __init__(self):
        self.wall = self.own = self.busy = self.steal = 0.0

    def start(self) -> None:
        self.wall, self.own = time.perf_counter(), time.process_time()
        self.busy, self.steal = machine_cpu_s()

    def stop(self) -> dict:
        """{"wall_s", "own_cpu_s", "machine_busy_s", "steal_s"} over the phase (this process)."""
        busy, steal = machine_cpu_s()
        return {"wall_s": time.perf_counter() - self.wall, "own_cpu_s": time.process_time() - self.own,
                "machine_busy_s": busy - self.busy, "steal_s": steal - self.steal}


def other_load_cores(machine_busy_s: float, steal_s: float, run_cpu_s: float, wall_s: float) -> float:
    """Cores' worth of CPU taken by anything outside the run during a phase of `wall_s` seconds."""
    if not wall_s > 0:
        return float("nan")
    return max(0.0, machine_busy_s + steal_s - run_cpu_s) / wall_s
