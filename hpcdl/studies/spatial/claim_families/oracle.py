"""The oracle's claims: oracle_error (every held-out run predicted within the bound, each on its own, out
of sample) and oracle_picks_spatial (the oracle's pick among every strategy family at scale, trusted as
far as oracle_error)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hpcdl.platform import CONFIDENCE, above, all_of, below, every, mean_interval, not_measured
from hpcdl.studies.spatial.claim_families.runs import all_disturbed, load_evidence, run_missing


def _mean_abs(err: dict) -> float | None:
    return float(np.mean(np.abs(list(err.values())))) if err else None


def _per_run_intervals(reps: pd.DataFrame, runs: list[str]) -> dict:
    """Per run with at least 2 kept repeats (tables/oracle_repeats.csv): the interval of its per-repeat
    oracle errors, each keyed by its repeat and the calibration round that predicted it."""
    out = {}
    if not {"run", "repeat", "oracle_error"} <= set(reps):
        return out
    for r in runs:
        rows = reps[(reps["run"] == r) & np.isfinite(reps["oracle_error"].astype(float))]
        if len(rows) >= 2:
            keys = [f"repeat {int(k)}" for k in rows["repeat"]]
            if "pred_round" in rows:  # a table from before the per-round oracles has none
                keys = [k + (f" / round {int(c)}" if c >= 0 else " / all rounds")
                        for k, c in zip(keys, rows["pred_round"], strict=True)]
            out[r] = (mean_interval(rows["oracle_error"]), keys)
    return out


def claim_oracle_error(block: dict, df: pd.DataFrame, raw: pd.DataFrame, repeats: pd.DataFrame,
                       fit: pd.DataFrame, runs: list[str], gpus: dict | None = None) -> tuple[dict, dict]:
    """Judged out of sample and per run: each held-out run (spatial.held_out), whose layer shapes the
    calibration left out (tables.write), so the oracle predicts it rather than re-adding timings it was
    fitted on, must be within the bound on its own (a mean would hide a run that misses); where a run
    has kept repeats, on the interval of its per-repeat errors. The in-sample runs' error is evidence
    beside it, never the verdict. Also returns each held-out run's check (for oracle_picks_spatial)."""
    bound = block["claims"]["max_oracle_error"]
    held = [r for r in runs if r in set(block["held_out"])]
    inside = [r for r in runs if r not in held]
    statement = (f"oracle (calibrated on this run's microbenchmarks, which leave out every conv and "
                 f"pool layer shape of the held-out runs) predicts every held-out run "
                 f"({', '.join(held) or 'none'}) within {bound:.0%}, each run on its own: on the "
                 f"{CONFIDENCE:.0%} interval of its per-repeat errors where it has 2 or more kept repeats, "
                 "each repeat against the oracle of the calibration round run just before it where it has "
                 "one (straddles where that interval crosses the bound), else on its error; the mean and the "
                 "worst run are shown, the in-sample runs' error beside them (disturbed phases left out of "
                 "measurement and calibration)")
    err = {r: float(df.loc[df["run"] == r, "oracle_error"].iloc[0]) for r in runs
           if "run" in df and (df["run"] == r).any()}
    err = {r: e for r, e in err.items() if np.isfinite(e)}
    in_sample = {"mean_abs_error": _mean_abs({r: err[r] for r in inside if r in err}),
                 "per_run": {r: err[r] for r in inside if r in err},
                 "missing": [run_missing(raw, r) for r in inside if r not in err]}
    if not held:
        return not_measured("oracle_error", statement, "spatial.held_out names no configured training run: "
                            "nothing is predicted out of sample", threshold=bound, in_sample=in_sample), {}
    # on fewer GPUs than a held-out run's ranks, the run is not measured (one_gpu_rule); the others judge
    out = {r: err[r] for r in held if r in err and r not in (gpus or {})}
    missing = {r: (gpus or {}).get(r) or run_missing(raw, r) for r in held if r not in out}
    ivs = _per_run_intervals(repeats, list(out))
    holds = {r: all_of([above(ivs[r][0], -bound), below(ivs[r][0], bound)]) if r in ivs else abs(e) <= bound
             for r, e in out.items()}
    mae = _mean_abs(out)
    worst = max(out, key=lambda r: abs(out[r])) if out else None
    # Evidence only: where the error sits, in runs with a core per rank vs runs sharing cores.
    cores = int(fit["cores"].iloc[0]) if "cores" in fit and len(fit) else None
    split = {}
    if cores is not None and "ranks" in df:
        ranks = dict(zip(df["run"], df["ranks"], strict=True))
        for key, keep in (("ranks_within_cores", lambda r: ranks[r] <= cores),
                          ("more_ranks_than_cores", lambda r: ranks[r] > cores)):
            sel = [abs(e) for r, e in out.items() if keep(r)]
            split[f"mean_abs_error_{key}"] = float(np.mean(sel)) if sel else None
    cal = {k.removeprefix("calibration_"): getattr(v := fit[k].iloc[0], "item", lambda: v)() for k in fit
           if k.startswith("calibration_") and len(fit)}  # numbers, and the held-out shapes (a string)
    evidence = dict(
        worst_run=None if worst is None else {"run": worst, "error": out[worst],
                                              **({"interval": ivs[worst][0].evidence(keys=ivs[worst][1])}
                                                 if worst in ivs else {})},
        mean_abs_error=mae, mean_accuracy=None if mae is None else 1 - mae, threshold=bound, held_out=held,
        per_run=out, per_run_interval={r: iv.evidence(keys=keys) for r, (iv, keys) in ivs.items()},
        cores=cores, **split, in_sample=in_sample, disturbed_phases_excluded=load_evidence(df, runs),
        calibration=cal, disturbed_load_cores=block.get("disturbed_load_cores"))
    why = all_disturbed(df, held, block)
    if why and not missing:
        return not_measured("oracle_error", statement, why, **evidence), holds
    c = every("oracle_error", statement, holds, missing, **evidence)
    return c, {r: c["measured"]["holds"][r] for r in holds}


