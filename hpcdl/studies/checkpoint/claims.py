"""Claims stage of the checkpoint-cost study: tables/ -> the four claims (async blocking, bandwidth vs
the storage ceiling, bit-identical resume, verified round trip), thresholds from `checkpoint.claims`.

Async blocking is judged on each save's own stall: per repeat, the async save's blocking time, its
own snapshot copy included, over the sync save's of the same format and repeat
(tables/async_repeats.csv). What blocks (the snapshot copy into buffers allocated once) runs no
format code, so the stall is judged on the 95 % interval of every format's ratios together (5 x 5
on the laptop, t = 2.06, where one format's 5 gave t = 2.78 and one stalled copy of 25 set a
format's verdict: configs/default.yaml's `tuned` note); each format's median ratio must also be
under the line, which a format doing its own work in the foreground would miss. The further
snapshot copies an async repeat makes after its save is durable (`checkpoint.snapshot_passes`) stay
in the tables as context (`typical_*`), never in the verdict: training waits for the save's own
copy, however untypical.

Bandwidth vs ceiling: the ceiling is fio's (fio.py): sequential write + fsync of the state's size in
the save's directory, buffered and O_DIRECT where allowed, run before each sync point's saves and
again after them. A repeat is judged against the run's ceiling at its size: the fastest of those fio
moments over every format's sync point of that size in this run (tables.run_ceiling says why: fio's
moments moved far more than the saves did), so a slow moment can only lower a ratio. The claim is
judged per repeat: a save above its ceiling by more than its point's measured spread (the two
moments' disagreement) shows the ceiling is defective there, so that repeat reads not measured with
both bandwidths; the others are judged, per format on the 95 % interval of their ratios, and the
claim holds where some format's interval lies above the line (straddles where none does and one
crosses it). A format with a defective repeat cannot pass or straddle on its other repeats (the
same too-low ceiling would have raised them too); its fail stands, since a truer ceiling only
lowers ratios. Where fio is not installed the claim is not measured and says so.

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

FAILS, HOLDS = any_of([False]), any_of([True])  # the interval verdicts, as any_of returns them
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
    context = (f"; the {passes - 1} further snapshot copies of each async repeat, made once its save is "
               "durable, are context in tables/async_repeats.csv, not judged" if passes > 1 else "")
    statement = (f"{what} at the largest size ({n} parameters), for every configured format, judged on "
                 "each save's own stall: per repeat, the async save's blocking time (its own snapshot copy) "
                 "over the sync save's of the same format and repeat. The blocking path runs no format code "
                 "(the snapshot is copied into buffers allocated once; the format is written in the "
                 "background), so the stall is judged on every format's saves together: the "
                 f"{CONFIDENCE:.0%} interval of all these ratios (straddles where it crosses the line; with "
                 "fewer than 2 ratios, on the ratio of the medians); and each format's median ratio (its "
                 "typical save; without repeats its ratio of the medians) must be at or under the line, "
                 "so a format that blocks on its own work fails. Each format's own interval is shown, not "
                 f"judged{context}, {_on(device)}")
    if not {"sync", "async"} <= set(block["modes"]):
        return not_measured("async_blocking", statement, f"checkpoint.modes is {block['modes']}, "
                            "the claim compares sync with async", threshold=limit, device=device)
    holds, missing, ratios, per_repeat, pooled = {}, {}, {}, {}, []
    for f in block["formats"]:
        rows = {m: _at(one, f, m, n) for m in ("sync", "async")}
        absent = [m for m, r in rows.items() if r is None or not np.isfinite(r["blocking_s"])]
        if absent:
            missing[f] = "; ".join(why_point_missing(fails, "io", format=f, mode=m, ranks=1, n_params=n)
                                   for m in absent)
            continue
        ratios[f] = round(float(rows["async"]["blocking_s"] / rows["sync"]["blocking_s"]), 4)
        reps = _repeat_ratios(pairs, f, n)
        holds[f] = (float(reps.median()) if len(reps) else ratios[f]) <= limit  # the format's typical save
        pooled += [(f"{f} repeat {int(r)}", float(v)) for r, v in reps.items()]
        if len(reps) >= 2:
            per_repeat[f] = mean_interval(reps).evidence(4, keys=[f"repeat {int(r)}" for r in reps.index])
    every_save = {}
    if len(pooled) >= 2:
        iv = mean_interval([v for _, v in pooled])
        every_save = iv.evidence(4, keys=[k for k, _ in pooled])
        holds["every format's saves"] = below(iv, limit)
    return every("async_blocking", statement, holds, missing, n_params=int(n), state_mib=float(n * 4 / MiB),
                 async_over_sync=ratios, async_over_sync_every_save=every_save,
                 async_over_sync_per_repeat=per_repeat, threshold=limit, device=device)


def _claim_bandwidth(one: pd.DataFrame, block: dict, n: int, fails: pd.DataFrame,
                     device: str = "cpu", pairs: pd.DataFrame | None = None) -> dict:
    cid = "bandwidth_vs_ceiling"
    line = block["claims"]["bandwidth_min_ratio"]
    if device == "cuda":
        what = ("the best format's write bandwidth from GPU memory to durable bytes is within "
                f"{1 - line:.0%} of the D2H + storage ceiling (the same bytes copied from the GPU into "
                "pinned host memory right before / after each save, then fio's storage ceiling)")
    else:
        what = f"the best format's write bandwidth is within {1 - line:.0%} of the storage ceiling"
    statement = (f"{what} probed with fio around the saves (sequential write + fsync of the state's size in "
                 "the save's directory, buffered and O_DIRECT where allowed, the faster; run before each "
                 "format's saves and after them; the ceiling is the fastest of these probes at this size "
                 "in this run), at the largest size "
                 f"({n} parameters), judged per repeat: a save above its ceiling by more than the ceiling's "
                 "own spread (its point's two probes' disagreement) is a defect of the ceiling and reads not "
                 f"measured, the others are judged: some format's {CONFIDENCE:.0%} interval of its judged "
                 "repeats' ratios above the line where it has 2 or more (straddles where none is above and "
                 "one crosses it), else its one ratio; a format with a defective repeat cannot pass on the "
                 f"others, {_on(device)}")
    ceiling = CEILINGS.get(device, device)
    if "sync" not in block["modes"]:
        return not_measured(cid, statement, f"checkpoint.modes is {block['modes']}: no sync saves",
                            threshold=line, device=device)
    pairs = pd.DataFrame() if pairs is None else pairs
    ratios, spreads, missing, mb_s, holds, per_repeat, defects, unmeasured = {}, {}, {}, {}, {}, {}, {}, {}
    for f in block["formats"]:
        r = _at(one, f, "sync", n)
        if r is None:
            missing[f] = why_point_missing(fails, "io", format=f, mode="sync", ranks=1, n_params=n)
            continue
        items = _bandwidth_items(pairs, f, n, r)
        finite = [it for it in items if np.isfinite(it["ratio"])]
        if finite:  # the median repeat, against the ceiling its repeats are judged on
            ratios[f] = round(float(np.median([it["ratio"] for it in finite])), 4)
        mb_s[f] = {k: round(float(np.median([it["bw"][k] for it in finite if k in it["bw"]])), 1)
                   for k in BANDWIDTHS if any(k in it["bw"] for it in finite)} or _bandwidths(r)
        judged, beaten = {}, []
        for it in items:
            if not np.isfinite(it["ratio"]):
                unmeasured[f"{f} {it['key']}"] = it["error"] or "no ceiling in the table"
            elif it["ratio"] > 1 + it["spread"]:
                beaten.append(f"{f} writes at {it['ratio']:.2f}x of it{_mb_s(it['bw'])} in {it['key']}, "
                              f"above 1 + its spread {it['spread']:.3f}")
                defects[f"{f} {it['key']}"] = {"bw_over_ceiling": round(it["ratio"], 4), **it["bw"],
                                               "ceiling_spread": round(it["spread"], 4)}
            else:
                judged[it["key"]] = it["ratio"]
        spread = [it["spread"] for it in items if np.isfinite(it["ratio"])]
        if spread:
            spreads[f] = round(float(np.median(spread)), 4)
        defective = (f"the {ceiling} ceiling is defective where a save beats it by more than the ceiling's "
                     "own spread (fio before vs after the saves): " + "; ".join(beaten))
        if not judged:
            why = {unmeasured[f"{f} {it['key']}"] for it in items if f"{f} {it['key']}" in unmeasured}
            missing[f] = defective if beaten else "; ".join(sorted(why)) or "no sync repeats in the table"
            continue
        if len(judged) >= 2:
            iv = mean_interval(judged.values())
            per_repeat[f] = iv.evidence(4, keys=list(judged))
            verdict = above(iv, line)
        else:
            verdict = next(iter(judged.values())) >= line
        if beaten and any_of([verdict]) != FAILS:  # the same ceiling raised the judged repeats too
            missing[f] = defective
        else:
            holds[f] = verdict
    best = max(ratios, key=ratios.get) if ratios else None
    evidence = dict(n_params=int(n), best_format=best, best_bw_over_ceiling=ratios.get(best),
                    bw_over_ceiling=ratios, bw_over_ceiling_per_repeat=per_repeat, holds=holds,
                    median_mb_per_s=mb_s, ceiling_spread=spreads, defective_ceiling_repeats=defects,
                    repeats_without_ceiling=unmeasured, missing=missing, threshold=line, device=device,
                    ceiling=ceiling)
    verdict = any_of(holds.values())
    if missing and verdict != HOLDS:  # a format missing cannot undo a format's pass
        why = list(dict.fromkeys(missing.values()))
        return not_measured(cid, statement, why if len(why) == 1 and not holds  # e.g. fio not installed
                            else [f"{f}: {w}" for f, w in missing.items()], **evidence)
    return claim(cid, statement, verdict, **evidence)


BANDWIDTHS = {"write": "write_bw_bytes_per_s", "ceiling": "ceiling_bw_bytes_per_s"}  # io_cost's medians


def _bandwidths(row) -> dict:
    """{write, ceiling} in MB/s of a table row, where known."""
    return {k: round(float(row[c]) / 1e6, 1) for k, c in BANDWIDTHS.items()
            if c in row and pd.notna(row[c]) and np.isfinite(float(row[c]))}


def _bandwidth_items(pairs: pd.DataFrame, fmt: str, n: int, median: pd.Series) -> list[dict]:
    """The items the bandwidth claim judges for `fmt` at size `n`: each sync repeat of
    tables/bandwidth_repeats.csv (ratio, the ceiling's spread, both bandwidths, why no ceiling), else
    (tables without per-repeat rows) the point's medians from io_cost as one item."""
    def item(key: str, row) -> dict:
        ratio = float(row["bw_over_ceiling"]) if pd.notna(row.get("bw_over_ceiling")) else float("nan")
        spread = row.get("ceiling_spread", float("nan"))
        error = row.get("ceiling_error", "")
        return {"key": key, "ratio": ratio, "spread": float(spread) if pd.notna(spread) else 0.0,
                "bw": _bandwidths(row), "error": str(error) if pd.notna(error) else ""}

    if not pairs.empty and {"format", "n_params", "repeat", "bw_over_ceiling"} <= set(pairs):
        d = pairs[(pairs["format"] == fmt) & (pairs["n_params"] == n)].sort_values("repeat")
        if len(d):
            return [item(f"repeat {int(row['repeat'])}", row) for _, row in d.iterrows()]
    return [item("its median", median)]


def _mb_s(bw: dict) -> str:
    """' (write 2000 MB/s, ceiling 650 MB/s)' from a format's bandwidths, where known."""
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
