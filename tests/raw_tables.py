"""Comparing two runs' raw tables on every deterministic column (shared by the resume and
PyCOMPSs conformance tests)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

# Columns that measure time, bandwidth, memory or name a process: everything else is deterministic.
# (malleable: the iteration at which a mid-run change lands follows the wall clock; checkpoint: the
# storage ceiling paired with each save; offload: the fast tier's peak is measured memory, and the
# capacity search's depths and probes follow from it; its per-step hidden fractions are timings;
# hpo and malleable: the host's other load over a timed repeat.)
NONDETERMINISTIC = re.compile(r"(_s|_per_s|_mb|_rss_bytes|_frac|_frac_steps)$|^(worker|driver_pid|sessions)$"
                              r"|^(threads_run|quota_cores_seen|applied_iteration)$"
                              r"|^(ceiling_spread|bw_over_ceiling|other_load_cores)$"
                              r"|^(peak_fast_bytes|peak_fast_bytes_at_max|peak_accounted_bytes_at_max|max_depth"
                              r"|max_params|capped_at_max_depth|trials|probes)$")


def deterministic(df: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in df.columns if not NONDETERMINISTIC.search(c)]
    return df[cols].sort_values(cols, kind="stable").reset_index(drop=True)


def assert_same_raw_tables(raw: Path, reference: Path) -> list[str]:
    """The same CSV tables with the same columns, equal on every deterministic column; their names."""
    names = sorted(p.name for p in reference.glob("*.csv"))
    assert names and names == sorted(p.name for p in raw.glob("*.csv")), (names, raw)
    for name in names:
        got, want = pd.read_csv(raw / name), pd.read_csv(reference / name)
        assert list(got.columns) == list(want.columns), name
        pd.testing.assert_frame_equal(deterministic(got), deterministic(want), check_exact=False,
                                      rtol=1e-9, obj=str(raw / name))
    return names
