"""Aggregate, plot and check claims for the checkpoint-cost study (used by `python -m hpcdl.platform.cli`).

Tables (tables/): io_cost.csv (median per format, mode, ranks, size), resume.csv,
overhead.csv (throughput and overhead vs interval), young_daly.csv (optimal interval
per mode and MTBF) and failures.csv (every failed point, any kind).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.studies.checkpoint.plan import sweep_sizes
from hpcdl.studies.checkpoint.training import young_daly_interval_s
from hpcdl.platform.claims import claim, every, not_measured
from hpcdl.platform.results import mark_no_data, read_table, save_figure, write_table

MiB = 2**20
FORMAT_ORDER = ["torch", "safetensors", "dcp", "hdf5", "npz"]
MEDIAN_COLS = ["state_bytes", "file_bytes", "blocking_s", "durable_s", "commit_s", "load_s", "verify_s",
               "write_bw_bytes_per_s", "ceiling_s", "ceiling_bw_bytes_per_s", "bw_over_ceiling",
               "save_peak_extra_rss_bytes", "load_peak_extra_rss_bytes"]


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"].copy() if "status" in df else df


def io_cost(raw: pd.DataFrame) -> pd.DataFrame:
    """Median over repeats per (format, mode, process group, ranks, size).

    The storage ceiling of a size is the median of every ceiling measured at that size with the
    same launch (all formats, modes and repeats pooled): one noisy dd-like write must not make
    or break a format's ratio. `bw_over_ceiling` divides by that pooled ceiling.
    """
    ok = _ok(raw)
    keys = ["format", "mode", "process_group", "ranks", "n_params"]
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "repeats", *MEDIAN_COLS, "roundtrip_ok"])
    ok["roundtrip_ok"] = ok["roundtrip_ok"].astype(str).str.lower() == "true"
    g = ok.groupby(keys, sort=True)
    out = g[[c for c in MEDIAN_COLS if c != "bw_over_ceiling"]].median()
    out["repeats"] = g.size()
    out["roundtrip_ok"] = g["roundtrip_ok"].all()
    out = out.reset_index()
    pooled = ok.groupby(["process_group", "ranks", "n_params"])["ceiling_bw_bytes_per_s"].median()
    out["ceiling_bw_bytes_per_s"] = [pooled[(pg, r, n)] for pg, r, n in
                                     zip(out["process_group"], out["ranks"], out["n_params"], strict=True)]
    out["bw_over_ceiling"] = out["write_bw_bytes_per_s"] / out["ceiling_bw_bytes_per_s"]
    return out


def overhead_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Successful overhead runs; each carries its paired no-checkpoint baseline and its overhead
    as extra training time per unit of work (comparable with the C/T of the Young/Daly model)."""
    ok = _ok(raw)
    if ok.empty:
        return pd.DataFrame()
    out = ok.copy()
    out["interval_s"] = out["interval_steps"] / out["baseline_steps_per_s"]
    return out.sort_values(["mode", "interval_steps"]).reset_index(drop=True)


def young_daly_table(overhead: pd.DataFrame, mtbf_s: list[float]) -> pd.DataFrame:
    """C = mean stall per checkpoint at the longest interval (no back-to-back saves); T = sqrt(2 MTBF C)."""
    rows = []
    if overhead.empty:
        return pd.DataFrame(rows)
    for mode, d in overhead.groupby("mode"):
        last = d.sort_values("interval_steps").iloc[-1]
        cost = float(last["stall_mean_s"])
        base = float(last["baseline_steps_per_s"])
        for m in mtbf_s:
            t_opt = young_daly_interval_s(m, cost)
            rows.append({"mode": mode, "mtbf_s": m, "cost_s": cost, "interval_s": t_opt,
                         "interval_steps": t_opt * base,
                         "expected_waste_frac": (cost / t_opt + t_opt / (2 * m)) if t_opt > 0 else 0.0})
    return pd.DataFrame(rows)


