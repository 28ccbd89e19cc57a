"""Claim strong_efficiency_2: 2-rank strong scaling against this machine's own ceiling, per layout, on the
interval of its per-repeat efficiencies where it has them."""

from __future__ import annotations

import pandas as pd

from hpcdl.platform import CONFIDENCE, above, every, mean_interval, not_measured
from hpcdl.studies.spatial.claim_families.runs import all_disturbed, load_evidence, run_missing


def _repeat_efficiencies(rep_times: pd.DataFrame, run: str, ceiling: str) -> pd.Series:
    """Per repeat kept in both runs: the ceiling's iteration time over the 2-rank run's, which is the
    speedup over 1 rank divided by the ceiling's speedup (the 1-rank time cancels), paired by repeat:
    the two ran in one launch, step by step (sweep.expand)."""
    if not {"run", "repeat", "time_per_iter_s"} <= set(rep_times):
        return pd.Series(dtype=float)
    t = rep_times.pivot_table(index="repeat", columns="run", values="time_per_iter_s", aggfunc="first")
    if run not in t or ceiling not in t:
        return pd.Series(dtype=float)
    return (t[ceiling] / t[run]).dropna()


def claim_efficiency(block: dict, df: pd.DataFrame, raw: pd.DataFrame, timed: dict,
                     rep_times: pd.DataFrame, gpus: dict | None = None) -> dict:
    need = block["claims"]["min_efficiency"]
    statement = (f"2-rank strong scaling on the {block['strong']['grid']}^3 input reaches >= {need:.0%} "
                 "of this machine's own ceiling: speedup over 1 rank / ceiling speedup, where the ceiling "
                 "is the same per-rank compute run as independent processes at once with no "
                 "communication, measured in the 2-rank run's own launch, their steps alternating; one "
                 "thread per rank, every 2-rank strong layout; "
                 f"judged on the {CONFIDENCE:.0%} interval of the per-repeat efficiencies (ceiling time / "
                 "2-rank time of the same launch) where 2 or more repeats were kept (straddles where it "
                 "crosses the line), else on the run's efficiency")
    names = {tuple(lay): "strong-d{}x{}x{}".format(*lay) for lay in block["strong"]["layouts"]}
    base = [n for lay, n in names.items() if lay == (1, 1, 1)]
    two = [n for lay, n in names.items() if lay[0] == 1 and lay[1] * lay[2] == 2]
    if not base or not two:
        return not_measured("strong_efficiency_2", statement, "spatial.strong.layouts needs [1, 1, 1] and a "
                            f"2-rank spatial layout, has {block['strong']['layouts']}", threshold=need)
    if not block.get("ceiling", True):
        return not_measured("strong_efficiency_2", statement, "spatial.ceiling is false: no ceiling measured",
                            threshold=need)
    if base[0] not in timed:
        return not_measured("strong_efficiency_2", statement, run_missing(raw, base[0]), threshold=need)
    ceil_of = {n: n.replace("strong", "ceiling") for n in two}
    shared = {n: (gpus or {})[n] for n in two if n in (gpus or {})}
    if shared:  # one GPU judges what one GPU can: the ranks shared it
        return not_measured("strong_efficiency_2", statement, [f"{n}: {why}" for n, why in shared.items()],
                            threshold=need, time_per_iter_s={r: timed[r] for r in timed if r in shared
                                                             or r in base or r in ceil_of.values()})
    speedup, ceiling, eff, missing = {}, {}, {}, {}
    for n in two:
        gone = [r for r in (n, ceil_of[n]) if r not in timed]
        if gone:
            missing[n] = "; ".join(run_missing(raw, r) for r in gone)
            continue
        speedup[n] = timed[base[0]] / timed[n]
        ceiling[n] = timed[base[0]] / timed[ceil_of[n]]
        eff[n] = speedup[n] / ceiling[n]
    per_repeat = {n: _repeat_efficiencies(rep_times, n, ceil_of[n]) for n in eff}
    ivs = {n: mean_interval(v) for n, v in per_repeat.items() if len(v) >= 2}
    runs = [base[0], *two, *ceil_of.values()]
    evidence = dict(efficiency=eff, speedup=speedup, ceiling_speedup=ceiling,
                    efficiency_per_repeat={
                        n: iv.evidence(keys=[f"repeat {int(k)}" for k in per_repeat[n].index])
                        for n, iv in ivs.items()},
                    time_per_iter_s={r: timed[r] for r in runs if r in timed}, threshold=need,
                    disturbed_phases_excluded=load_evidence(df, runs),
                    disturbed_load_cores=block.get("disturbed_load_cores"))
    why = all_disturbed(df, runs, block)
    if why and not missing:
        return not_measured("strong_efficiency_2", statement, why, **evidence)
    holds = {n: above(ivs[n], need) if n in ivs else e >= need for n, e in eff.items()}
    return every("strong_efficiency_2", statement, holds, missing, **evidence)
