"""The machine's other load during a timed phase, read from /proc.

/proc/stat gives the CPU seconds every core spent busy (user, nice, system, irq, softirq) and
stolen by the hypervisor (steal), in clock ticks; each rank's own CPU seconds come from its
process clock. Load from outside the run during a phase = machine busy + steal - the run's own
CPU seconds, per second of the phase: the cores other processes (or the hypervisor) took while
the phase was timed. Ticks are 1/CLK_TCK s (10 ms), so judge phases of many iterations, not one.
"""

from __future__ import annotations

import time

# the /proc readings and the formula are the platform's (hpcdl.platform.kit.host_load), shared with
# hpo's grid and malleable's waves; a rank's own CPU is its process clock
from hpcdl.platform import machine_cpu_s, other_load_cores

__all__ = ["PhaseLoad", "other_load_cores"]


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
