"""Aggregate, plot and check the spatial scaling study (called by `python -m hpcdl.cli ... spatial`).

Per run the iteration time is the slowest rank's (the critical path) over the iterations after
warm-up, summarised by `spatial.timing_statistic` (default: mean of the fastest quarter, since
other processes on a shared machine only ever add time); components are the mean over ranks of
the same iterations. The oracle is fitted
on this study's own microbenchmarks (raw/calibration.csv) and predicts every run; the same
oracle on the configured machine extrapolates to CosmoFlow scale.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.claims import claim, every, not_measured
from hpcdl.layers import build_spec
from hpcdl.perfmodel.calibrate import fit_machine
from hpcdl.perfmodel.oracle import Machine, Strategy, extrapolate, predict
from hpcdl.results import mark_no_data, read_table, save_figure, write_table
from hpcdl.spatial.load import other_load_cores
from hpcdl.spatial.papers import paper_predictions
from hpcdl.spatial.runs import expand as expand_runs

COMPONENTS = ["compute_s", "halo_s", "gather_s", "allreduce_s", "io_s"]
COLORS = {"compute_s": "tab:blue", "halo_s": "tab:orange", "gather_s": "tab:purple",
          "allreduce_s": "tab:red", "io_s": "tab:green"}


def phase_loads(iters: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """One row per timed phase (a run's repeat): the cores processes outside the run took during it.

    From every record's /proc readings (hpcdl.spatial.load): rank 0's machine busy + stolen CPU
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


def _summaries(runs: pd.DataFrame, iters: pd.DataFrame, ranks: pd.DataFrame, warmup: int,
               statistic: str, threshold: float = float("inf")) -> pd.DataFrame:
    rows = []
    ok = runs[runs["status"] == "ok"]
    timed_all = iters[iters["iteration"] >= warmup]
    phases = phase_loads(timed_all if len(timed_all) else iters, threshold)
    for _, run in ok.drop_duplicates("run").iterrows():
        it = iters[(iters["run"] == run["run"]) & (iters["iteration"] >= warmup)]
        if it.empty:
            it = iters[iters["run"] == run["run"]]
        ph = phases[phases["run"] == run["run"]]
        clean = ph[~ph["disturbed"]]
        # leave disturbed phases out; where every phase was disturbed keep the least loaded one, flagged
        if len(clean):
            kept = clean
        else:
            kept = ph.nsmallest(1, "other_load_cores") if ph["other_load_cores"].notna().any() else ph
        it = it[it["repeat"].isin(kept["repeat"])]
        per_iter = it.groupby(["repeat", "iteration"])  # every iteration of every kept repeat
        crit = per_iter["total_s"].max()              # the slowest rank sets the iteration time
        comps = per_iter[COMPONENTS].mean()           # where the ranks spent it, on average
        if statistic == "median":
            total, parts = float(crit.median()), comps.median()
        else:
            keep = crit.sort_values().index[:1 if statistic == "min" else max(1, len(crit) // 4)]
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


CAL_ID = ["kind", "layer", "key", "batch", "fraction", "concurrent", "units", "size_bytes", "ranks", "gap_s"]


def calibration_rows(cal: pd.DataFrame, threshold: float) -> tuple[list[dict], dict]:
    """The microbenchmark rows the oracle is fitted on: per timing, the fastest round among the
    rounds whose section was undisturbed (other load <= threshold; every round where all were).
    Load from other processes only ever adds time, so the fastest clean round is the robust pick."""
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
        pick = (clean if len(clean) else g).sort_values("time_s").iloc[0]
        out.append(pick.to_dict())
    sections = cal.groupby(["round", "other_load_cores"], dropna=False).size().reset_index()
    evidence = {"rounds": int(cal["round"].nunique()),
                "sections_disturbed": int((sections["other_load_cores"] > threshold).sum()),
                "sections": len(sections),
                "max_other_load_cores": float(cal["other_load_cores"].max())}
    return out, evidence


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


def aggregate(cfg: dict, study_dir: Path) -> None:
    block = cfg["spatial"]
    raw, tables = Path(study_dir) / "raw", Path(study_dir) / "tables"
    started = pd.Timestamp.now().timestamp()
    runs, iters, ranks = (read_table(raw / f) for f in ("runs.csv", "iterations.csv", "ranks.csv"))
    cal = read_table(raw / "calibration.csv")
    rows, cal_evidence = calibration_rows(cal, block["disturbed_load_cores"])
    machine, consts = fit_machine(rows, cores=int(cal["cores"].iloc[0]),
                                  threads_per_rank=block["threads_per_rank"], overlap=block["overlap"])
    write_table(pd.DataFrame([{**consts, **{f"calibration_{k}": v for k, v in cal_evidence.items()}}]),
                tables / "calibration_fit.csv", cfg, started)
    measured = _summaries(runs, iters, ranks, block["warmup"], block["timing_statistic"],
                          block["disturbed_load_cores"])
    summary = _speedups(_oracle(measured, machine, block["model"]))
    write_table(summary, tables / "runs.csv", cfg, started)
    # the loss curve of the first repeat (repeats of a run train the same model on the same data)
    loss = iters[iters["repeat"] == 0].groupby(["run", "iteration"], as_index=False)["loss"].mean()
    write_table(loss, tables / "loss.csv", cfg, started)
    write_table(read_table(raw / "exactness.csv"), tables / "exactness.csv", cfg, started)
    ex = block["extrapolate"]
    spec = build_spec((ex["grid"],) * 3, {"channels": ex["channels"], "kernel": ex["kernel"],
                                          "dense": ex["dense"]}, in_channels=ex["in_channels"],
                      outputs=ex["outputs"])
    target = Machine.from_description(block["machine"])
    ext = pd.DataFrame(extrapolate(spec, ex["batch_size"], target, ex["gpus"]))
    write_table(ext, tables / "extrapolation.csv", cfg, started)
    # the oracle's pick per scale (none where no strategy fits in memory)
    picks = ext[ext["chosen"]].set_index("gpus")
    choice = pd.DataFrame({"gpus": ex["gpus"]})
    for col in ("strategy", "data", "depth", "height", "filter", "channel", "total_s", "samples_per_s",
                "memory_bytes"):
        choice[col] = choice["gpus"].map(picks[col]) if len(picks) else None
    choice["strategy"] = choice["strategy"].fillna("none fits in memory")
    write_table(choice, tables / "strategy_choice.csv", cfg, started)
    write_table(pd.DataFrame(paper_predictions(block)), tables / "paper_predictions.csv", cfg, started)


def _stacked(ax, df: pd.DataFrame, title: str) -> None:
    labels = [f"{int(r.data)}x{int(r.depth_ranks)}x{int(r.height_ranks)}\n({int(r.ranks)} ranks)"
              for r in df.itertuples()]
    x = np.arange(len(df))
    bottom = np.zeros(len(df))
    for c in COMPONENTS:
        label = c.removesuffix("_s").replace("gather", "gather to head")
        ax.bar(x, df[c], bottom=bottom, color=COLORS[c], label=label)
        bottom += df[c].to_numpy()
    ax.plot(x, df["time_per_iter_s"], "k_", markersize=30, mew=2, label="iteration (slowest rank)")
    ax.set_xticks(x, labels)
    ax.set_xlabel("layout: data groups x depth ranks x height ranks")
    ax.set_ylabel("time per iteration (s)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))


def plot(cfg: dict, study_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables, figs = Path(study_dir) / "tables", Path(study_dir) / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    df = read_table(tables / "runs.csv")
    block = cfg["spatial"]
    for kind, title in (("strong", f"Strong scaling ({block['strong']['grid']}^3 global input, "
                                    "spatial and hybrid)"),
                        ("weak", f"Weak scaling ({block['weak']['grid']}^3 per depth rank)")):
        kinds = [kind, "hybrid"] if kind == "strong" else [kind]
        sel = df[df["kind"].isin(kinds)].copy()
        sel["order"] = sel["kind"] != kind  # this kind's runs first, then the hybrids
        sel = sel.sort_values(["order", "ranks", "data"])
        fig, ax = plt.subplots(figsize=(10, 4.5))
        if sel.empty:
            mark_no_data(ax, f"no {kind} runs configured")
        else:
            _stacked(ax, sel, title)
        fig.tight_layout()
        save_figure(fig, figs / f"{kind}_scaling.png")

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    lim = [0.8 * min(df["time_per_iter_s"].min(), df["pred_time_per_iter_s"].min()),
           1.25 * max(df["time_per_iter_s"].max(), df["pred_time_per_iter_s"].max())]
    ax1.plot(lim, lim, "k-", lw=1, label="exact")
    tol = block["claims"]["max_oracle_error"]
    ax1.fill_between(lim, [v * (1 - tol) for v in lim], [v * (1 + tol) for v in lim], color="0.9",
                     label=f"±{tol:.0%}")
    for kind, g in df.groupby("kind"):
        ax1.scatter(g["time_per_iter_s"], g["pred_time_per_iter_s"], label=kind)
    ax1.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="measured time per iteration (s)",
            ylabel="predicted time per iteration (s)", title="Oracle: predicted vs measured")
    ax1.legend(fontsize=8)
    ax2.bar(df["run"], 100 * df["oracle_error"], color=["tab:red" if abs(e) > tol else "tab:blue"
                                                          for e in df["oracle_error"]])
    ax2.axhline(0, color="k", lw=1)
    ax2.set_ylabel("prediction error (%)")
    ax2.set_xlabel("run")
    ax2.set_title(f"Per-run error (mean |error| {100 * df['oracle_error'].abs().mean():.1f} %)")
    ax2.tick_params(axis="x", rotation=60, labelsize=7)
    fig.tight_layout()
    save_figure(fig, figs / "oracle_parity.png")

    ext = read_table(tables / "extrapolation.csv")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for fam, g in ext.groupby("family"):
        g = g.sort_values("gpus")
        ok = g[g["feasible"]]
        line, = ax.plot(ok["gpus"], ok["total_s"], "o-", label=fam)
        bad = g[~g["feasible"]]
        ax.plot(bad["gpus"], bad["total_s"], "x", color=line.get_color(), alpha=0.5)
    pick = ext[ext["chosen"]]
    ax.plot(pick["gpus"], pick["total_s"], "*", color="k", markersize=14, label="oracle's pick")
    ex = block["extrapolate"]
    ax.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="predicted time per iteration (s)",
           title=f"CosmoFlow {ex['grid']}^3, batch {ex['batch_size']}: best of each strategy "
                 f"(x = exceeds {block['machine']['memory_gb']} GB)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, figs / "extrapolation.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, g in df[df["kind"].isin(["strong", "weak"])].groupby("kind"):
        g = g.sort_values("ranks")
        line, = ax.plot(g["ranks"], g["peak_delta_mb_max"], "o-", label=f"{kind}: measured (peak RSS growth)")
        ax.plot(g["ranks"], g["pred_memory_mb"], "s--", color=line.get_color(), label=f"{kind}: oracle")
    ax.set(xlabel="ranks", ylabel="memory per rank (MiB)", title="Memory per rank vs ranks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, figs / "memory.png")

    _plot_efficiency(plt, df, block, figs)
    _plot_papers(plt, read_table(tables / "paper_predictions.csv"), figs)

    loss = read_table(tables / "loss.csv")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run, g in loss.groupby("run"):
        ax.plot(g["iteration"], g["loss"], lw=2.5 if run.startswith("train") else 1,
                alpha=1 if run.startswith("train") else 0.5, label=run)
    ax.set(xlabel="iteration", ylabel="training loss (MSE on normalised A, ns)", title="Training loss")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, figs / "loss.png")


def _plot_efficiency(plt, df: pd.DataFrame, block: dict, figs: Path) -> None:
    """Raw speedup next to the machine's own ceiling (same run), efficiency = their ratio."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sel = df[(df["kind"] == "strong") & (df["ranks"] > 1)] if "ceiling_speedup" in df else df[:0]
    sel = sel[sel["ceiling_speedup"].notna()]
    if sel.empty:
        mark_no_data(ax, "no multi-rank strong run with a ceiling run (spatial.ceiling)")
    else:
        x = np.arange(len(sel))
        ax.bar(x - 0.15, sel["speedup"], 0.3, label="speedup over 1 rank (spatial, communicating)")
        ax.bar(x + 0.15, sel["ceiling_speedup"], 0.3, color="0.6",
               label="ceiling: same per-rank compute, no communication")
        for i, r in enumerate(sel.itertuples()):
            load = getattr(r, "other_load_cores", float("nan"))
            ax.text(i, max(r.speedup, r.ceiling_speedup) * 1.03,
                    f"efficiency {r.efficiency_vs_ceiling:.2f}\n(other load {load:.2f} cores)",
                    ha="center", fontsize=9)
        ax.set_xlim(-0.8, len(sel) - 0.2)
        ax.set_ylim(0, max(2.2, 1.25 * float(sel[["speedup", "ceiling_speedup"]].max().max())))
        ax.axhline(1, color="k", lw=0.8)
        ax.set_xticks(x, [f"{int(r.depth_ranks)}x{int(r.height_ranks)} ({int(r.ranks)} ranks)"
                          for r in sel.itertuples()])
        need = block["claims"]["min_efficiency"]
        ax.set(xlabel="spatial layout (depth x height ranks)", ylabel="speedup over 1 rank",
               title=f"Strong scaling {block['strong']['grid']}^3 against the machine's own ceiling "
                     f"(goal efficiency >= {need:.2f})")
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    save_figure(fig, figs / "efficiency.png")


def _plot_papers(plt, pp: pd.DataFrame, figs: Path) -> None:
    """Predicted time per iteration and speedup at the papers' exact settings (model only)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for j, (net, g) in enumerate(pp.groupby("network")):
        g = g.sort_values("gpus")
        label = f"{net} {int(g['grid'].iloc[0])}^3, batch {int(g['batch_size'].iloc[0])}"
        line, = ax1.plot(g["gpus"], g["time_per_iter_s"], "o-", label=label)
        for r in g.itertuples():
            ax1.annotate(f"{r.data}x{r.depth}x{r.height}\npick: {r.chosen_family}",
                         (r.gpus, r.time_per_iter_s),
                         fontsize=7, textcoords="offset points", xytext=(4, 4 if j % 2 == 0 else -22))
        ax2.plot(g["gpus"], g["speedup_vs_first"], "o-", color=line.get_color(), label=f"{net}: predicted")
        ax2.plot(g["gpus"], g["ideal_speedup_vs_first"], ":", color=line.get_color(), label=f"{net}: ideal")
    ax1.set(xscale="log", yscale="log", xlabel="GPUs (ABCI V100, model)",
            ylabel="predicted time per iteration (s)",
            title="Papers' settings: data x depth x height, oracle's pick")
    ax2.set(xscale="log", xlabel="GPUs (ABCI V100, model)",
            ylabel="predicted speedup vs the smallest setting",
            title="Predicted strong scaling at the papers' settings (simulated)")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, figs / "paper_predictions.png")


CLAIMS = ("partitioned_exact", "strong_efficiency_2", "oracle_error", "loss_falls", "oracle_picks_spatial")


def _table(path: Path) -> pd.DataFrame:
    try:
        return read_table(path)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()


def _run_missing(raw: pd.DataFrame, run: str) -> str:
    """Why a configured run has no measurement: its recorded failure, or that it is absent."""
    if not {"run", "status"} <= set(raw):
        return f"run {run} has no measurement"
    rows = raw[(raw["run"] == run) & (raw["status"] == "failed")]
    if len(rows):
        err = [ln for ln in str(rows["error"].iloc[-1]).strip().splitlines() if ln.strip()]
        return f"run {run} failed: {(err or ['no error text'])[-1][:300]}"
    return f"run {run} has no measurement"


def claims(cfg: dict, study_dir: Path) -> list[dict]:
    tables = Path(study_dir) / "tables"
    block = cfg["spatial"]
    df = _table(tables / "runs.csv")
    raw = _table(Path(study_dir) / "raw" / "runs.csv")
    runs = [r for r in dict.fromkeys(p["run"] for p in expand_runs(block))]
    timed = {r: float(df.loc[df["run"] == r, "time_per_iter_s"].iloc[0]) for r in runs
             if "run" in df and (df["run"] == r).any()}
    oracle = _claim_oracle_error(block, df, raw, tables, [r for r in runs if not r.startswith("ceiling")])
    return [_claim_exact(block, _table(tables / "exactness.csv")),
            _claim_efficiency(block, df, raw, timed),
            oracle,
            _claim_loss(block, _table(tables / "loss.csv"), raw, runs),
            _claim_pick(block, _table(tables / "extrapolation.csv"), oracle)]


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


def _claim_efficiency(block: dict, df: pd.DataFrame, raw: pd.DataFrame, timed: dict) -> dict:
    need = block["claims"]["min_efficiency"]
    statement = (f"2-rank strong scaling on the {block['strong']['grid']}^3 input reaches >= {need:.0%} "
                 "of this machine's own ceiling: speedup over 1 rank / ceiling speedup, where the ceiling "
                 "is the same per-rank compute run as independent processes at once with no "
                 "communication, measured in the same run; one thread per rank, every 2-rank strong layout")
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
    speedup, ceiling, eff, missing = {}, {}, {}, {}
    for n in two:
        gone = [r for r in (n, ceil_of[n]) if r not in timed]
        if gone:
            missing[n] = "; ".join(_run_missing(raw, r) for r in gone)
            continue
        speedup[n] = timed[base[0]] / timed[n]
        ceiling[n] = timed[base[0]] / timed[ceil_of[n]]
        eff[n] = speedup[n] / ceiling[n]
    runs = [base[0], *two, *ceil_of.values()]
    evidence = dict(efficiency=eff, speedup=speedup, ceiling_speedup=ceiling,
                    time_per_iter_s={r: timed[r] for r in runs if r in timed}, threshold=need,
                    disturbed_phases_excluded=_load_evidence(df, runs),
                    disturbed_load_cores=block.get("disturbed_load_cores"))
    why = _all_disturbed(df, runs, block)
    if why and not missing:
        return not_measured("strong_efficiency_2", statement, why, **evidence)
    return every("strong_efficiency_2", statement, {n: e >= need for n, e in eff.items()}, missing,
                 efficiency=eff, speedup=speedup, ceiling_speedup=ceiling,
                 time_per_iter_s={r: timed[r] for r in runs if r in timed}, threshold=need,
                 disturbed_phases_excluded=_load_evidence(df, runs),
                 disturbed_load_cores=block.get("disturbed_load_cores"))


def _claim_oracle_error(block: dict, df: pd.DataFrame, raw: pd.DataFrame, tables: Path,
                        runs: list[str]) -> dict:
    bound = block["claims"]["max_oracle_error"]
    statement = (f"oracle (calibrated on this run's microbenchmarks) mean absolute error <= {bound:.0%} over "
                 "every configured training run (disturbed phases left out of measurement and calibration)")
    err = {r: float(df.loc[df["run"] == r, "oracle_error"].iloc[0]) for r in runs
           if "run" in df and (df["run"] == r).any()}
    err = {r: e for r, e in err.items() if np.isfinite(e)}
    missing = [_run_missing(raw, r) for r in runs if r not in err]
    if missing:
        return not_measured("oracle_error", statement, missing, per_run=err, threshold=bound)
    mae = float(np.mean(np.abs(list(err.values()))))
    why = _all_disturbed(df, runs, block)
    # Evidence only: where the error sits, in runs with a core per rank vs runs sharing cores.
    fit = _table(tables / "calibration_fit.csv")
    cores = int(fit["cores"].iloc[0]) if "cores" in fit and len(fit) else None
    split = {}
    if cores is not None:
        ranks = dict(zip(df["run"], df["ranks"], strict=True))
        for key, keep in (("ranks_within_cores", lambda r: ranks[r] <= cores),
                          ("more_ranks_than_cores", lambda r: ranks[r] > cores)):
            sel = [abs(e) for r, e in err.items() if keep(r)]
            split[f"mean_abs_error_{key}"] = float(np.mean(sel)) if sel else None
    cal = {k.removeprefix("calibration_"): fit[k].iloc[0].item() for k in fit
           if k.startswith("calibration_") and len(fit)}
    evidence = dict(mean_abs_error=mae, mean_accuracy=1 - mae, threshold=bound, cores=cores, **split,
                    per_run=err, disturbed_phases_excluded=_load_evidence(df, runs), calibration=cal,
                    disturbed_load_cores=block.get("disturbed_load_cores"))
    if why:
        return not_measured("oracle_error", statement, why, **evidence)
    return claim("oracle_error", statement, mae <= bound, **evidence)


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


def _claim_pick(block: dict, ext: pd.DataFrame, oracle: dict) -> dict:
    gpus = max(block["extrapolate"]["gpus"])
    statement = (f"at {gpus} GPUs the oracle picks a spatial (or data x spatial) strategy for CosmoFlow "
                 f"{block['extrapolate']['grid']}^3 on the target machine described in spatial.machine (a "
                 "model from the config, not measured here), and that oracle predicted this run's measured "
                 f"runs within {block['claims']['max_oracle_error']:.0%} (claim oracle_error)")
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
    data = top[top["family"] == "data"]
    chosen = ext[ext["chosen"].astype(str).str.lower() == "true"]
    return claim("oracle_picks_spatial", statement, "spatial" in picked and oracle["passed"], picked=picked,
                 data_parallel_fits=bool(data["feasible"].astype(str).str.lower().eq("true").any()),
                 oracle_mean_abs_error=oracle["measured"].get("mean_abs_error"),
                 threshold_oracle_error=block["claims"]["max_oracle_error"],
                 picks={int(g): str(s) for g, s in zip(chosen["gpus"], chosen["strategy"], strict=True)},
                 **evidence)
