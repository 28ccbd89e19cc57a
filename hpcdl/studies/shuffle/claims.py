"""Claims stage of the shuffle study: tables/ (+ raw/points.csv) -> the papers' claims per M (random:
local and partial-0.1 match global; skewed: partial-0.1 recovers global, local does not), exact Q*N
bytes per epoch, at most (1+Q)N/M samples held, KAKURENBO saves time; thresholds from the config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform.claims import claim, every, not_measured
from hpcdl.platform.stages import failed_because, read_or_empty
from hpcdl.studies.shuffle.compute import SAMPLE_BYTES
from hpcdl.studies.shuffle.sweep import expand
from hpcdl.studies.shuffle.tables import kakurenbo_table, label

CLAIMS = ("random_local_partial_match_global_M{M}", "skewed_partial_recovers_global_M{M}",
          "bytes_per_epoch_equal_QN", "held_at_most_1_plus_Q_N_over_M", "kakurenbo_saves_time")
CLAIM_Q = 0.1  # the papers' partial-Q headline


def _acc(final: pd.DataFrame, part: str, m: int, lbl: str) -> float | None:
    g = final[final["partitioning"].eq(part) & final["world_size"].eq(m) & final["label"].eq(lbl)
              & final["kakurenbo_fraction"].eq(0)]
    return float(g["final_val_acc"].mean()) if not g.empty and g["final_val_acc"].notna().all() else None


def _pt(x):
    return None if x is None else round(100 * x, 2)


class _Points:
    """The sweep points the config asks for, and why one has no result (failed, absent)."""

    def __init__(self, block: dict, status: pd.DataFrame, final: pd.DataFrame):
        self.expected = {p["point"]: p for p in expand(block)}
        self.status = status.set_index("point") if "point" in status else pd.DataFrame()
        self.measured = set(final["point"]) if "point" in final else set()

    def find(self, strategy: str, q: float, partitioning: str, m: int, f: float = 0.0) -> list[str]:
        part = "shared" if strategy == "global" else partitioning
        return [pid for pid, p in self.expected.items()
                if (p["strategy"], p["q"], p["partitioning"], p["world_size"], p["kakurenbo_fraction"])
                == (strategy, float(q), part, int(m), float(f))]

    def missing(self, pids: list[str], what: str) -> list[str]:
        """Reasons the points have no result; `what` names the input when the config has none."""
        if not pids:
            return [f"the config runs no {what} point"]
        out = []
        for pid in pids:
            if pid in self.measured:
                continue
            if pid in self.status.index and self.status.loc[pid, "status"] == "failed":
                out.append(failed_because(f"point {pid}", self.status.loc[pid, "error"]))
            else:
                out.append(f"point {pid} has no result")
        return out


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    study_dir = Path(study_dir)
    block = cfg["shuffle"]
    final = read_or_empty(study_dir / "tables" / "final.csv")
    epochs = read_or_empty(study_dir / "tables" / "epochs.csv")
    pts = _Points(block, read_or_empty(study_dir / "raw" / "points.csv"), final)
    sizes = sorted({m for g in block["grids"] for m in g["world_sizes"]})
    out = []
    for m in sizes:
        out += [_claim_random(block, final, pts, m), _claim_skewed(block, final, pts, m)]
    out += [_claim_bytes(block, epochs, pts), _claim_held(block, final, pts),
            _claim_kakurenbo(block, final, pts)]
    return out


def _three(block: dict, final: pd.DataFrame, pts: _Points, part: str, m: int) -> tuple[dict, list[str]]:
    """Final accuracy (pt) of global, local and partial-0.1 at (partitioning, M), and what is missing."""
    want = {"global": ("global", 1.0), "local": ("local", 0.0), "partial_0_1": ("partial", CLAIM_Q)}
    acc, missing = {}, []
    for key, (strategy, q) in want.items():
        why = pts.missing(pts.find(strategy, q, part, m), f"{label(strategy, q)} {part} M={m}")
        a = None if final.empty else _acc(final, part, m, label(strategy, q))
        if why or a is None:
            missing += why or [f"{label(strategy, q)} {part} M={m} has no final accuracy"]
        else:
            acc[f"{key}_pt"] = _pt(a)
    return acc, missing


def _claim_random(block: dict, final: pd.DataFrame, pts: _Points, m: int) -> dict:
    tol = block["tolerance_pt"]
    cid = f"random_local_partial_match_global_M{m}"
    statement = (f"Random partitioning, M={m}: local and partial-{CLAIM_Q:g} shuffling reach a final "
                 f"validation accuracy no more than {tol:g} pt below global shuffling.")
    acc, missing = _three(block, final, pts, "random", m)
    if missing:
        return not_measured(cid, statement, missing, **acc, tolerance_pt=tol)
    ok = acc["local_pt"] >= acc["global_pt"] - tol and acc["partial_0_1_pt"] >= acc["global_pt"] - tol
    return claim(cid, statement, ok, **acc, tolerance_pt=tol)


def _claim_skewed(block: dict, final: pd.DataFrame, pts: _Points, m: int) -> dict:
    tol = block["tolerance_pt"]
    cid = f"skewed_partial_recovers_global_M{m}"
    statement = (f"Label-skewed partitioning (Dirichlet alpha={block['alpha']:g}), M={m}: "
                 f"partial-{CLAIM_Q:g} is no more than {tol:g} pt below global, while local is more than "
                 "that below global.")
    acc, missing = _three(block, final, pts, "skewed", m)
    if missing:
        return not_measured(cid, statement, missing, **acc, tolerance_pt=tol)
    ok = acc["partial_0_1_pt"] >= acc["global_pt"] - tol and acc["local_pt"] < acc["global_pt"] - tol
    return claim(cid, statement, ok, **acc, tolerance_pt=tol)


def _partial_points(pts: _Points) -> list[str]:
    return [pid for pid, p in pts.expected.items() if p["strategy"] == "partial"]


def _claim_bytes(block: dict, epochs: pd.DataFrame, pts: _Points) -> dict:
    n, n_epochs = block["n_train"], block["epochs"]
    statement = (f"Partial-Q exchange moves exactly Q*N samples ({SAMPLE_BYTES} bytes each: image, label, "
                 "id) per epoch, summed over ranks and counted from the tensors sent and received, in every "
                 f"epoch of every partial point (N={n}).")
    holds, missing, deviation = {}, {}, {}
    for pid in _partial_points(pts):
        why = pts.missing([pid], "partial")
        e = epochs[epochs["point"] == pid] if "point" in epochs else epochs
        if why or len(e) < n_epochs:
            missing[pid] = "; ".join(why) or f"{len(e)} of {n_epochs} epochs recorded"
            continue
        expect_bytes = e["q"] * n * SAMPLE_BYTES
        dev = max((e["bytes_sent"] - expect_bytes).abs().max(), (e["bytes_recv"] - expect_bytes).abs().max())
        deviation[pid] = float(dev)
        holds[pid] = bool(dev == 0 and (e["samples_sent"] == e["q"] * n).all())
    if not holds and not missing:
        return not_measured("bytes_per_epoch_equal_QN", statement, "the config runs no partial point (0<Q<1)")
    return every("bytes_per_epoch_equal_QN", statement, holds, missing, max_abs_deviation_bytes=deviation,
                 threshold_bytes=0)


def _claim_held(block: dict, final: pd.DataFrame, pts: _Points) -> dict:
    n = block["n_train"]
    cid = "held_at_most_1_plus_Q_N_over_M"
    statement = ("No rank ever holds more than (1+Q)*N/M distinct samples (N/M rounded up for uneven N), "
                 "counted from its buffers at the peak of each epoch: its partition, the staged sent samples "
                 "and the received ones.")
    holds, missing, held, bound, rows = {}, {}, {}, {}, {}
    for pid in _partial_points(pts):
        p = pts.expected[pid]
        why = pts.missing([pid], "partial")
        f = final[final["point"] == pid] if "point" in final else final
        if why or f.empty or "samples_held_max" not in f or f["samples_held_max"].isna().any():
            missing[pid] = "; ".join(why) or "no samples_held measurement"
            continue
        m = p["world_size"]
        bound[pid] = float(np.ceil(n / m) + p["q"] * n / m)
        held[pid] = int(f["samples_held_max"].max())
        if "held_rows_max" in f:
            rows[pid] = int(f["held_rows_max"].max())
        holds[pid] = held[pid] <= bound[pid]
    if not holds and not missing:
        return not_measured(cid, statement, "the config runs no partial point (0<Q<1)")
    return every(cid, statement, holds, missing, samples_held_max=held, bound=bound,
                 buffer_rows_max=rows)


def _claim_kakurenbo(block: dict, final: pd.DataFrame, pts: _Points) -> dict:
    tol = block["tolerance_pt"]
    kk = block["kakurenbo"]
    m = kk["world_size"]
    fractions = sorted(f for f in kk["fractions"] if f > 0)
    cid = "kakurenbo_saves_time"
    statement = (f"KAKURENBO saves training time at no more than {tol:g} pt accuracy loss vs F=0, M={m}, for "
                 f"every configured hiding fraction F in {fractions}.")
    if not fractions:
        return not_measured(cid, statement, "the config runs no hiding fraction F > 0", tolerance_pt=tol)
    base_why = pts.missing(pts.find("global", 1.0, "shared", m, 0.0), f"global M={m} F=0 baseline")
    k = kakurenbo_table(final, m) if not final.empty else pd.DataFrame()
    if base_why or "time_saving" not in k:
        return not_measured(cid, statement, base_why or [f"the F=0 baseline at M={m} has no result"],
                            tolerance_pt=tol)
    holds, missing, saving, change = {}, {}, {}, {}
    for f in fractions:
        why = pts.missing(pts.find("global", 1.0, "shared", m, f), f"F={f:g}")
        row = k[np.isclose(k["kakurenbo_fraction"], f)]
        if why or row.empty:
            missing[f"F={f:g}"] = "; ".join(why) or "no result"
            continue
        saving[f"F={f:g}"] = round(float(row["time_saving"].iloc[0]), 4)
        change[f"F={f:g}"] = round(float(row["acc_change_pt"].iloc[0]), 2)
        holds[f"F={f:g}"] = saving[f"F={f:g}"] > 0 and change[f"F={f:g}"] >= -tol
    return every(cid, statement, holds, missing, time_saving=saving, acc_change_pt=change, tolerance_pt=tol,
                 min_time_saving=0)
