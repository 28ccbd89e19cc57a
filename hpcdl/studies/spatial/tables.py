"""Tables stage of the spatial study: raw/ -> tables/*.csv (runs with the oracle's predictions,
loss, exactness, calibration fit, extrapolation, the oracle's picks, the papers' settings)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.common.layers import build_spec
from hpcdl.platform import StudyDir, read_table, write_table
from hpcdl.studies.spatial.load import other_load_cores
from hpcdl.studies.spatial.paper_scale.breakdown import BREAKDOWN_COLUMNS, breakdown, published_speedups
from hpcdl.studies.spatial.paper_scale.compute_check import CHECK_COLUMNS, compute_check
from hpcdl.studies.spatial.paper_scale.predictions import paper_predictions, sensitivity
from hpcdl.studies.spatial.perfmodel.fit import fit_machine
from hpcdl.studies.spatial.perfmodel.gpu_table import find as find_calibration
from hpcdl.studies.spatial.perfmodel.machine import Machine
from hpcdl.studies.spatial.perfmodel.oracle import Strategy, predict
from hpcdl.studies.spatial.perfmodel.strategies import extrapolate
from hpcdl.studies.spatial.sweep import held_out_shapes

COMPONENTS = ["compute_s", "halo_s", "gather_s", "allreduce_s", "io_s"]


def phase_loads(iters: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """One row per timed phase (a run's repeat): the cores processes outside the run took during it.

    From every record's /proc readings (hpcdl.studies.spatial.load): rank 0's machine busy + stolen CPU
    seconds minus every rank's own CPU seconds, over rank 0's summed iteration time. A phase above
    `threshold` cores is disturbed."""
    cols = {"machine_busy_s", "steal_s", "cpu_s"}
    rows = []
    for (run, rep), g in iters.groupby(["run", "repeat"]):
        r0 = g[g["rank"] == g["rank"].min()]
        load = (other_load_cores(r0["machine_busy_s"].sum(), r0["steal_s"].sum(), g["cpu_s"].sum(),
                                 r0["total_s"].sum()) if cols <= set(g) else float("nan"))
        rows.append({"run": run, "repeat": rep, "other_load_cores": load,
                     "steal_s": float(r0["steal_s"].sum()) if "steal_s" in g else float("nan"),
                     "disturbed": bool(load > threshold)})
    return pd.DataFrame(rows, columns=["run", "repeat", "other_load_cores", "steal_s", "disturbed"])


def _kept(iters: pd.DataFrame, phases: pd.DataFrame, run: str, warmup: int):
    """A run's timed iterations of the phases kept (disturbed ones left out; where every phase was
    disturbed, the least loaded one), its phases, the undisturbed ones and the kept ones."""
    it = iters[(iters["run"] == run) & (iters["iteration"] >= warmup)]
    if it.empty:
        it = iters[iters["run"] == run]
    ph = phases[phases["run"] == run]
    clean = ph[~ph["disturbed"]]
    if len(clean):
        kept = clean
    else:
        kept = ph.nsmallest(1, "other_load_cores") if ph["other_load_cores"].notna().any() else ph
    return it[it["repeat"].isin(kept["repeat"])], ph, clean, kept


def _keep(crit: pd.Series, statistic: str) -> pd.Index:
    """The iterations `spatial.timing_statistic` averages: the fastest, or the fastest quarter."""
    return crit.sort_values().index[:1 if statistic == "min" else max(1, len(crit) // 4)]


def _phases(iters: pd.DataFrame, warmup: int, threshold: float) -> pd.DataFrame:
    timed_all = iters[iters["iteration"] >= warmup]
    return phase_loads(timed_all if len(timed_all) else iters, threshold)


def _summaries(runs: pd.DataFrame, iters: pd.DataFrame, ranks: pd.DataFrame, warmup: int,
               statistic: str, threshold: float = float("inf")) -> pd.DataFrame:
    """One row per ok run. Its iteration time is the slowest rank's (the critical path) over the
    iterations after warm-up, summarised by `spatial.timing_statistic` (default: mean of the fastest
    quarter, since other processes on a shared machine only ever add time); components are the mean
    over ranks of the same iterations."""
    rows = []
    ok = runs[runs["status"] == "ok"]
    phases = _phases(iters, warmup, threshold)
    for _, run in ok.drop_duplicates("run").iterrows():
        it, ph, clean, kept = _kept(iters, phases, run["run"], warmup)
        per_iter = it.groupby(["repeat", "iteration"])  # every iteration of every kept repeat
        crit = per_iter["total_s"].max()              # the slowest rank sets the iteration time
        comps = per_iter[COMPONENTS].mean()           # where the ranks spent it, on average
        if statistic == "median":
            total, parts = float(crit.median()), comps.median()
        else:
            keep = _keep(crit, statistic)
            total, parts = float(crit[keep].mean()), comps.loc[keep].mean()
        row = {**run.drop(["repeat", "launch_wall_s"], errors="ignore").to_dict(),
               "repeats": int((ok["run"] == run["run"]).sum()),
               "iterations_timed": per_iter.ngroups, "time_per_iter_s": total,
               "time_per_iter_median_s": float(crit.median()), **{c: float(parts[c]) for c in COMPONENTS},
               "phases": len(ph), "phases_disturbed": int(ph["disturbed"].sum()),
               "other_load_cores": float(kept["other_load_cores"].mean()) if len(kept) else float("nan"),
               "other_load_cores_max": float(ph["other_load_cores"].max()) if len(ph) else float("nan"),
               "disturbed": bool(len(ph) and clean.empty)}
        row["samples_per_s"] = run["batch_size"] / row["time_per_iter_s"]
        rk = ranks[ranks["run"] == run["run"]]
        row["peak_delta_mb_max"] = float(rk["peak_delta_mb"].max())
        row["peak_rss_mb_max"] = float(rk["peak_rss_mb"].max())
        rows.append(row)
    return pd.DataFrame(rows)


def repeat_times(runs: pd.DataFrame, iters: pd.DataFrame, warmup: int, statistic: str,
                 threshold: float = float("inf")) -> pd.DataFrame:
    """One row per ok run and kept repeat: the repeat's own iteration time (the same statistic as
    `_summaries` over that repeat's iterations), the run-to-run spread the oracle claim's intervals use."""
    rows = []
    phases = _phases(iters, warmup, threshold)
    for name in runs.loc[runs["status"] == "ok", "run"].drop_duplicates():
        it, _, _, kept = _kept(iters, phases, name, warmup)
        loads = dict(zip(kept["repeat"], kept["other_load_cores"], strict=True))
        for rep, g in it.groupby("repeat"):
            crit = g.groupby("iteration")["total_s"].max()
            total = crit.median() if statistic == "median" else crit[_keep(crit, statistic)].mean()
            rows.append({"run": name, "repeat": int(rep), "time_per_iter_s": float(total),
                         "iterations_timed": len(crit), "other_load_cores": float(loads.get(rep, np.nan))})
    return pd.DataFrame(rows, columns=["run", "repeat", "time_per_iter_s", "iterations_timed",
                                       "other_load_cores"])


CAL_ID = ["kind", "layer", "key", "batch", "fraction", "concurrent", "units", "size_bytes", "ranks", "gap_s"]


def calibration_rows(cal: pd.DataFrame, threshold: float, statistic: str = "mean") -> tuple[list[dict], dict]:
    """The microbenchmark rows the oracle is fitted on: per timing, over the rounds whose section was
    undisturbed (other load <= threshold; every round where all were), their mean time or, with
    `statistic` "fastest", the fastest round's (spatial.calibration.round_statistic). A disturbed
    round is left out either way; among clean rounds the fastest is the luckiest draw, and fits of
    it priced every held-out run of three laptop runs 1-18 % under its measured time (#40)."""
    if statistic not in ("mean", "fastest"):
        raise ValueError(f"spatial.calibration.round_statistic must be mean or fastest, got {statistic!r}")
    cal = cal.copy()
    if "round" not in cal:
        cal["round"] = 0
    timed = {"other_cpu_s", "section_s"} <= set(cal)
    cal["other_load_cores"] = cal["other_cpu_s"] / cal["section_s"] if timed else float("nan")
    cal["disturbed"] = cal["other_load_cores"] > threshold
    ids = [c for c in CAL_ID if c in cal]
    keyed = cal[ids].astype(object).where(cal[ids].notna(), "").astype(str).agg("|".join, axis=1)
    out = []
    for _, g in cal.groupby(keyed, sort=False):
        clean = g[~g["disturbed"]]
        use = (clean if len(clean) else g).sort_values("time_s")
        pick = use.iloc[0].to_dict()
        if statistic == "mean":
            pick["time_s"] = float(use["time_s"].mean())
        out.append(pick)
    sections = cal.groupby(["round", "other_load_cores"], dropna=False).size().reset_index()
    evidence = {"rounds": int(cal["round"].nunique()),
                "sections_disturbed": int((sections["other_load_cores"] > threshold).sum()),
                "sections": len(sections),
                "max_other_load_cores": float(cal["other_load_cores"].max())}
    return out, evidence


def fit_rows(cal: pd.DataFrame, block: dict) -> tuple[list[dict], dict]:
    """calibration_rows less every timing of a held-out layer shape (sweep.held_out_shapes): none
    reaches the fit, not even the family fit or kind's line a shape without its own fit falls back
    to, whatever the calibration measured (a raw table from before the shapes were held out included)."""
    held = held_out_shapes(block)
    dropped = cal["key"].isin(held) if "key" in cal else pd.Series(False, index=cal.index)
    rows, evidence = calibration_rows(cal[~dropped], block["disturbed_load_cores"],
                                      block["calibration"]["round_statistic"])
    evidence.update(held_out_shapes=";".join(sorted(held)), rows_held_out=int(dropped.sum()))
    return rows, evidence


def _fit(rows: list[dict], cal: pd.DataFrame, block: dict):
    return fit_machine(rows, cores=int(cal["cores"].iloc[0]), threads_per_rank=block["threads_per_rank"],
                       overlap=block["overlap"], families=block["shape_fallback"] == "family",
                       proportional=block["below_timed"] == "proportional")


def _round_predictions(cal: pd.DataFrame, block: dict, measured: pd.DataFrame) -> dict[int, pd.Series]:
    """Each calibration round's own oracle (fitted on that round alone): round -> its predicted time
    per iteration of every run. A round too sparse to fit is left out (its repeats keep the oracle
    of all rounds)."""
    out = {}
    for rnd, sub in (cal.groupby("round") if "round" in cal else []):
        try:
            machine, _ = _fit(fit_rows(sub, block)[0], cal, block)
        except ValueError:
            continue
        pred = _oracle(measured, machine, block["model"]).set_index("run")
        out[int(rnd)] = pred.get("pred_time_per_iter_s", pd.Series(dtype=float)).dropna()
    return out


def oracle_repeats(reps: pd.DataFrame, summary: pd.DataFrame,
                   per_round: dict[int, pd.Series]) -> pd.DataFrame:
    """The oracle's error on each kept repeat of each training run, the spread its claim's intervals use.
    Repeat r is predicted by the oracle of calibration round r, the round run just before it
    (tasks/spatial.py), so the interval carries the calibration's round-to-round spread as well as the
    measurement's; a repeat without its own round keeps the oracle of all rounds (`pred_round` -1).
    `pred_time_per_iter_s` is the prediction the error is against, `pred_all_rounds_s` the runs table's."""
    pred = summary[summary["oracle_sample"] != ""][["run", "pred_time_per_iter_s", "oracle_sample"]]
    pred = pred.rename(columns={"pred_time_per_iter_s": "pred_all_rounds_s"})
    out = reps.merge(pred, on="run", how="inner")
    own = pd.Series([per_round.get(int(k), {}).get(r, np.nan) for r, k in zip(out["run"], out["repeat"],
                                                                               strict=True)],
                    index=out.index, dtype=float)
    out["pred_round"] = out["repeat"].astype(int).where(own.notna(), -1)
    out["pred_time_per_iter_s"] = own.fillna(out["pred_all_rounds_s"])
    out["oracle_error"] = (out["pred_time_per_iter_s"] - out["time_per_iter_s"]) / out["time_per_iter_s"]
    return out


def _oracle(df: pd.DataFrame, machine: Machine, model: dict) -> pd.DataFrame:
    preds = []
    for _, r in df.iterrows():
        if r["kind"] == "ceiling":  # not a training run: no prediction, not in the oracle's claim
            preds.append({})
            continue
        spec = build_spec((int(r["depth"]), int(r["height"]), int(r["width"])), model)
        p = predict(spec, int(r["batch_size"]), Strategy(int(r["data"]), int(r["depth_ranks"]),
                                                         int(r["height_ranks"])), machine)
        preds.append({"pred_time_per_iter_s": p["total_s"],
                      "pred_compute_s": p["compute_s"] + p["optimizer_s"],
                      "pred_halo_s": p["halo_s"], "pred_gather_s": p["gather_s"],
                      "pred_allreduce_s": p["allreduce_s"], "pred_io_s": p["io_s"],
                      "pred_memory_mb": p["memory_bytes"] / 2 ** 20})
    out = pd.concat([df.reset_index(drop=True), pd.DataFrame(preds)], axis=1)
    out["oracle_error"] = (out["pred_time_per_iter_s"] - out["time_per_iter_s"]) / out["time_per_iter_s"]
    out["oracle_accuracy"] = 1 - out["oracle_error"].abs()
    return out


def _speedups(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["speedup"] = np.nan
    df["efficiency"] = np.nan
    df["ceiling_speedup"] = np.nan
    df["efficiency_vs_ceiling"] = np.nan
    for kind in ("strong", "weak", "hybrid"):
        base = df[(df["kind"].isin(["strong"] if kind == "hybrid" else [kind])) & (df["ranks"] == 1)]
        if base.empty:
            continue
        t1 = float(base["time_per_iter_s"].iloc[0])
        sel = df["kind"] == kind
        df.loc[sel, "speedup"] = t1 / df.loc[sel, "time_per_iter_s"]
        if kind == "weak":
            df.loc[sel, "efficiency"] = df.loc[sel, "speedup"]
        else:
            df.loc[sel, "efficiency"] = df.loc[sel, "speedup"] / df.loc[sel, "ranks"]
    # the machine's own ceiling: 1 rank vs the same per-rank compute run at once with no communication
    base = df[(df["kind"] == "strong") & (df["ranks"] == 1)]
    if len(base):
        t1 = float(base["time_per_iter_s"].iloc[0])
        for i, r in df[df["kind"] == "ceiling"].iterrows():
            ceil = t1 / r["time_per_iter_s"]
            df.loc[i, "ceiling_speedup"] = ceil
            twin = (df["kind"] == "strong") & (df["run"] == r["run"].replace("ceiling", "strong"))
            df.loc[twin, "ceiling_speedup"] = ceil
            df.loc[twin, "efficiency_vs_ceiling"] = df.loc[twin, "speedup"] / ceil
    return df


def extrapolation(block: dict) -> pd.DataFrame:
    """The oracle on the configured machine (spatial.machine) at CosmoFlow scale (spatial.extrapolate): every
    strategy family at every GPU count, each family's fastest split or why none can run, and the pick."""
    ex = block["extrapolate"]
    spec = build_spec((ex["grid"],) * 3, {"channels": ex["channels"], "kernel": ex["kernel"],
                                          "dense": ex["dense"]}, in_channels=ex["in_channels"],
                      outputs=ex["outputs"])
    target = Machine.from_description(block["machine"])
    return pd.DataFrame(extrapolate(spec, ex["batch_size"], target, ex["gpus"]))


def write(cfg: dict, study_dir: Path) -> None:
    """The oracle is fitted on this study's own microbenchmarks (raw/calibration.csv) and predicts
    every run; the same oracle on the configured machine extrapolates to CosmoFlow scale."""
    block = cfg["spatial"]
    study = StudyDir(study_dir)
    started = pd.Timestamp.now().timestamp()
    runs, iters, ranks = (read_table(study.raw_table(t)) for t in ("runs", "iterations", "ranks"))
    cal = read_table(study.raw_table("calibration"))
    rows, cal_evidence = fit_rows(cal, block)
    machine, consts = _fit(rows, cal, block)
    write_table(pd.DataFrame([{**consts, **{f"calibration_{k}": v for k, v in cal_evidence.items()}}]),
                study.table("calibration_fit"), cfg, started)
    measured = _summaries(runs, iters, ranks, block["warmup"], block["timing_statistic"],
                          block["disturbed_load_cores"])
    summary = _speedups(_oracle(measured, machine, block["model"]))
    # which runs judge the oracle (spatial.held_out) and which only show its in-sample error
    held_runs = set(block["held_out"])
    summary["oracle_sample"] = [("" if k == "ceiling" else "held_out" if r in held_runs else "in_sample")
                                for r, k in zip(summary["run"], summary["kind"], strict=True)]
    write_table(summary, study.table("runs"), cfg, started)
    # every run's own time on each kept repeat (the ceiling's included): the run-to-run spread the
    # efficiency claim's interval pairs by repeat
    reps = repeat_times(runs, iters, block["warmup"], block["timing_statistic"],
                        block["disturbed_load_cores"])
    write_table(reps, study.table("repeat_times"), cfg, started)
    write_table(oracle_repeats(reps, summary, _round_predictions(cal, block, measured)),
                study.table("oracle_repeats"), cfg, started)
    # the loss curve of the first repeat (repeats of a run train the same model on the same data)
    loss = iters[iters["repeat"] == 0].groupby(["run", "iteration"], as_index=False)["loss"].mean()
    write_table(loss, study.table("loss"), cfg, started)
    write_table(read_table(study.raw_table("exactness")), study.table("exactness"), cfg, started)
    ex = block["extrapolate"]
    ext = extrapolation(block)
    write_table(ext, study.table("extrapolation"), cfg, started)
    # the oracle's pick per scale (none where no strategy fits in memory)
    picks = ext[ext["chosen"]].set_index("gpus")
    choice = pd.DataFrame({"gpus": ex["gpus"]})
    for col in ("strategy", "data", "depth", "height", "filter", "channel", "total_s", "samples_per_s",
                "memory_bytes"):
        choice[col] = choice["gpus"].map(picks[col]) if len(picks) else None
    choice["strategy"] = choice["strategy"].fillna("none fits in memory")
    write_table(choice, study.table("strategy_choice"), cfg, started)
    cal = gpu_calibration(cfg, study_dir)
    every = paper_predictions(block, cal, every_basis=True)  # the headline basis first
    head = [r for r in every if r["compute_basis"] == every[0]["compute_basis"]] if every else []
    write_table(pd.DataFrame(head), study.table("paper_predictions"), cfg, started)
    write_table(pd.DataFrame(every), study.table("paper_bases"), cfg, started)
    write_table(pd.DataFrame(sensitivity(block, cal)), study.table("paper_sensitivity"), cfg, started)
    # the published speedups, only to set beside the predictions (nothing is fitted to them)
    published = published_speedups(papers_file(cfg))
    write_table(pd.DataFrame(breakdown(block, cal, published, every), columns=BREAKDOWN_COLUMNS),
                study.table("paper_breakdown"), cfg, started)
    check = pd.DataFrame(compute_check(cal, block["gpu_calibration"]["fixed_cost"]), columns=CHECK_COLUMNS)
    write_table(check, study.table("compute_check"), cfg, started)


def papers_file(cfg: dict) -> Path:
    """The papers' published results (<data.resources_dir>/papers.yaml), which paper_breakdown sets beside
    the predictions."""
    return Path(cfg["data"]["resources_dir"]) / "papers.yaml"


def gpu_calibration(cfg: dict, study_dir: Path):
    """The GPU calibration the paper predictions use (spatial.gpu_calibration.use): with `auto`, this run's
    own (raw/gpu_calibration/, made where the study ran on a GPU), else the committed one in
    <data.resources_dir>/calibration/, else None (the assumed efficiency)."""
    use = cfg["spatial"]["gpu_calibration"]["use"]
    own = StudyDir(study_dir).raw / "gpu_calibration"
    if use == "auto" and list(own.glob("*.csv")):
        return find_calibration(own, use)
    return find_calibration(Path(cfg["data"]["resources_dir"]) / "calibration", use)

