"""Claims stage of the checkpoint-cost study: tables/ -> the four claims (async blocking, bandwidth vs
the storage ceiling, bit-identical resume, verified round trip), thresholds from `checkpoint.claims`.

Bandwidth vs ceiling: each sync repeat's write bandwidth is divided by the FASTER of the two ceiling
probes around that same save (compute.py: the same bytes written the way a save writes them); a
format is judged on the 95 % interval of these per-repeat ratios (tables/bandwidth_repeats.csv) and
the claim holds where some format's interval lies above the line (straddles where none does and one
crosses it). A noisy probe can thus only lower a ratio, never make a pass easier. The ceiling is
an upper bound by construction; a format whose median ratio exceeds 1 by more than the fixed
`ceiling_tolerance` (never by the probes' measured disagreement, which is evidence only) shows
the probe did not measure the storage's limit, so the claim is not measured, naming that defect
with the numbers, never passed.

Devices: the thresholds (checkpoint.claims) were set for the CPU, so the two claims with one say the
device they were measured on. On the GPU they mean the CUDA path's version of themselves: the async
stall is the snapshot into pinned host memory against a sync save that includes its device-to-host
copy, and the ceiling is the D2H copy ceiling (pinned memcpy of the same bytes) plus the storage
ceiling (instruments.CEILINGS), so the bandwidth claim stays a ratio of like with like."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hpcdl.platform import (
    CONFIDENCE,
    FAILURE_COLUMNS,
    StudyDir,
    above,
    any_of,
    below,
    claim,
    deterministic,
    every,
    failed_because,
    mean_interval,
    measured_afresh,
    not_measured,
    ok_rows,
    read_or_empty,
    read_table,
    why_point_missing,
)
from hpcdl.studies.checkpoint.instruments import CEILINGS
from hpcdl.studies.checkpoint.sweep import sweep_sizes
from hpcdl.studies.checkpoint.tables import DEVICE_NAMES, MiB, run_device, single_process

CLAIMS = ("async_blocking", "bandwidth_vs_ceiling", "resume_bit_identical", "roundtrip")
# judged per format on the interval of its per-repeat async / sync ratios (tables/async_repeats.csv),
# and of its per-repeat bandwidth / ceiling ratios (tables/bandwidth_repeats.csv)
INTERVAL_CLAIMS = ("async_blocking", "bandwidth_vs_ceiling")
# where each verdict is confirmed (hpcdl.platform.kit.confirmation): no seed decides a save's time
CONFIRMATION = {
    "async_blocking": measured_afresh("save times of this run's repeats"),
    "bandwidth_vs_ceiling": measured_afresh("save and ceiling times of this run's repeats"),
    "resume_bit_identical": deterministic("a resumed run equals the uninterrupted one bit for bit"),
    "roundtrip": deterministic("every checkpoint written loads back verified"),
}


def judge(cfg: dict, study_dir: Path) -> list[dict]:
    run = StudyDir(study_dir)
    block = cfg["checkpoint"]
    io = read_table(run.table("io_cost"))
    pairs = read_or_empty(run.table("async_repeats"))
    bw_pairs = read_or_empty(run.table("bandwidth_repeats"))
    resume = read_table(run.table("resume"))
    fails = read_or_empty(run.table("failures"), columns=FAILURE_COLUMNS)
    largest = max(sweep_sizes(**block["sizes"]))
    one = single_process(io)
    device = run_device(io, study_dir)
    return [_claim_async(one, block, largest, fails, device, pairs),
            _claim_bandwidth(one, block, largest, fails, device, bw_pairs),
            _claim_resume(resume, block["formats"], device), _claim_roundtrip(io, block, fails, device)]


def _on(device: str) -> str:
    """Where a claim with a CPU-set threshold was measured, as its statement says it."""
    name = DEVICE_NAMES.get(device, device)
    return f"on {name}" + ("" if device == "cpu" else "; the threshold was set for the CPU")


def _at(df: pd.DataFrame, fmt: str, mode: str, n: int) -> pd.Series | None:
    if df.empty:
        return None
    d = df[(df["format"] == fmt) & (df["mode"] == mode) & (df["n_params"] == n)]
    return d.iloc[0] if len(d) else None


def _repeat_ratios(pairs: pd.DataFrame, fmt: str, n: int, column: str = "blocking_over_sync") -> pd.Series:
    """A format's per-repeat ratio `column` at size `n` (async / sync blocking, or bandwidth over the
    ceiling), indexed by repeat."""
    if pairs.empty or not {"format", "n_params", "repeat", column} <= set(pairs):
        return pd.Series(dtype=float)
    d = pairs[(pairs["format"] == fmt) & (pairs["n_params"] == n)]
    return d.set_index("repeat")[column].dropna().sort_index()


def _claim_async(one: pd.DataFrame, block: dict, n: int, fails: pd.DataFrame, device: str,
                 pairs: pd.DataFrame) -> dict:
    limit = block["claims"]["async_max_ratio"]
    if device == "cuda":
        what = ("async blocking time (the snapshot of GPU-resident state into pinned host memory) <= "
                f"{limit:.0%} of sync save time (device-to-host copy, write, fsync, commit)")
    else:
        what = f"async blocking time <= {limit:.0%} of sync save time"
    passes = int(block.get("snapshot_passes", 1))
    copies = (f"; an async repeat's snapshot copy is the median of {passes} copies of the same state "
              "into the same buffers, the save's own and the rest after it" if passes > 1 else "")
    statement = (f"{what} at the largest size ({n} parameters), for every configured format (on the "
                 f"{CONFIDENCE:.0%} interval of the per-repeat ratios, async and sync saves of the same "
                 f"repeat{copies}, where a format has 2 or more repeats: straddles where it crosses the "
                 f"line; else on the ratio of the medians), {_on(device)}")
    if not {"sync", "async"} <= set(block["modes"]):
        return not_measured("async_blocking", statement, f"checkpoint.modes is {block['modes']}, "
                            "the claim compares sync with async", threshold=limit, device=device)
    holds, missing, ratios, per_repeat = {}, {}, {}, {}
    for f in block["formats"]:
        rows = {m: _at(one, f, m, n) for m in ("sync", "async")}
        absent = [m for m, r in rows.items() if r is None or not np.isfinite(r["blocking_s"])]
        if absent:
            missing[f] = "; ".join(why_point_missing(fails, "io", format=f, mode=m, ranks=1, n_params=n)
                                   for m in absent)
            continue
        ratios[f] = round(float(rows["async"]["blocking_s"] / rows["sync"]["blocking_s"]), 4)
        reps = _repeat_ratios(pairs, f, n)
        if len(reps) >= 2:
            iv = mean_interval(reps)
            per_repeat[f] = iv.evidence(4, keys=[f"repeat {int(r)}" for r in reps.index])
            holds[f] = below(iv, limit)
        else:
            holds[f] = ratios[f] <= limit
    return every("async_blocking", statement, holds, missing, n_params=int(n), state_mib=float(n * 4 / MiB),
                 async_over_sync=ratios, async_over_sync_per_repeat=per_repeat, threshold=limit,
                 device=device)


def _claim_bandwidth(one: pd.DataFrame, block: dict, n: int, fails: pd.DataFrame,
                     device: str = "cpu", pairs: pd.DataFrame | None = None) -> dict:
    cid = "bandwidth_vs_ceiling"
    line = block["claims"]["bandwidth_min_ratio"]
    if device == "cuda":
        what = ("the best format's write bandwidth from GPU memory to durable bytes is within "
                f"{1 - line:.0%} of the D2H + storage ceiling (the same bytes copied from the GPU into "
                "pinned host memory, then written to durable storage)")
    else:
        what = f"the best format's write bandwidth is within {1 - line:.0%} of the storage ceiling"
    statement = (f"{what} probed around each of its saves (the faster of the two probes, each the same "
                 "bytes written the way a save writes them: fresh file, fsync), at the largest size "
                 f"({n} parameters): some format's {CONFIDENCE:.0%} interval of its per-repeat paired ratios "
                 "above the line, where it has 2 or more repeats (straddles where none is above and one "
                 f"crosses it); else its median ratio, {_on(device)}")
    tol = block["claims"]["ceiling_tolerance"]
    ceiling = CEILINGS.get(device, device)
    if "sync" not in block["modes"]:
        return not_measured(cid, statement, f"checkpoint.modes is {block['modes']}: no sync saves",
                            threshold=line, device=device)
    pairs = pd.DataFrame() if pairs is None else pairs
    ratios, spreads, missing, mb_s, holds, per_repeat = {}, {}, {}, {}, {}, {}
    for f in block["formats"]:
        r = _at(one, f, "sync", n)
        if r is None or not np.isfinite(r["bw_over_ceiling"]):
            missing[f] = why_point_missing(fails, "io", format=f, mode="sync", ranks=1, n_params=n)
            continue
        ratios[f] = round(float(r["bw_over_ceiling"]), 4)
        if np.isfinite(r.get("ceiling_spread", np.nan)):
            spreads[f] = float(r["ceiling_spread"])
        mb_s[f] = {k: round(float(r[c]) / 1e6, 1) for k, c in BANDWIDTHS.items()
                   if c in r and np.isfinite(r[c])}
        reps = _repeat_ratios(pairs, f, n, "bw_over_ceiling")
        if len(reps) >= 2:
            iv = mean_interval(reps)
            per_repeat[f] = iv.evidence(4, keys=[f"repeat {int(k)}" for k in reps.index])
            holds[f] = above(iv, line)
        else:
            holds[f] = ratios[f] >= line
    best = max(ratios, key=ratios.get) if ratios else None
    # the ceiling's noise: how much its two probes around a save disagree (median over the formats);
    # evidence only: the faster probe is the ceiling, so noise lowers ratios and cannot excuse one above 1
    noise = round(float(np.median(list(spreads.values()))), 4) if spreads else 0.0
    evidence = dict(n_params=int(n), best_format=best, best_bw_over_ceiling=ratios.get(best),
                    bw_over_ceiling=ratios, bw_over_ceiling_per_repeat=per_repeat, holds=holds,
                    median_mb_per_s=mb_s, ceiling_noise=noise, missing=missing, threshold=line, tolerance=tol,
                    device=device, ceiling=ceiling)
    over_ceiling = {f: v for f, v in ratios.items() if v > 1 + tol}
    if over_ceiling:
        return not_measured(cid, statement, f"the {ceiling} ceiling is defective (" + ", ".join(
            f"{f} writes at {v:.2f}x of it" + _mb_s(mb_s.get(f, {})) for f, v in over_ceiling.items())
            + f"; median paired ratio above 1 + checkpoint.claims.ceiling_tolerance {tol:g}; the probes "
            f"disagree by {noise:.3f}), so it is no ceiling", **evidence)
    judged = claim(cid, statement, any_of(holds.values()), **evidence)
    if missing and judged["status"] != "passed":  # a missing format cannot undo a format's pass
        return not_measured(cid, statement, [f"{f}: {why}" for f, why in missing.items()], **evidence)
    return judged


BANDWIDTHS = {"write": "write_bw_bytes_per_s", "ceiling": "ceiling_bw_bytes_per_s"}  # io_cost's medians


def _mb_s(bw: dict) -> str:
    """' (write 2000 MB/s, ceiling 650 MB/s)' from a format's median bandwidths, where known."""
    return f" (write {bw['write']:g} MB/s, ceiling {bw['ceiling']:g} MB/s)" if len(bw) == 2 else ""