def failures(raws: dict[str, pd.DataFrame]) -> pd.DataFrame:
    rows = []
    for kind, df in raws.items():
        if "status" in df:
            for _, r in df[df["status"] == "failed"].iterrows():
                point = {k: r[k] for k in ("format", "mode", "ranks", "n_params", "interval_steps")
                         if k in r and pd.notna(r[k])}
                rows.append({"kind": kind, "point": ", ".join(f"{k}={v}" for k, v in point.items()),
                             "error": r["error"]})
    return pd.DataFrame(rows, columns=["kind", "point", "error"])


def _raws(study_dir: Path) -> dict[str, pd.DataFrame]:
    return {k: read_table(study_dir / "raw" / f"{k}.csv") for k in ("io", "resume", "overhead")}


def aggregate(cfg: dict, study_dir: Path) -> None:
    started = time.time()
    study_dir = Path(study_dir)
    raws = _raws(study_dir)
    tables = study_dir / "tables"
    write_table(io_cost(raws["io"]), tables / "io_cost.csv", cfg, started)
    write_table(raws["resume"], tables / "resume.csv", cfg, started)
    ovh = overhead_table(raws["overhead"])
    write_table(ovh, tables / "overhead.csv", cfg, started)
    write_table(young_daly_table(ovh, cfg["checkpoint"]["overhead"]["mtbf_s"]), tables / "young_daly.csv",
                cfg, started)
    write_table(failures(raws), tables / "failures.csv", cfg, started)


# ---------------------------------------------------------------- figures

def _formats(df: pd.DataFrame) -> list[str]:
    present = set(df["format"]) if not df.empty else set()
    return [f for f in FORMAT_ORDER if f in present]


def _colors() -> dict[str, str]:
    return dict(zip(FORMAT_ORDER, ["C0", "C1", "C2", "C3", "C4"], strict=True))