def _families(top: pd.DataFrame) -> dict[str, str]:
    """Each strategy family at the judged scale: its fastest fitting split and time, or why none can run."""
    out = {}
    for r in top.to_dict("records"):
        if str(r.get("feasible")).lower() == "true":
            split = "x".join(str(int(r.get(k, 1))) for k in ("data", "depth", "height"))
            split += "".join(f" {k[0]}{int(r[k])}" for k in ("filter", "channel") if int(r.get(k, 1)) > 1)
            out[str(r["family"])] = f"fits: {r['strategy']} {split}, {float(r['total_s']):.4g} s/iteration"
        else:
            why = r.get("infeasible_reason")
            out[str(r["family"])] = why if isinstance(why, str) and why else "infeasible"
    return out


def claim_pick(block: dict, ext: pd.DataFrame, oracle: dict, oracle_holds: dict) -> dict:
    ex = block["extrapolate"]
    gpus = max(ex["gpus"])
    statement = (f"at {gpus} GPUs the oracle picks a spatial (or data x spatial) strategy for CosmoFlow "
                 f"{ex['grid']}^3, mini-batch {ex['batch_size']}, over every strategy family it enumerates "
                 "(data, spatial, data x spatial, filter, channel; tables/extrapolation.csv gives each "
                 "family's fastest split or why none can run: memory, divisibility, mini-batch, channels) on "
                 "the target machine described in spatial.machine (a model from the config, not measured "
                 "here), and that oracle predicted every held-out run of this run within "
                 f"{block['claims']['max_oracle_error']:.0%} (claim oracle_error); not measured where no "
                 "family but a spatial one fits, as the pick is then forced")
    evidence = dict(target_machine=dict(block["machine"]),
                    basis="configured machine model (spatial.machine), trusted only as far as the oracle's "
                    "measured error on this run")
    if oracle["status"] == "not_measured":
        return not_measured("oracle_picks_spatial", statement, f"claim oracle_error is {oracle['reason']}",
                            **evidence)
    top = ext[ext["gpus"] == gpus] if "gpus" in ext else ext
    if top.empty:
        return not_measured("oracle_picks_spatial", statement, f"no extrapolation at {gpus} GPUs", **evidence)
    pick = top[top["chosen"].astype(str).str.lower() == "true"]
    picked = str(pick["strategy"].iloc[0]) if len(pick) else "none feasible"
    picked_family = str(pick["family"].iloc[0]) if len(pick) and "family" in pick else picked
    fits = top["feasible"].astype(str).str.lower().eq("true")
    rivals = sorted(str(f) for f, ok in zip(top["family"], fits, strict=True)
                    if ok and "spatial" not in str(f))
    chosen = ext[ext["chosen"].astype(str).str.lower() == "true"]
    evidence = dict(picked=picked, picked_family=picked_family, families_at_scale=_families(top),
                    feasible_rivals=rivals, contested=bool(rivals),
                    data_parallel_fits=bool(fits[top["family"] == "data"].any()),
                    oracle_mean_abs_error=oracle["measured"].get("mean_abs_error"),
                    oracle_worst_run=oracle["measured"].get("worst_run"),
                    threshold_oracle_error=block["claims"]["max_oracle_error"],
                    picks={int(g): str(s) for g, s in zip(chosen["gpus"], chosen["strategy"], strict=True)},
                    **evidence)
    if "spatial" in picked_family and not rivals:
        # only spatial families fit at this scale: the pick is forced, and the claim would only repeat
        # oracle_error, so it says so instead of passing on it
        spatial = sorted(str(f) for f, ok in zip(top["family"], fits, strict=True) if ok)
        others = sorted(str(f) for f in dict.fromkeys(top["family"]) if str(f) not in spatial)
        return not_measured(
            "oracle_picks_spatial", statement,
            f"uncontested: no other family is feasible at {gpus} GPUs and mini-batch {ex['batch_size']} "
            f"({', '.join(others) or 'none enumerated'} cannot run: families_at_scale says why; only "
            f"{', '.join(spatial)} fit), so the pick is forced and the claim would only repeat oracle_error",
            **evidence)
    holds = {f"pick at {gpus} GPUs is spatial": "spatial" in picked_family,
             **{f"oracle_error {r}": v for r, v in oracle_holds.items()}}
    return every("oracle_picks_spatial", statement, holds, {}, **evidence)
