"""Aggregate, plot and check claims for the memory-offload study (used by `python -m hpcdl.platform.cli`).

Tables (tables/): tradeoff.csv (per strategy and depth: peak memory, step-time split, bytes moved,
hidden fraction, and the ratios to `none` at the same depth: memory, slowdown, bit-identical
weights), capacity.csv (largest depth and parameters under the budget per strategy, and the ratio
to `none`) and failures.csv (every failed point).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform.claims import claim, every, not_measured
from hpcdl.platform.results import mark_no_data, read_table, save_figure, write_table

MiB = 2**20
ORDER = ["none", "optimizer", "activations", "both", "save_on_cpu"]
COLORS = dict(zip(ORDER, ["C0", "C1", "C2", "C3", "C4"], strict=True))
OFFLOADS = ["optimizer", "activations", "both"]


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"].copy() if "status" in df and not df.empty else df.iloc[0:0].copy()


def _nonempty(path: Path) -> bool:
    return path.exists() and len(path.read_text().strip().splitlines()) > 1


def _read(path: Path) -> pd.DataFrame:
    return read_table(path) if _nonempty(path) else pd.DataFrame()


def tradeoff(steps: pd.DataFrame) -> pd.DataFrame:
    ok = _ok(steps)
    if ok.empty:
        return pd.DataFrame(columns=["strategy", "depth", "memory_ratio", "slowdown", "bit_identical"])
    base = ok[ok["strategy"] == "none"].set_index("depth")
    rows = []
    for _, r in ok.iterrows():
        b = base.loc[r["depth"]] if r["depth"] in base.index else None
        rows.append(
            {
                **r.to_dict(),
                "memory_ratio": r["peak_fast_bytes"] / b["peak_fast_bytes"] if b is not None else np.nan,
                "rss_ratio": r["peak_extra_rss_bytes"] / b["peak_extra_rss_bytes"]
                if b is not None
                else np.nan,
                "slowdown": r["step_s"] / b["step_s"] if b is not None else np.nan,
                "bit_identical": (r["weights_sha256"] == b["weights_sha256"]) if b is not None else None,
            }
        )
    out = pd.DataFrame(rows)
    out["order"] = out["strategy"].map({s: i for i, s in enumerate(ORDER)})
    return out.sort_values(["depth", "order"]).drop(columns="order").reset_index(drop=True)


def capacity(raw: pd.DataFrame) -> pd.DataFrame:
    ok = _ok(raw)
    if ok.empty:
        return pd.DataFrame(columns=["strategy", "max_depth", "max_params", "capacity_ratio"])
    base = ok[ok["strategy"] == "none"]
    none_params = float(base["max_params"].iloc[0]) if len(base) else np.nan
    ok["capacity_ratio"] = ok["max_params"] / none_params if none_params and none_params > 0 else np.nan
    return ok.reset_index(drop=True)


def failures(raws: dict[str, pd.DataFrame]) -> pd.DataFrame:
    rows = []
    for kind, df in raws.items():
        if "status" in df:
            for _, r in df[df["status"] == "failed"].iterrows():
                point = {
                    k: r[k] for k in ("strategy", "depth", "width", "budget_mb") if k in r and pd.notna(r[k])
                }
                rows.append(
                    {
                        "kind": kind,
                        "point": ", ".join(f"{k}={v}" for k, v in point.items()),
                        "error": r["error"],
                    }
                )
    return pd.DataFrame(rows, columns=["kind", "point", "error"])


def aggregate(cfg: dict, study_dir: Path) -> None:
    started = time.time()
    study_dir = Path(study_dir)
    raw = {k: _read(study_dir / "raw" / f"{k}.csv") for k in ("steps", "capacity")}
    tables = study_dir / "tables"
    write_table(tradeoff(raw["steps"]), tables / "tradeoff.csv", cfg, started)
    write_table(capacity(raw["capacity"]), tables / "capacity.csv", cfg, started)
    write_table(failures(raw), tables / "failures.csv", cfg, started)


# ---------------------------------------------------------------- figures


def _tier_label(df: pd.DataFrame) -> str:
    if df.empty or "tier" not in df:
        return ""
    tier = str(df["tier"].iloc[0])
    if tier == "ram>file":
        return f"CPU analogue: fast = process memory, slow = files ({df['io_mode'].iloc[0]})"
    return "CUDA: fast = GPU memory, slow = pinned host memory"


def plot(cfg: dict, study_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    study_dir = Path(study_dir)
    tables, figs = study_dir / "tables", study_dir / "figures"
    tr = _read(tables / "tradeoff.csv")
    cap = _read(tables / "capacity.csv")
    tier = _tier_label(tr)

    # 1. peak fast-tier memory vs step time, one point per size
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for s in [s for s in ORDER if not tr.empty and s in set(tr["strategy"])]:
        d = tr[tr["strategy"] == s].sort_values("depth")
        ax.plot(d["step_s"] * 1000, d["peak_fast_bytes"] / MiB, "o-", color=COLORS[s], label=s)
        for _, r in d.iterrows():
            ax.annotate(
                f"{int(r['depth'])}L",
                (r["step_s"] * 1000, r["peak_fast_bytes"] / MiB),
                textcoords="offset points",
                xytext=(4, 3),
                fontsize=7,
                color=COLORS[s],
            )
    if tr.empty:
        mark_no_data(ax, "no successful sweep points in this run")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="step time (ms, median step)",
        ylabel="peak fast-tier memory (MiB)",
        title=f"Memory vs time per strategy (labels: depth)\n{tier}",
    )
    ax.title.set_fontsize(9)
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):  # plain numbers, not 2x10^2
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, figs / "tradeoff.png")

    # 2. stacked step-time breakdown at every depth
    parts = [
        ("forward_s", "forward", "C0"),
        ("backward_s", "backward", "C2"),
        ("optimizer_s", "optimizer", "C1"),
        ("exposed_transfer_s", "exposed transfer", "C3"),
    ]
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * max(1, len(tr))), 4.6))
    if not tr.empty:
        labels = [f"{r.strategy}\n{int(r.depth)}L" for r in tr.itertuples()]
        bottom = np.zeros(len(tr))
        for col, name, color in parts:
            vals = tr[col].fillna(0).to_numpy() * 1000
            ax.bar(range(len(tr)), vals, bottom=bottom, color=color, label=name)
            bottom += vals
        ax.set_xticks(range(len(tr)), labels, fontsize=6, rotation=90)
        ax.legend(fontsize=8)
    else:
        mark_no_data(ax, "no successful sweep points in this run")
    ax.set(ylabel="time per step (ms, median step)", title=f"Step time split\n{tier}")
    ax.title.set_fontsize(9)
    ax.grid(True, axis="y", alpha=0.3)
    save_figure(fig, figs / "breakdown.png")

    # 3. largest trainable model per strategy under the budget
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    if not cap.empty:
        c = cap.set_index("strategy").reindex([s for s in ORDER if s in set(cap["strategy"])])
        bars = ax.bar(c.index, c["max_params"] / 1e6, color=[COLORS[s] for s in c.index])
        for b, (_, r) in zip(bars, c.iterrows(), strict=True):
            ax.annotate(
                f"{int(r['max_depth'])} layers\nx{r['capacity_ratio']:.2f}",
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_title(
            f"Largest model under a {c['budget_mb'].iloc[0]:g} MiB fast-tier budget\n{_tier_label(tr)}",
            fontsize=9,
        )
    else:
        mark_no_data(ax, "no successful capacity search in this run")
    ax.set(xlabel="strategy", ylabel="parameters that train (millions)")
    ax.margins(y=0.2)
    save_figure(fig, figs / "capacity.png")

    # 4. one step's timeline: compute vs transfer lanes
    _plot_timeline(plt, _read(study_dir / "raw" / "timeline.csv"), tr, figs / "timeline.png")


def _plot_timeline(plt, tl: pd.DataFrame, tr: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 3.6))
    lanes = [
        ("compute", "compute (fwd / bwd / optimizer)"),
        ("wait", "compute waits on a copy (exposed)"),
        ("to_slow", "copy fast -> slow"),
        ("from_slow", "copy slow -> fast"),
    ]
    pick = None
    if not tl.empty and not tr.empty:
        both = tr[tr["strategy"] == "both"]
        src = both if not both.empty else tr[tr["strategy"] != "none"]
        if not src.empty:
            r = src.sort_values("depth").iloc[-1]
            pick = (r["strategy"], int(r["depth"]))
    if pick is None:
        mark_no_data(ax, "no offload strategy's timeline in this run")
    else:
        d = tl[(tl["strategy"] == pick[0]) & (tl["depth"] == pick[1])]
        colors = {"forward": "C0", "backward": "C2", "optimizer": "C1", "optimizer_update": "C5"}
        for y, (lane, _) in enumerate(lanes):
            for _, s in d[d["lane"] == lane].iterrows():
                color = colors.get(
                    s["kind"], "C3" if lane == "wait" else ("C4" if lane == "to_slow" else "C9")
                )
                h = 0.35 if s["kind"] == "optimizer_update" else 0.7
                ax.broken_barh(
                    [(s["start_s"] * 1000, max(1e-3, (s["end_s"] - s["start_s"]) * 1000))],
                    (y - h / 2, h),
                    color=color,
                    alpha=0.8 if s["kind"] != "optimizer" else 0.35,
                    linewidth=0,
                )
        r = tr[(tr["strategy"] == pick[0]) & (tr["depth"] == pick[1])].iloc[0]
        ax.set_title(
            f"One step of '{pick[0]}' at {pick[1]} layers; {r['hidden_frac']:.0%} of transfer time hidden "
            f"over all measured steps ({_tier_label(tr)})",
            fontsize=9,
        )
    ax.set_yticks(range(len(lanes)), [lbl for _, lbl in lanes], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time since the step started (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    save_figure(fig, path)


# ---------------------------------------------------------------- claims

CLAIMS = ("memory_ratio", "hidden_fraction", "weights_equal", "capacity_ratio")
MEMORY_MAX_RATIO = 0.30
HIDDEN_MIN = 0.70
CAPACITY_MIN_RATIO = 3.0


def _why_missing(fails: pd.DataFrame, kind: str, **point) -> str:
    keys = [f"{k}={v}" for k, v in point.items()]
    for r in fails[fails["kind"] == kind].itertuples() if not fails.empty else []:
        if all(k in str(r.point).split(", ") for k in keys):
            last = [ln for ln in str(r.error).strip().splitlines() if ln.strip()] or ["no error text"]
            return f"point {', '.join(keys)} failed: {last[-1][:300]}"
    return f"point {', '.join(keys)} is not in the table"


def claims(cfg: dict, study_dir: Path) -> list[dict]:
    tables = Path(study_dir) / "tables"
    tr = _read(tables / "tradeoff.csv")
    cap = _read(tables / "capacity.csv")
    fails = _read(tables / "failures.csv")
    if fails.empty:
        fails = pd.DataFrame(columns=["kind", "point", "error"])
    block = cfg["offload"]
    return [
        _claim_memory(tr, block, fails),
        _claim_hidden(tr, block, fails),
        _claim_weights(tr, block, fails),
        _claim_capacity(cap, block, fails),
    ]


def _row(tr: pd.DataFrame, strategy: str, depth: int):
    if tr.empty:
        return None
    d = tr[(tr["strategy"] == strategy) & (tr["depth"] == depth)]
    return d.iloc[0] if len(d) else None


def _largest_both_ran(tr: pd.DataFrame, a: str, b: str) -> int | None:
    if tr.empty:
        return None
    depths = set(tr[tr["strategy"] == a]["depth"]) & set(tr[tr["strategy"] == b]["depth"])
    return int(max(depths)) if depths else None


def _claim_memory(tr, block, fails) -> dict:
    cid = "memory_ratio"
    statement = (
        f"optimizer + activation offload ('both') cuts peak fast-tier memory to <= {MEMORY_MAX_RATIO} of "
        "'none' at the largest size both ran"
    )
    need = {"none", "both"} - set(block["strategies"])
    if need:
        return not_measured(
            cid, statement, f"offload.strategies lacks {sorted(need)}", threshold=MEMORY_MAX_RATIO
        )
    depth = _largest_both_ran(tr, "none", "both")
    if depth is None:
        top = max(block["model"]["depths"])
        return not_measured(
            cid,
            statement,
            [
                _why_missing(fails, "steps", strategy=s, depth=top)
                for s in ("none", "both")
                if _row(tr, s, top) is None
            ],
            threshold=MEMORY_MAX_RATIO,
        )
    r, n = _row(tr, "both", depth), _row(tr, "none", depth)
    ratio = float(r["peak_fast_bytes"] / n["peak_fast_bytes"])
    return claim(
        cid,
        statement,
        ratio <= MEMORY_MAX_RATIO,
        depth=depth,
        memory_ratio=round(ratio, 4),
        both_peak_fast_bytes=int(r["peak_fast_bytes"]),
        none_peak_fast_bytes=int(n["peak_fast_bytes"]),
        rss_ratio=round(float(r["peak_extra_rss_bytes"] / n["peak_extra_rss_bytes"]), 4),
        tier=str(r["tier"]),
        threshold=MEMORY_MAX_RATIO,
    )


def _claim_hidden(tr, block, fails) -> dict:
    cid = "hidden_fraction"
    offloads = [s for s in OFFLOADS if s in block["strategies"]]
    top = max(block["model"]["depths"])
    statement = (
        f">= {HIDDEN_MIN:.0%} of transfer time hidden behind compute, for every offload strategy at the "
        f"largest size ({top} layers)"
    )
    holds, missing, fractions = {}, {}, {}
    for s in offloads:
        r = _row(tr, s, top)
        if r is None or not np.isfinite(r["hidden_frac"]):
            missing[s] = (
                _why_missing(fails, "steps", strategy=s, depth=top) if r is None else "no transfer timed"
            )
            continue
        fractions[s] = round(float(r["hidden_frac"]), 4)
        holds[s] = fractions[s] >= HIDDEN_MIN
    tier = str(tr["tier"].iloc[0]) if not tr.empty else None
    return every(
        cid, statement, holds, missing, hidden_frac=fractions, depth=top, tier=tier, threshold=HIDDEN_MIN
    )


def _claim_weights(tr, block, fails) -> dict:
    cid = "weights_equal"
    statement = (
        "every offload strategy trains to bit-identical weights (sha256 of the final parameters) as 'none', "
        "same seed and steps, at every size"
    )
    if "none" not in block["strategies"]:
        return not_measured(cid, statement, "offload.strategies lacks 'none'")
    holds, missing = {}, {}
    for d in sorted(block["model"]["depths"]):
        for s in [s for s in block["strategies"] if s != "none"]:
            r, n = _row(tr, s, d), _row(tr, "none", d)
            if r is None or n is None:
                if s == "save_on_cpu" and not tr.empty and str(tr["tier"].iloc[0]) == "ram>file":
                    continue  # CPU run: this strategy is skipped by design (plan.CPU_ONLY_SKIPPED)
                missing[f"{s}/{d}L"] = "; ".join(
                    _why_missing(fails, "steps", strategy=x, depth=d)
                    for x, row in ((s, r), ("none", n))
                    if row is None
                )
                continue
            holds[f"{s}/{d}L"] = str(r["weights_sha256"]) == str(n["weights_sha256"])
    return every(
        cid, statement, holds, missing, required="sha256 equal to none's", tolerance="0 (bit-identical)"
    )


def _claim_capacity(cap, block, fails) -> dict:
    cid = "capacity_ratio"
    budget = block["capacity"]["budget_mb"]
    statement = (
        f"under a {budget:g} MiB fast-tier budget, 'both' trains >= {CAPACITY_MIN_RATIO:g}x the parameters "
        "of 'none' (Myelin's parameters-per-device gain)"
    )
    need = {"none", "both"} - set(block["strategies"])
    if need:
        return not_measured(
            cid, statement, f"offload.strategies lacks {sorted(need)}", threshold=CAPACITY_MIN_RATIO
        )
    rows = {
        s: (cap[cap["strategy"] == s].iloc[0] if not cap.empty and (cap["strategy"] == s).any() else None)
        for s in ("none", "both")
    }
    absent = [s for s, r in rows.items() if r is None]
    if absent:
        return not_measured(
            cid,
            statement,
            [_why_missing(fails, "capacity", strategy=s) for s in absent],
            threshold=CAPACITY_MIN_RATIO,
        )
    n, b = rows["none"], rows["both"]
    if int(n["max_params"]) == 0:
        return not_measured(
            cid, statement, "'none' fits not even one layer under the budget", threshold=CAPACITY_MIN_RATIO
        )
    ratio = float(b["max_params"]) / float(n["max_params"])
    capped = bool(str(b.get("capped_at_max_depth", False)).lower() == "true")
    if capped and ratio < CAPACITY_MIN_RATIO:
        return not_measured(
            cid,
            statement,
            "'both' reached offload.capacity.max_depth: its capacity is a lower bound",
            capacity_ratio=round(ratio, 4),
            threshold=CAPACITY_MIN_RATIO,
        )
    return claim(
        cid,
        statement,
        ratio >= CAPACITY_MIN_RATIO,
        capacity_ratio=round(ratio, 4),
        none_max_depth=int(n["max_depth"]),
        both_max_depth=int(b["max_depth"]),
        none_max_params=int(n["max_params"]),
        both_max_params=int(b["max_params"]),
        capped_at_max_depth=capped,
        threshold=CAPACITY_MIN_RATIO,
    )
