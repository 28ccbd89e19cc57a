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

from hpcdl.io import claim, read_table, save_figure, write_table
from hpcdl.perfmodel.calibrate import fit_machine
from hpcdl.perfmodel.oracle import Machine, Strategy, extrapolate, predict
from hpcdl.spatial.arch import build_spec

COMPONENTS = ["compute_s", "halo_s", "gather_s", "allreduce_s", "io_s"]
COLORS = {"compute_s": "tab:blue", "halo_s": "tab:orange", "gather_s": "tab:purple",
          "allreduce_s": "tab:red", "io_s": "tab:green"}


def _summaries(runs: pd.DataFrame, iters: pd.DataFrame, ranks: pd.DataFrame, warmup: int,
               statistic: str) -> pd.DataFrame:
    rows = []
    ok = runs[runs["status"] == "ok"]
    for _, run in ok.drop_duplicates("run").iterrows():
        it = iters[(iters["run"] == run["run"]) & (iters["iteration"] >= warmup)]
        if it.empty:
            it = iters[iters["run"] == run["run"]]
        per_iter = it.groupby(["repeat", "iteration"])  # every iteration of every repeat
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
               "time_per_iter_median_s": float(crit.median()), **{c: float(parts[c]) for c in COMPONENTS}}
        row["samples_per_s"] = run["batch_size"] / row["time_per_iter_s"]
        rk = ranks[ranks["run"] == run["run"]]
        row["peak_delta_mb_max"] = float(rk["peak_delta_mb"].max())
        row["peak_rss_mb_max"] = float(rk["peak_rss_mb"].max())
        rows.append(row)
    return pd.DataFrame(rows)


def _oracle(df: pd.DataFrame, machine: Machine, model: dict) -> pd.DataFrame:
    preds = []
    for _, r in df.iterrows():
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
    return df


def aggregate(cfg: dict, study_dir: Path) -> None:
    block = cfg["spatial"]
    raw, tables = Path(study_dir) / "raw", Path(study_dir) / "tables"
    started = pd.Timestamp.now().timestamp()
    runs, iters, ranks = (read_table(raw / f) for f in ("runs.csv", "iterations.csv", "ranks.csv"))
    cal = read_table(raw / "calibration.csv")
    machine, consts = fit_machine(cal.to_dict("records"), cores=int(cal["cores"].iloc[0]),
                                  threads_per_rank=block["threads_per_rank"])
    write_table(pd.DataFrame([consts]), tables / "calibration_fit.csv", cfg, started)
    measured = _summaries(runs, iters, ranks, block["warmup"], block["timing_statistic"])
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
            ax.text(0.5, 0.5, f"no {kind} runs configured", ha="center", transform=ax.transAxes)
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

    loss = read_table(tables / "loss.csv")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run, g in loss.groupby("run"):
        ax.plot(g["iteration"], g["loss"], lw=2.5 if run.startswith("train") else 1,
                alpha=1 if run.startswith("train") else 0.5, label=run)
    ax.set(xlabel="iteration", ylabel="training loss (MSE on normalised A, ns)", title="Training loss")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, figs / "loss.png")


def claims(cfg: dict, study_dir: Path) -> list[dict]:
    tables = Path(study_dir) / "tables"
    block = cfg["spatial"]
    cl = block["claims"]
    out = []
    ex = read_table(tables / "exactness.csv")
    tol = block["exactness"]["tolerance"]
    cols = ["err_loss", "err_grad_input", "err_grad_params"]
    worst = float(ex[cols].max().max()) if len(ex) else float("nan")
    out.append(claim("partitioned_exact", f"float64 partitioned model equals the whole model within {tol:g} "
                     "relative (loss, input and parameter gradients)", bool(worst <= tol),
                     max_relative_error=worst, layouts=sorted(set(ex["layout"])) if len(ex) else []))
    df = read_table(tables / "runs.csv")
    two = df[(df["kind"] == "strong") & (df["ranks"] == 2)]
    sp = float(two["speedup"].iloc[0]) if len(two) else float("nan")
    out.append(claim("strong_speedup_2", f"2-rank strong-scaling speedup >= {cl['min_speedup']} over 1 rank "
                     f"on the {block['strong']['grid']}^3 input, one thread per rank",
                     bool(sp >= cl["min_speedup"]),
                     speedup=sp, speedups={r: float(s) for r, s in zip(df["run"], df["speedup"], strict=True)
                                           if not np.isnan(s)}))
    mae = float(df["oracle_error"].abs().mean())
    # Evidence only: where the error sits, in runs with a core per rank vs runs sharing cores.
    cores = int(read_table(tables / "calibration_fit.csv")["cores"].iloc[0])
    fits = df["ranks"] <= cores
    out.append(claim("oracle_error", f"oracle mean absolute error <= {cl['max_oracle_error']:.0%} on the "
                     "measured runs", bool(mae <= cl["max_oracle_error"]), mean_abs_error=mae,
                     mean_accuracy=1 - mae, cores=cores,
                     mean_abs_error_ranks_within_cores=float(df.loc[fits, "oracle_error"].abs().mean()),
                     mean_abs_error_more_ranks_than_cores=float(df.loc[~fits, "oracle_error"].abs().mean()),
                     per_run={r: float(e) for r, e in zip(df["run"], df["oracle_error"], strict=True)}))
    loss = read_table(tables / "loss.csv")
    tr = loss[loss["run"].str.startswith("train")].sort_values("iteration")["loss"].to_numpy()
    n = max(1, min(10, len(tr) // 3))
    first, last = (float(tr[:n].mean()), float(tr[-n:].mean())) if len(tr) else (float("nan"),) * 2
    out.append(claim("loss_falls", f"training learns: mean loss of the last {n} iterations < "
                     f"{cl['loss_drop']} x the first {n}", bool(last < cl["loss_drop"] * first),
                     first_loss=first, last_loss=last))
    ext = read_table(tables / "extrapolation.csv")
    top = ext[ext["gpus"] == ext["gpus"].max()]
    chosen = ext[ext["chosen"]]
    pick = top[top["chosen"]]
    data_fits = bool(ext[(ext["family"] == "data")]["feasible"].any())
    picked = str(pick["strategy"].iloc[0]) if len(pick) else "none feasible"
    out.append(claim("oracle_picks_spatial", f"at {int(ext['gpus'].max())} GPUs the oracle picks a spatial "
                     "(or data x spatial) strategy for CosmoFlow; pure data parallelism "
                     f"{'fits' if data_fits else 'does not fit'} in GPU memory", "spatial" in picked,
                     picked=picked, data_parallel_fits=data_fits,
                     picks={int(g): str(s) for g, s in zip(chosen["gpus"], chosen["strategy"], strict=True)}))
    return out
