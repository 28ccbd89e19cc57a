"""Claims stage of the memory-offload study: tables/ -> the six claims (memory ratio, hidden transfer
fraction, equal weights, capacity ratio of Myelin's 'both'; memory and capacity ratio of ZeRO-Offload's
'zero_offload'), their thresholds from the config (`offload.claims`), each paper's line and source in
the evidence (`PAPER_LINES`, as resources/papers.yaml quotes them).

Every ratio is against 'none' at the same precision (`offload.precision`: every strategy runs at it).

The memory claims are judged on the measured fast-tier peak of the same run (`peak_fast_bytes`: CUDA,
torch.cuda.max_memory_allocated; CPU, the anonymous RSS high-water mark above the run's start). The tensor
registry's peak (`peak_accounted_bytes`) is a cross-check in the evidence, flagged where the two ratios
are more than `cross_check_factor` apart. A strategy that holds more fast memory than 'none', or fits
fewer parameters under the budget, fails its memory or capacity claim whatever the tier.

The slow-tier gate (verdicts/gate.py) covers the memory, capacity and hidden-fraction claims, not the
weights: where the slow tier, measured in the same run (tables/tiers.csv, tiers.py), is not
`slow_tier_min_slowdown` times slower than the fast tier in both directions (files through the page
cache are RAM), a claim that would pass or straddle is "not measured on this host"; a failed one stays
failed.

The hidden fraction is judged per strategy on the 95 % interval of its measured steps' own fractions
(hpcdl.platform's intervals): a value at the threshold straddles instead of passing by a hair.

The families live in verdicts/: memory.py, capacity.py, hidden.py, weights.py, gate.py.
"""

from __future__ import annotations

from pathlib import Path

from hpcdl.platform import (
    FAILURE_COLUMNS,
    StudyDir,
    deterministic,
    measured_afresh,
    read_or_empty,
    read_tables,
    unseeded,
)
from hpcdl.studies.offload.verdicts import capacity, hidden, memory
from hpcdl.studies.offload.verdicts.common import PAPER_LINES
from hpcdl.studies.offload.verdicts.gate import on_this_host
from hpcdl.studies.offload.verdicts.weights import claim_weights

__all__ = ["CLAIMS", "CONFIRMATION", "PAPER_LINES", "judge"]

CLAIMS = ("memory_ratio", "hidden_fraction", "weights_equal", "capacity_ratio", "zero_memory_ratio",
          "zero_capacity_ratio")
# where each verdict is confirmed (hpcdl.platform.kit.confirmation): sizes come from the config, values
# from the seed, and no memory peak or timing depends on the values
CONFIRMATION = {
    "memory_ratio": unseeded("measured peaks of this run: tensor sizes, not the seeded values, decide them"),
    "hidden_fraction": measured_afresh("transfer and step times of this run"),
    "weights_equal": deterministic("each strategy's weights equal those of 'none' bit for bit (zero_offload: "
                                   "within tolerance.py's tolerance, its host Adam's kernels deterministic "
                                   "too), from one seed"),
    "capacity_ratio": unseeded("the largest depth whose measured peak fits the budget: tensor sizes, not the "
                               "seeded values, decide it"),
    "zero_memory_ratio": unseeded("measured peaks of this run: tensor sizes, not the seeded values, "
                                  "decide them"),
    "zero_capacity_ratio": unseeded("the largest depth whose measured peak fits the budget: tensor sizes, "
                                    "not the seeded values, decide it"),
}


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    # tiers: both tiers' bandwidths, measured in the same run: is the slow tier slower?
    tr, cap, host = read_tables(study_dir, "tradeoff", "capacity", "tiers")
    fails = read_or_empty(StudyDir(study_dir).table("failures"), columns=FAILURE_COLUMNS)
    block = cfg["offload"]
    return [
        on_this_host(memory.claim_memory(tr, block, fails), host, block, memory.finding),
        on_this_host(hidden.claim_hidden(tr, block, fails), host, block, hidden.finding),
        claim_weights(tr, block, fails),
        on_this_host(capacity.claim_capacity(cap, tr, block, fails), host, block, capacity.finding),
        on_this_host(memory.claim_memory(tr, block, fails, "zero_memory_ratio"), host, block, memory.finding),
        on_this_host(capacity.claim_capacity(cap, tr, block, fails, "zero_capacity_ratio"), host, block,
                     capacity.finding),
    ]
