"""The malleable study's results beside Libutti et al.'s (resources/papers.yaml; the rows are built by
hpcdl.platform.orchestration.paper_vs_ours). The paper states a direction only: it follows this run's claims
that a job's thread count changes within an iteration and that malleable co-scheduling beats rigid."""

from __future__ import annotations

from hpcdl.platform import Ours

PAPER = {
    "effective": Ours("claims change_within_one_iteration, malleable_beats_rigid",
                      claims=("change_within_one_iteration", "malleable_beats_rigid")),
}