def _size_axis(ax) -> None:
    """Log x axis of state sizes in MiB with plain tick labels (no 2x10^-2 clutter)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())




def plot(cfg: dict, study_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    study_dir = Path(study_dir)
    tables, figs = study_dir / "tables", study_dir / "figures"
    io = read_table(tables / "io_cost.csv")
    one = _single_process(io)
    sync = one[one["mode"] == "sync"] if not one.empty else one
    col = _colors()

    # 1. save and load time vs size (log-log), synchronous, one process
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, column, title in ((axes[0], "commit_s", "save (to committed, fsync'd)"),
                              (axes[1], "load_s", "load (verified)")):
        for f in _formats(sync):
            d = sync[sync["format"] == f].sort_values("state_bytes")
            ax.plot(d["state_bytes"] / MiB, d[column], "o-", color=col[f], label=f)
        if sync.empty:
            mark_no_data(ax, "no successful sync points in this run")
        _size_axis(ax)
        ax.set(yscale="log", xlabel="model state (MiB, fp32)", title=title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("time (s)")
    axes[0].legend()
    save_figure(fig, figs / "save_load_time.png")

    # 2. write bandwidth vs size with the storage ceiling
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for f in _formats(sync):
        d = sync[sync["format"] == f].sort_values("state_bytes")
        ax.plot(d["state_bytes"] / MiB, d["write_bw_bytes_per_s"] / MiB, "o-", color=col[f], label=f)
    if not sync.empty:
        ceil = sync.groupby("state_bytes")["ceiling_bw_bytes_per_s"].median()
        ax.plot(ceil.index / MiB, ceil.values / MiB, "k--", lw=2, label="storage ceiling (write+fsync)")
    else:
        mark_no_data(ax, "no successful sync points in this run")
    _size_axis(ax)
    ax.set(xlabel="model state (MiB, fp32)", ylabel="write bandwidth to durable bytes (MiB/s)",
           title="Checkpoint write bandwidth vs storage ceiling")
    ax.set_ylim(bottom=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, figs / "bandwidth.png")

    # 3. sync vs async blocking time
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for f in _formats(one):
        for mode, style in (("sync", "o-"), ("async", "s--")):
            d = one[(one["format"] == f) & (one["mode"] == mode)].sort_values("state_bytes")
            if not d.empty:
                ax.plot(d["state_bytes"] / MiB, d["blocking_s"], style, color=col[f], label=f"{f} {mode}")
    if one.empty:
        mark_no_data(ax, "no successful I/O points in this run")
    _size_axis(ax)
    ax.set(yscale="log", xlabel="model state (MiB, fp32)",
           ylabel="training stall per checkpoint (s)", title="Blocking time: sync (solid) vs async (dashed)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, figs / "blocking.png")

    # 4. throughput overhead vs interval with the Young/Daly points
    _plot_overhead(plt, read_table(tables / "overhead.csv") if _nonempty(tables / "overhead.csv")
                   else pd.DataFrame(), read_table(tables / "young_daly.csv")
                   if _nonempty(tables / "young_daly.csv") else pd.DataFrame(), figs / "overhead.png")

    # 5. bytes on disk per format: total at the largest size, and the bytes beyond the raw tensors
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    if not sync.empty:
        d = sync[sync["n_params"] == sync["n_params"].max()].set_index("format").reindex(_formats(sync))
        ratio = d["file_bytes"] / d["state_bytes"]
        bars = ax.bar(d.index, d["file_bytes"] / MiB, color=[col[f] for f in d.index])
        ax.axhline(float(d["state_bytes"].iloc[0]) / MiB, color="k", ls="--", label="raw tensor bytes")
        for b, r in zip(bars, ratio, strict=True):
            ax.annotate(f"x{r:.4f}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                        va="bottom", fontsize=8)
        ax.legend(loc="lower right")
        ax.set_title(f"Bytes on disk at {float(d['state_bytes'].iloc[0]) / MiB:.3g} MiB of state")
        for f in _formats(sync):
            e = sync[sync["format"] == f].sort_values("state_bytes")
            ax2.plot(e["state_bytes"] / MiB, (e["file_bytes"] - e["state_bytes"]).clip(lower=1) / 1024, "o-",
                     color=col[f], label=f)
        ax2.legend(fontsize=8)
    else:
        mark_no_data(ax, "no successful sync points in this run")
    ax.set(xlabel="format", ylabel="checkpoint size on disk (MiB)")
    _size_axis(ax2)
    ax2.set(yscale="log", xlabel="model state (MiB, fp32)", ylabel="bytes beyond the raw tensors (KiB)",
            title="Format overhead (headers, metadata, padding)")
    ax2.grid(True, which="both", alpha=0.3)
    save_figure(fig, figs / "bytes_on_disk.png")

    # 6. DCP from N ranks
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    dcp = io[(io["format"] == "dcp") & (io["mode"] == "sync")] if not io.empty else io
    groups = sorted(set(zip(dcp["process_group"], dcp["ranks"], strict=True))) if not dcp.empty else []
    for i, (pg, r) in enumerate(groups):
        d = dcp[(dcp["process_group"] == pg) & (dcp["ranks"] == r)].sort_values("state_bytes")
        label = f"{r} gloo rank(s), sharded DTensor" if pg else "1 process, no process group"
        ax.plot(d["state_bytes"] / MiB, d["commit_s"], "o-", color=f"C{i}", label=f"save, {label}")
        ax.plot(d["state_bytes"] / MiB, d["load_s"], "s:", color=f"C{i}", label=f"load, {label}")
    if dcp.empty:
        mark_no_data(ax, "no successful DCP points in this run")
    _size_axis(ax)
    ax.set(yscale="log", xlabel="model state (MiB, fp32, all ranks)", ylabel="time (s)",
           title="DCP save/load by number of gloo ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, figs / "dcp_ranks.png")


def _single_process(io: pd.DataFrame) -> pd.DataFrame:
    """The format comparison: every format saved from one process without a process group."""
    return io[~io["process_group"].astype(bool)] if not io.empty else io


def _nonempty(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 1 and len(path.read_text().strip().splitlines()) > 1


def _plot_overhead(plt, ovh: pd.DataFrame, yd: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if ovh.empty:
        mark_no_data(ax, "no successful overhead points in this run")
        save_figure(fig, path)
        return
    base = float(ovh["baseline_steps_per_s"].median())
    mode_col = {"sync": "C3", "async": "C0"}
    xs = []
    for mode, d in ovh.groupby("mode"):
        d = d.sort_values("interval_steps")
        ax.plot(d["interval_steps"], 100 * d["overhead_frac"].clip(lower=1e-4), "o-",
                color=mode_col.get(mode), label=f"{mode}: measured")
        xs += list(d["interval_steps"])
    for (mode, m), d in yd.groupby(["mode", "mtbf_s"]) if not yd.empty else []:
        r = d.iloc[0]
        if r["cost_s"] <= 0:
            continue
        k = np.geomspace(min(xs + [r["interval_steps"]]) / 2, max(xs + [r["interval_steps"]]) * 2, 200)
        t = k / base
        waste = r["cost_s"] / t + t / (2 * m)
        ax.plot(k, 100 * waste, "-", lw=0.8, alpha=0.6, color=mode_col.get(mode))
        ax.plot([r["interval_steps"]], [100 * r["expected_waste_frac"]], "*", ms=12, color=mode_col.get(mode),
                markeredgecolor="k")
        ax.annotate(f"MTBF {m:g}s", (r["interval_steps"], 100 * r["expected_waste_frac"]),
                    textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax.plot([], [], "k-", lw=0.8, alpha=0.6, label="C/T + T/(2 MTBF) (expected waste)")
    ax.plot([], [], "k*", ms=10, label="Young/Daly T = sqrt(2 MTBF C)")
    ax.set(xscale="log", yscale="log", xlabel=f"checkpoint interval (steps; 1 step = {1 / base:.3f} s)",
           ylabel="extra training time vs no checkpoint (%)",
           title="Training overhead vs checkpoint interval")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, path)


# ---------------------------------------------------------------- claims

CLAIMS = ("async_blocking", "bandwidth_vs_ceiling", "resume_bit_identical", "roundtrip")
ASYNC_MAX_RATIO = 0.10      # async stall <= 10% of the sync save
BANDWIDTH_MIN_RATIO = 0.90  # best format within 10% of the storage ceiling


def _failed_table(tables: Path) -> pd.DataFrame:
    path = tables / "failures.csv"
    return read_table(path) if _nonempty(path) else pd.DataFrame(columns=["kind", "point", "error"])


def _why_missing(fails: pd.DataFrame, kind: str, **point) -> str:
    """The failure recorded for a point (its error's last line), or that it is absent."""
    keys = [f"{k}={v}" for k, v in point.items()]
    label = ", ".join(keys)
    for r in fails[fails["kind"] == kind].itertuples():
        if all(k in str(r.point).split(", ") for k in keys):
            last = [ln for ln in str(r.error).strip().splitlines() if ln.strip()] or ["no error text"]
            return f"point {label} failed: {last[-1][:300]}"
    return f"point {label} is not in the table"


def claims(cfg: dict, study_dir: Path) -> list[dict]:
    tables = Path(study_dir) / "tables"
    block = cfg["checkpoint"]
    io = read_table(tables / "io_cost.csv")
    resume = read_table(tables / "resume.csv")
    fails = _failed_table(tables)
    largest = max(sweep_sizes(**block["sizes"]))
    one = _single_process(io)
    return [_claim_async(one, block, largest, fails), _claim_bandwidth(one, block, largest, fails),
            _claim_resume(resume, block["formats"]), _claim_roundtrip(io, block, fails)]


def _at(df: pd.DataFrame, fmt: str, mode: str, n: int) -> pd.Series | None:
    if df.empty:
        return None
    d = df[(df["format"] == fmt) & (df["mode"] == mode) & (df["n_params"] == n)]
    return d.iloc[0] if len(d) else None


def _claim_async(one: pd.DataFrame, block: dict, n: int, fails: pd.DataFrame) -> dict:
    statement = (f"async blocking time <= {ASYNC_MAX_RATIO:.0%} of sync save time at the largest size "
                 f"({n} parameters), for every configured format")
    if not {"sync", "async"} <= set(block["modes"]):
        return not_measured("async_blocking", statement, f"checkpoint.modes is {block['modes']}, "
                            "the claim compares sync with async", threshold=ASYNC_MAX_RATIO)
    holds, missing, ratios = {}, {}, {}
    for f in block["formats"]:
        rows = {m: _at(one, f, m, n) for m in ("sync", "async")}
        absent = [m for m, r in rows.items() if r is None or not np.isfinite(r["blocking_s"])]
        if absent:
            missing[f] = "; ".join(_why_missing(fails, "io", format=f, mode=m, ranks=1, n_params=n)
                                   for m in absent)
            continue
        ratios[f] = round(float(rows["async"]["blocking_s"] / rows["sync"]["blocking_s"]), 4)
        holds[f] = ratios[f] <= ASYNC_MAX_RATIO
    return every("async_blocking", statement, holds, missing, n_params=int(n), state_mib=float(n * 4 / MiB),
                 async_over_sync=ratios, threshold=ASYNC_MAX_RATIO)


def _claim_bandwidth(one: pd.DataFrame, block: dict, n: int, fails: pd.DataFrame) -> dict:
    cid = "bandwidth_vs_ceiling"
    statement = (f"the best format's write bandwidth is within {1 - BANDWIDTH_MIN_RATIO:.0%} of the storage "
                 f"ceiling measured in the same run, at the largest size ({n} parameters)")
    if "sync" not in block["modes"]:
        return not_measured(cid, statement, f"checkpoint.modes is {block['modes']}: no sync saves",
                            threshold=BANDWIDTH_MIN_RATIO)
    ratios, missing = {}, {}
    for f in block["formats"]:
        r = _at(one, f, "sync", n)
        if r is None or not np.isfinite(r["bw_over_ceiling"]):
            missing[f] = _why_missing(fails, "io", format=f, mode="sync", ranks=1, n_params=n)
        else:
            ratios[f] = round(float(r["bw_over_ceiling"]), 4)
    best = max(ratios, key=ratios.get) if ratios else None
    evidence = dict(n_params=int(n), best_format=best, best_bw_over_ceiling=ratios.get(best),
                    bw_over_ceiling=ratios, missing=missing, threshold=BANDWIDTH_MIN_RATIO)
    if best is not None and ratios[best] >= BANDWIDTH_MIN_RATIO:
        return claim(cid, statement, True, **evidence)  # a missing format cannot lower the best
    if missing:
        return not_measured(cid, statement, [f"{f}: {why}" for f, why in missing.items()], **evidence)
    return claim(cid, statement, False, **evidence)


def _claim_resume(resume: pd.DataFrame, formats: list[str]) -> dict:
    statement = ("stop at step k, load in a fresh process, continue to N: bit-identical to uninterrupted, "
                 "every configured format")
    holds, missing = {}, {}
    for f in formats:
        rows = resume[resume["format"] == f] if "format" in resume else resume.iloc[0:0]
        ok = _ok(rows)
        if ok.empty:
            errors = [str(e) for e in rows.get("error", pd.Series(dtype=str)) if pd.notna(e) and str(e)]
            missing[f] = f"resume check failed: {errors[0].strip().splitlines()[-1][:300]}" if errors \
                else "no resume check in the table"
        else:
            holds[f] = bool((ok["bit_identical"].astype(str).str.lower() == "true").all())
    return every("resume_bit_identical", statement, holds, missing, required="bit-identical parameters, "
                 "optimizer state and RNG streams after resuming")


def _claim_roundtrip(io: pd.DataFrame, block: dict, fails: pd.DataFrame) -> dict:
    statement = ("every checkpoint written in the sweep (format, mode, ranks, size) loads back verified "
                 "and equal")
    sizes = sweep_sizes(**block["sizes"])
    expected = [(f, m, False, 1, n) for n in sizes for f in block["formats"] for m in block["modes"]]
    expected += [("dcp", "sync", True, r, n) for n in sizes for r in block["dcp_ranks"]]
    holds, missing = {}, {}
    for f, m, pg, r, n in expected:
        key = f"{f}/{m}/{r} rank(s){' (process group)' if pg else ''}/{n}"
        d = io[(io["format"] == f) & (io["mode"] == m) & (io["process_group"].astype(bool) == pg)
               & (io["ranks"] == r) & (io["n_params"] == n)] if not io.empty else io
        if d.empty:
            missing[key] = _why_missing(fails, "io", format=f, mode=m, ranks=r, n_params=n)
        else:
            holds[key] = bool(d["roundtrip_ok"].astype(str).str.lower().eq("true").all())
    return every("roundtrip", statement, holds, missing, points=len(expected), required="verified and equal",
                 not_equal=[k for k, v in holds.items() if not v])
