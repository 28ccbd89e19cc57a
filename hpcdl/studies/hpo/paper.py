"""The HPO study's results beside Kahira's published ones (resources/papers.yaml; the rows are built by
hpcdl.platform.orchestration.paper_vs_ours). The paper states a direction only: it follows claim
hpo.grid_speedup."""

from __future__ import annotations

from hpcdl.platform import Ours

PAPER = {
    "pycompss_accelerates": Ours("claim hpo.grid_speedup", claims=("hpo.grid_speedup",)),
    "grid": Ours("hpo.grid", context=(
        "ours: the same optimizers (adam / sgd / rmsprop) and batch sizes (32 / 64 / 128) in hpo.grid, "
        "timed on the configured worker (or GPU) counts")),
}