def _claim_resume(resume: pd.DataFrame, formats: list[str], device: str = "cpu") -> dict:
    if device == "cuda":
        statement = ("training on the GPU, stop at step k, load in a fresh process onto the GPU, continue to "
                     "N: bit-identical to uninterrupted GPU training, every configured format")
    else:
        statement = ("stop at step k, load in a fresh process, continue to N: bit-identical to "
                     "uninterrupted, every configured format")
    holds, missing = {}, {}
    for f in formats:
        rows = resume[resume["format"] == f] if "format" in resume else resume.iloc[0:0]
        ok = ok_rows(rows)
        if ok.empty:
            errors = [str(e) for e in rows.get("error", pd.Series(dtype=str)) if pd.notna(e) and str(e)]
            missing[f] = (failed_because("resume check", errors[0]) if errors
                          else "no resume check in the table")
        else:
            holds[f] = bool((ok["bit_identical"].astype(str).str.lower() == "true").all())
    return every("resume_bit_identical", statement, holds, missing, required="bit-identical parameters, "
                 "optimizer state and RNG streams after resuming", device=device)


def _claim_roundtrip(io: pd.DataFrame, block: dict, fails: pd.DataFrame, device: str = "cpu") -> dict:
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
            missing[key] = why_point_missing(fails, "io", format=f, mode=m, ranks=r, n_params=n)
        else:
            holds[key] = bool(d["roundtrip_ok"].astype(str).str.lower().eq("true").all())
    return every("roundtrip", statement, holds, missing, points=len(expected), required="verified and equal",
                 not_equal=[k for k, v in holds.items() if not v], device=device)
