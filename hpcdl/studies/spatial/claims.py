"""Claims stage of the spatial study: tables/ (+ raw/runs.csv for why a run is missing) ->
the six claims (exactness, 2-rank efficiency against the ceiling, the oracle's error on each held-out
run, loss, the oracle's pick among every strategy family, the oracle's compute term on a GPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import (
    CONFIDENCE,
    StudyDir,
    above,
    all_of,
    below,
    claim,
    confirmed_on,
    deterministic,
    every,
    failed_because,
    mean_interval,
    measured_afresh,
    not_measured,
    read_or_empty,
    read_tables,
    unseeded,
)
from hpcdl.studies.spatial.sweep import expand as expand_runs

CLAIMS = ("partitioned_exact", "strong_efficiency_2", "oracle_error", "loss_falls", "oracle_picks_spatial",
          "compute_term")
# judged per held-out run on the interval of its per-repeat errors (tables/oracle_repeats.csv); the
# efficiency per 2-rank layout on the interval of its per-repeat efficiencies (tables/repeat_times.csv)
INTERVAL_CLAIMS = ("strong_efficiency_2", "oracle_error", "oracle_picks_spatial")
CONFIRMATION = {
    "partitioned_exact": deterministic("the partitioned model equals the whole one in float64 on every "
                                       "configured layout, whatever the seed"),
    "strong_efficiency_2": unseeded("iteration times of this run's strong and ceiling runs, measured afresh: "
                                    "the seed draws the fields, not the timings"),
    "oracle_error": unseeded("this run's iteration and microbenchmark times, measured afresh: the seed draws "
                             "the fields, not the timings"),
    "loss_falls": confirmed_on("seed"),
    "oracle_picks_spatial": unseeded("the pick is the oracle's arithmetic on the configured machine; its "
                                     "trust rests on this run's timings (oracle_error)"),
    # the claim replaces this with its calibration's own source where it can tell (calibration_source)
    "compute_term": unseeded("GPU times of a calibration: this run's own, measured afresh, or a committed "
                             "resources/calibration/<gpu>.csv, not measured in this run"),
}


def _run_missing(raw: pd.DataFrame, run: str) -> str:
    """Why a configured run has no measurement: its recorded failure, or that it is absent."""
    if not {"run", "status"} <= set(raw):
        return f"run {run} has no measurement"
    rows = raw[(raw["run"] == run) & (raw["status"] == "failed")]
    if len(rows):
        return failed_because(f"run {run}", rows["error"].iloc[-1])
    return f"run {run} has no measurement"


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    block = cfg["spatial"]
    df, exact, loss, ext, check, repeats, fit, rep_times = read_tables(
        study_dir, "runs", "exactness", "loss", "extrapolation", "compute_check", "oracle_repeats",
        "calibration_fit", "repeat_times")
    raw = read_or_empty(StudyDir(study_dir).raw_table("runs"))
    runs = [r for r in dict.fromkeys(p["run"] for p in expand_runs(block))]
    timed = {r: float(df.loc[df["run"] == r, "time_per_iter_s"].iloc[0]) for r in runs
             if "run" in df and (df["run"] == r).any()}
    gpus = one_gpu_rule(study_dir, df)
    oracle, oracle_holds = _claim_oracle_error(block, df, raw, repeats, fit,
                                               [r for r in runs if not r.startswith("ceiling")], gpus)
    return [_claim_exact(block, exact),
            _claim_efficiency(block, df, raw, timed, rep_times, gpus),
            oracle,
            _claim_loss(block, loss, raw, runs),
            _claim_pick(block, ext, oracle, oracle_holds),
            claim_compute_term(block, check, calibration_source(cfg, study_dir, check))]


def one_gpu_rule(study_dir: Path, df: pd.DataFrame) -> dict[str, str]:
    """Run -> why it is not measured where the run had fewer GPUs than the run's ranks (ranks sharing a GPU
    over gloo, spatial.gpu_sharing): its timings are the shared GPU's and the host's, not that many GPUs',
    so a claim that needs them reads not measured. Empty off CUDA (ranks on CPU cores are what they time)."""
    dev = StudyDir(study_dir).device()
    if dev.get("device") != "cuda" or not {"run", "ranks"} <= set(df):
        return {}
    have = int(dev.get("gpu_count") or 1)
    gpu = dev.get("gpu_model") or "GPU"
    return {str(r.run): (f"needs {int(r.ranks)} GPUs: this run had {have} ({gpu}), its {int(r.ranks)} ranks "
                         "shared it over gloo (timings labelled shared GPU), which times the host staging, "
                         f"not {int(r.ranks)} GPUs") for r in df.itertuples() if int(r.ranks) > have}


def _short(commit: str) -> str:
    sha, dirty = str(commit).removesuffix("-dirty"), str(commit).endswith("-dirty")
    return sha[:7] + ("-dirty" if dirty else "")


def calibration_source(cfg: dict, study_dir: Path, check: pd.DataFrame) -> dict | None:
    """Where the compute check's calibration came from, found as the tables stage found it
    (tables.gpu_calibration): {"confirmation": entry, "calibration": evidence}, the committed file named
    with its GPU, dates and commits (its provenance sidecar) or this run's own; None where the config
    names none (no data.resources_dir) or the file's GPU is not the check's."""
    from hpcdl.studies.spatial.tables import gpu_calibration

    if check.empty or "gpu" not in check or "resources_dir" not in cfg.get("data", {}):
        return None
    cal = gpu_calibration(cfg, study_dir)
    if cal is None or cal.path is None or cal.gpu_model != str(check["gpu"].iloc[0]):
        return None
    if cal.path.parent == StudyDir(study_dir).raw / "gpu_calibration":
        own = measured_afresh(f"GPU times of this run's own calibration raw/gpu_calibration/{cal.path.name}")
        return {"confirmation": own.resolve({}, "compute_term"),
                "calibration": {"file": str(cal.path), "this_run": True}}
    sessions = cal.meta.get("sessions") or [cal.meta]
    dates = list(dict.fromkeys(str(x.get("date", "?"))[:10] for x in sessions))
    commits = list(dict.fromkeys(_short(x.get("git_commit", "?")) for x in sessions))
    partial = f"; partial: {cal.measured_items} of {cal.total_items} items" if cal.partial else ""
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    text = (f"read from the committed calibration {cal.path} ({cal.gpu_model}, {when}, commit "
            f"{', '.join(commits)}{partial}), not measured in this run")
    return {"confirmation": unseeded(text).resolve({}, "compute_term"),
            "calibration": {"file": str(cal.path), "this_run": False, "gpu": cal.gpu_model, "dates": dates,
                            "commits": commits, "partial": cal.partial}}


def claim_compute_term(block: dict, check: pd.DataFrame, source: dict | None = None) -> dict:
    """The oracle's compute sum against a whole one-GPU step measured in the same calibration run: a check of
    the model on the GPU it was calibrated on (not of the paper predictions' mapping or communication), at
    the in-sample slabs (spatial.gpu_calibration.steps, at its tolerance) and the held-out ones
    (held_out_steps: layer shapes the calibration left out, at spatial.claims.max_oracle_error): what one
    GPU can judge of the oracle. `source` (calibration_source): the calibration's file, named in the
    evidence and the confirmation."""
    tol = block["gpu_calibration"]["tolerance"]
    bound = block.get("claims", {}).get("max_oracle_error", tol)
    statement = (f"on the calibrated GPU, the oracle's compute term (sum of the per-layer forward + backward "
                 f"times and the optimizer step of the calibration table, each layer's fixed cost as "
                 f"spatial.gpu_calibration.fixed_cost says) is within {tol:.0%} of a measured whole one-GPU "
                 "training step at the same slab, at every checked slab (spatial.gpu_calibration.steps), and "
                 f"within {bound:.0%} at every held-out slab, whose layer shapes the calibration left out "
                 "(held_out_steps; measured in one calibration run)")
    if check.empty or "error" not in check:
        return not_measured("compute_term", statement, "no GPU calibration with whole-step rows: run "
                            "`python -m hpcdl spatial calibrate --device cuda` on a GPU and commit its "
                            "resources/calibration/<gpu>.csv", tolerance=tol)
    held = (check["sample"].astype(str) == "held_out") if "sample" in check else pd.Series(False, check.index)
    name = {i: ("held out " if held[i] else "") + f"{r.network} {int(r.depth)}x{int(r.height)}"
            for i, r in zip(check.index, check.itertuples(), strict=True)}
    per = {name[i]: float(check.at[i, "error"]) for i in check.index}
    line = {name[i]: bound if held[i] else tol for i in check.index}
    gpu = str(check["gpu"].iloc[0])
    extra = {k: {name[i]: (float(check.at[i, k]) if k != "fixed_cost" else str(check.at[i, k]))
                 for i in check.index}
             for k in ("error_items", "fixed_cost", "interpolated_items") if k in check}
    c = every("compute_term", statement, {k: abs(e) <= line[k] for k, e in per.items()}, {}, error=per,
              measured_step_s={name[i]: float(check.at[i, "measured_step_s"]) for i in check.index},
              oracle_compute_s={name[i]: float(check.at[i, "oracle_compute_s"]) for i in check.index},
              tolerance=tol, held_out_bound=bound, gpu=gpu, **extra,
              **({"calibration": source["calibration"]} if source else {}))
    # the verdict is confirmed by whichever calibration it read: a committed one is not measured afresh
    return {**c, "confirmation": source["confirmation"]} if source else c


def _claim_exact(block: dict, ex: pd.DataFrame) -> dict:
    tol = block["exactness"]["tolerance"]
    statement = (f"float64 partitioned model equals the whole model within {tol:g} relative (loss, input and "
                 "parameter gradients), on every configured exactness layout")
    cols = ["err_loss", "err_grad_input", "err_grad_params"]
    holds, missing, worst = {}, {}, {}
    for lay in block["exactness"]["layouts"]:
        name = "x".join(map(str, lay))
        rows = ex[ex["layout"].astype(str) == name] if "layout" in ex else ex[:0]
        if rows.empty or rows[cols].isna().any(axis=None):
            missing[name] = "no exactness result for this layout"
            continue
        worst[name] = float(rows[cols].max().max())
        holds[name] = worst[name] <= tol
    return every("partitioned_exact", statement, holds, missing, max_relative_error=worst, tolerance=tol)


def _load_evidence(df: pd.DataFrame, runs: list[str]) -> dict:
    """Per run: phases left out as disturbed by other load, and the other load (cores) it was timed under."""
    out = {}
    for r in runs:
        row = df[df["run"] == r] if "run" in df else df[:0]
        if len(row) and "phases_disturbed" in row:
            out[r] = {"phases_disturbed": int(row["phases_disturbed"].iloc[0]),
                      "phases": int(row["phases"].iloc[0]),
                      "other_load_cores": float(row["other_load_cores"].iloc[0]),
                      "all_phases_disturbed": bool(row["disturbed"].iloc[0])}
    return out


def _all_disturbed(df: pd.DataFrame, runs: list[str], block: dict) -> str | None:
    """Why a timing claim is not judged: runs every one of whose phases other load disturbed."""
    if "disturbed" not in df:
        return None
    bad = df[df["run"].isin(runs) & df["disturbed"].astype(str).str.lower().eq("true")]
    if bad.empty:
        return None
    loads = ", ".join(f"{r.run} {r.other_load_cores:.2f}" for r in bad.itertuples())
    return (f"every timed phase of {len(bad)} run(s) was disturbed by other load above "
            f"{block.get('disturbed_load_cores')} cores (least-loaded phase, cores: {loads}); "
            "rerun on a quieter machine")


def _repeat_efficiencies(rep_times: pd.DataFrame, run: str, ceiling: str) -> pd.Series:
    """Per repeat kept in both runs: the ceiling's iteration time over the 2-rank run's, which is the
    speedup over 1 rank divided by the ceiling's speedup (the 1-rank time cancels), paired by repeat:
    the two ran in the same round."""
    if not {"run", "repeat", "time_per_iter_s"} <= set(rep_times):
        return pd.Series(dtype=float)
    t = rep_times.pivot_table(index="repeat", columns="run", values="time_per_iter_s", aggfunc="first")
    if run not in t or ceiling not in t:
        return pd.Series(dtype=float)
    return (t[ceiling] / t[run]).dropna()


def _claim_efficiency(block: dict, df: pd.DataFrame, raw: pd.DataFrame, timed: dict,
                      rep_times: pd.DataFrame, gpus: dict | None = None) -> dict:
    need = block["claims"]["min_efficiency"]
    statement = (f"2-rank strong scaling on the {block['strong']['grid']}^3 input reaches >= {need:.0%} "
                 "of this machine's own ceiling: speedup over 1 rank / ceiling speedup, where the ceiling "
                 "is the same per-rank compute run as independent processes at once with no "
                 "communication, measured in the same run; one thread per rank, every 2-rank strong layout; "
                 f"judged on the {CONFIDENCE:.0%} interval of the per-repeat efficiencies (ceiling time / "
                 "2-rank time of the same round) where 2 or more repeats were kept (straddles where it "
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
        return not_measured("strong_efficiency_2", statement, _run_missing(raw, base[0]), threshold=need)
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
            missing[n] = "; ".join(_run_missing(raw, r) for r in gone)
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
                    disturbed_phases_excluded=_load_evidence(df, runs),
                    disturbed_load_cores=block.get("disturbed_load_cores"))
    why = _all_disturbed(df, runs, block)
    if why and not missing:
        return not_measured("strong_efficiency_2", statement, why, **evidence)
    holds = {n: above(ivs[n], need) if n in ivs else e >= need for n, e in eff.items()}
    return every("strong_efficiency_2", statement, holds, missing, **evidence)


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


def _claim_oracle_error(block: dict, df: pd.DataFrame, raw: pd.DataFrame, repeats: pd.DataFrame,
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
                 "missing": [_run_missing(raw, r) for r in inside if r not in err]}
    if not held:
        return not_measured("oracle_error", statement, "spatial.held_out names no configured training run: "
                            "nothing is predicted out of sample", threshold=bound, in_sample=in_sample), {}
    # on fewer GPUs than a held-out run's ranks, the run is not measured (one_gpu_rule); the others judge
    out = {r: err[r] for r in held if r in err and r not in (gpus or {})}
    missing = {r: (gpus or {}).get(r) or _run_missing(raw, r) for r in held if r not in out}
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
        cores=cores, **split, in_sample=in_sample, disturbed_phases_excluded=_load_evidence(df, runs),
        calibration=cal, disturbed_load_cores=block.get("disturbed_load_cores"))
    why = _all_disturbed(df, held, block)
    if why and not missing:
        return not_measured("oracle_error", statement, why, **evidence), holds
    c = every("oracle_error", statement, holds, missing, **evidence)
    return c, {r: c["measured"]["holds"][r] for r in holds}


def _claim_loss(block: dict, loss: pd.DataFrame, raw: pd.DataFrame, runs: list[str]) -> dict:
    drop = block["claims"]["loss_drop"]
    train = next(r for r in runs if r.startswith("train"))
    tr = (loss[loss["run"] == train].sort_values("iteration")["loss"].to_numpy() if "run" in loss
          else np.empty(0))
    n = max(1, min(10, len(tr) // 3))
    statement = f"training learns: mean loss of the last {n} iterations < {drop} x the first {n}"
    if len(tr) < 2 or not np.isfinite(tr).all():
        why = _run_missing(raw, train) if len(tr) == 0 else f"run {train} logged {len(tr)} finite losses"
        return not_measured("loss_falls", statement, why, threshold_ratio=drop)
    first, last = float(tr[:n].mean()), float(tr[-n:].mean())
    return claim("loss_falls", statement, last < drop * first, first_loss=first, last_loss=last,
                 threshold_ratio=drop, iterations=len(tr))


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


def _claim_pick(block: dict, ext: pd.DataFrame, oracle: dict, oracle_holds: dict) -> dict:
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
