"""The GPU calibration: every item of hpcdl.studies.spatial.perfmodel.layouts timed on one device.

    python -m hpcdl spatial calibrate --config configs/paper.yaml --device cuda --out resources/calibration \\
        --budget-s 140
    python -m hpcdl spatial calibrate --config configs/paper.yaml --plan   # the items, the order, an estimate
    python -m hpcdl spatial calibrate --config configs/paper.yaml --plan --budget-s 135 \\
        --out resources/calibration   # ... and, from the table there, what is left, at its pace, in calls

What each item runs is in gpu_ops; the order in gpu_plan (first what makes every paper layout's
prediction computable, then the compute term's steps, then the papers' settings one at a time). Each
finished item's row is appended to <out>/<gpu slug>.csv at once (gpu_journal): a rerun of the same
command skips the items already there, so a run killed or stopped by --budget-s loses at most the item
in flight, and a budget-stopped run exits 0 with its table and provenance marked partial.

Per item: one untimed call (on a GPU with cudnn.benchmark on, as LBANN's autotuning does, cuDNN's
algorithm search for conv shapes not met before; its wall time is the row's search_s), then its repeats
back to back; the table keeps their median and spread (quartiles, min, max). Repeats are not
interleaved across items (as they were when every row was written at the end) because a row is only
final when its repeats are: timing them back to back keeps the loss on a kill to one item, and a drift
of clocks or temperature between items, which interleaving spread evenly, is instead measured: a fixed
reference matmul is timed after every item (ref_s), so a drift shows in the table instead of hiding in
it. TF32 is off: the papers' V100s ran FP32.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from hpcdl.studies.spatial.calibration import gpu_plan
from hpcdl.studies.spatial.calibration.gpu_journal import Journal
from hpcdl.studies.spatial.calibration.gpu_ops import Clock, Reference, time_item, warm_up
from hpcdl.studies.spatial.perfmodel import layouts
from hpcdl.studies.spatial.perfmodel.gpu_table import read_rows, sidecar, slug

PACE_AFTER = 3  # items measured before the estimate's scale to this device is trusted for the budget


# the item's own columns, in the table's order: (column, the item's keys for it, first found first,
# the default where it has none; None: the item must have it). A 3D item may say depth and height.
_ITEM_COLUMNS = (("id", ("id",), None), ("kind", ("kind",), None), ("key", ("key",), None),
                 ("network", ("network",), ""), ("axis", ("axis",), ""), ("d", ("d", "depth"), 0),
                 ("h", ("h", "height"), 0), ("w", ("w",), 0), ("batch", ("batch",), None),
                 ("units", ("units",), 0), ("flops", ("flops",), None), ("bytes", ("bytes",), None))


def _item_value(it: dict, keys: tuple, default):
    for key in keys:
        if key in it:
            return it[key]
    if default is None:
        raise KeyError(f"calibration item {it.get('id', '?')} has no {keys[0]!r}")
    return default


def _spread(total: np.ndarray) -> dict:
    """The median, quartiles and range of an item's repeated forward+backward times."""
    q25, q50, q75 = np.percentile(total, [25, 50, 75])
    return {"median_s": float(q50), "p25_s": float(q25), "p75_s": float(q75),
            "min_s": float(total.min()), "max_s": float(total.max()), "repeats": len(total)}


def _row(it: dict, search: float, times: list, ref: float, session: int) -> dict:
    t = np.asarray(times)
    row = {col: _item_value(it, keys, default) for col, keys, default in _ITEM_COLUMNS}
    row.update(fwd_median_s=float(np.median(t[:, 0])), bwd_median_s=float(np.median(t[:, 1])),
               **_spread(t.sum(axis=1)), search_s=search, ref_s=ref, session=session)
    return row


class _Progress:
    """A tqdm bar (one step per item) where stderr is a terminal; in a log, a line per tier and at most one
    every 10 s instead of a redrawn bar; nothing with HPCDL_PROGRESS=0 (as the task runtime's reports)."""

    def __init__(self, total: int, done: int):
        self.on = os.environ.get("HPCDL_PROGRESS", "1") != "0"
        self.total, self.n, self.tier, self.last = total, done, None, 0.0
        self.bar = None
        if self.on and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc="spatial-calibrate", unit="item", file=sys.stderr,
                            mininterval=0.5, dynamic_ncols=True)

    def step(self, tier: str, item_id: str, elapsed: float, search: float):
        self.n += 1
        if self.bar is not None:
            self.bar.set_postfix_str(f"{tier} {item_id}", refresh=False)
            self.bar.update(1)
        elif self.on and (tier != self.tier or time.monotonic() - self.last >= 10 or self.n == self.total):
            self.last = time.monotonic()
            print(f"[spatial-calibrate] {self.n}/{self.total} items (tier {tier}), {elapsed:.0f} s, "
                  f"{search:.1f} s of it first calls (search_s)", file=sys.stderr, flush=True)
        self.tier = tier

    def close(self):
        if self.bar is not None:
            self.bar.close()


def measure(todo, device: str, repeats: int, journal: Journal, session: int, budget_s=None, t0=None) -> dict:
    """Time the (tier, item)s in order, appending each row; stop before an item expected to end past
    budget_s seconds after t0 (expected: gpu_plan's estimate scaled by this run's measured/estimated
    ratio once PACE_AFTER items set it, before that only past the budget itself; at least one item per
    run, so that reruns always progress)."""
    dev = torch.device(device)
    t0 = time.perf_counter() if t0 is None else t0
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    clock = Clock(dev)
    warm_up(dev, clock)
    ref = Reference(dev, clock)
    est = gpu_plan.Estimator(repeats, cudnn=dev.type == "cuda")
    progress = _Progress(len(journal.rows) + len(todo), len(journal.rows))
    done = {"measured": 0, "search_s": 0.0, "stopped": "complete"}
    actual = expected = 0.0
    try:
        for tier, it in todo:
            timed, search = est(it)
            elapsed = time.perf_counter() - t0
            if budget_s is not None and done["measured"]:
                pace = actual / expected if done["measured"] >= PACE_AFTER else 0.0
                if elapsed + (timed + search) * pace >= budget_s:
                    done["stopped"] = "budget"
                    break
            start = time.perf_counter()
            s, times = time_item(it, dev, clock, repeats)
            journal.append(_row(it, s, times, ref.seconds(), session))
            actual += time.perf_counter() - start
            expected += timed + search
            done["measured"] += 1
            done["search_s"] += s
            progress.step(tier, it["id"], time.perf_counter() - t0, done["search_s"])
    finally:
        progress.close()
    return done


def provenance(device: str, command: str, repeats: int) -> dict:
    from hpcdl.platform import cpu_model, cuda_record, git_commit

    cuda = torch.device(device).type == "cuda"
    rec = cuda_record() if cuda else {}
    return {
        "gpu_model": rec.get("gpu_model") or f"cpu {cpu_model()}",
        "device": device,
        "driver": rec.get("driver", ""),
        "cuda": rec.get("cuda", ""),
        "cudnn": rec.get("cudnn", ""),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": command,
        "git_commit": git_commit(),
        "repeats": repeats,
        "tf32": False,
        "cudnn_benchmark": cuda,
        "cudnn_benchmark_limit": getattr(torch.backends.cudnn, "benchmark_limit", None) if cuda else None,
        "statistic": "median of an item's repeats, back to back after one untimed call (search_s)",
        "order": ("priority tiers " + ", ".join(gpu_plan.TIERS)
                  + " (hpcdl.studies.spatial.calibration.gpu_plan)"),
        "emulated": False,
    }


@dataclass
class Result:
    path: Path
    measured: int  # items in the table
    total: int
    this_run: int  # items this run measured
    wall_s: float
    search_s: float
    partial: bool
    unchanged: bool = False  # a finished table found there, left as it was


def calibrate(block: dict, device: str, out_dir, command: str, budget_s=None, fresh=False, log=None,
              t0=None) -> Result:
    """Measure the block's items not yet in <out_dir>/<gpu slug>.csv (all with fresh), in priority order,
    appending each row; then the table in order and its sidecar (partial where the budget stopped it)."""
    t0 = time.perf_counter() if t0 is None else t0
    order = gpu_plan.ordered(layouts.calibration_items(block))
    ids = [it["id"] for _, it in order]
    repeats = block["gpu_calibration"]["repeats"]
    meta = provenance(device, command, repeats)
    journal = Journal(Path(out_dir) / f"{slug(meta['gpu_model'])}.csv", meta, ids, fresh, log)
    session = len(journal.sessions)
    todo = [(tier, it) for tier, it in order if it["id"] not in journal.rows]
    if not todo and journal.previous.get("partial") is False:
        # nothing to measure: the finished table and its provenance stay as they are
        if log:
            log(f"complete: all {len(ids)} items already in {journal.path} (--fresh measures them again)")
        return Result(journal.path, len(ids), len(ids), 0, time.perf_counter() - t0, 0.0, False, True)
    meta |= {
        "items": len(ids),
        # the networks and settings measured: the compute-term check rebuilds its steps' layers from them
        "block": {k: block[k] for k in ("papers", "extrapolate", "machine", "gpu_calibration")},
    }
    entry = {"session": session, "date": meta["date"], "command": command, "git_commit": meta["git_commit"],
             "driver": meta["driver"]}
    # as a killed run leaves it: partial, this session interrupted
    journal.write_sidecar(meta | {"partial": True, "items_measured": len(journal.rows),
                                  "sessions": journal.sessions + [entry | {"stopped": "interrupted"}]})
    if log:
        budget = f", budget {budget_s:g} s" if budget_s is not None else ""
        log(f"{len(todo)} of {len(ids)} items to measure on {meta['gpu_model']}{budget}; each row is "
            f"appended to {journal.path} as it finishes")
    done = measure(todo, device, repeats, journal, session, budget_s, t0) if todo else {
        "measured": 0, "search_s": 0.0, "stopped": "complete"}
    wall = time.perf_counter() - t0
    partial = len(journal.rows) < len(ids)
    sessions = journal.sessions + [entry | {"measured": done["measured"], "wall_s": wall,
                                            "search_s": done["search_s"], "stopped": done["stopped"]}]
    journal.finish(ids, meta | {"partial": partial, "items_measured": len(journal.rows), "wall_s": wall,
                                "sessions": sessions})
    n = len(journal.rows)
    return Result(journal.path, n, len(ids), done["measured"], wall, done["search_s"], partial)


def run(block: dict, device: str, out_dir: str | Path, command: str, log=None, budget_s=None) -> Path:
    """Measure every item of the block's papers (resuming a table there), write <out_dir>/<gpu slug>.csv +
    its sidecar; the path."""
    return calibrate(block, device, out_dir, command, budget_s=budget_s, log=log).path


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return v


CALL_BUDGET_S = 135.0  # make gpu's calibrate step: 150 s, less 15 s for the call's own start and records


def _plan(items: list[dict], repeats: int, budget_s, table: Path | None = None) -> int:
    p = gpu_plan.plan(items, repeats, budget_s)
    kinds = pd.Series([it["kind"] for it in items]).value_counts().to_dict()
    out = {"items": len(items), "by_kind": kinds, "repeats": repeats, **p}
    left = None
    if table is not None and table.exists() and sidecar(table).exists():
        meta = json.loads(sidecar(table).read_text())
        rows = read_rows(table).to_dict("records")
        left = gpu_plan.remaining(items, rows, repeats, meta.get("sessions"), budget_s or CALL_BUDGET_S)
        out["remaining"] = {"table": str(table), **left}
    print(json.dumps(out, indent=1))
    print(f"plan: {len(items)} items, about {p['estimated_total_s']:g} s on an H100 SXM, of which "
          f"{p['estimated_search_s']:g} s cuDNN's algorithm search over {p['conv_shapes_searched']} conv "
          "shapes (an estimate: gpu_plan)", file=sys.stderr)
    if left is not None:
        print(f"plan: {table} holds {left['items_measured']} of them; the {left['items_left']} left take "
              f"about {left['estimated_s']:g} s at that table's pace, {left['calls']} call(s) of "
              f"{left['call_budget_s']:g} s (an estimate: gpu_plan.remaining)", file=sys.stderr)
    return 0


def _table_in(out: Path) -> Path | None:
    """The one calibration table in `out` (None where there is none, or several)."""
    found = sorted(out.glob("*.csv")) if out.is_dir() else []
    return found[0] if len(found) == 1 else None


def main(argv: list[str]) -> int:
    from hpcdl.platform import ConfigError, load_config

    t0 = time.perf_counter()
    ap = argparse.ArgumentParser(
        prog="python -m hpcdl spatial calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--config", default="configs/paper.yaml")
    ap.add_argument("--device", default="cuda", help="cuda (the calibration) or cpu (toy configs, tests)")
    ap.add_argument("--out", default=None, help="directory (default <data.resources_dir>/calibration)")
    ap.add_argument("--plan", action="store_true", help="list the order and an estimated time only (with a "
                    "table in --out: what is left, at its pace, in calls of --budget-s)")
    ap.add_argument("--budget-s", type=_seconds, default=None, metavar="S",
                    help="stop before S seconds with what is measured (marked partial; rerun to resume)")
    ap.add_argument("--fresh", action="store_true", help="measure every item again (drop the table there)")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config)
        block = cfg["spatial"]
        items = layouts.calibration_items(block)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or Path(cfg["data"]["resources_dir"]) / "calibration")
    if args.plan:
        return _plan(items, block["gpu_calibration"]["repeats"], args.budget_s, _table_in(out))
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda: torch sees no CUDA GPU here", file=sys.stderr)
        return 2
    command = shlex.join(["python", "-m", "hpcdl", "spatial", "calibrate", *argv])
    log = lambda m: print(f"[spatial-calibrate] {m}", file=sys.stderr, flush=True)  # noqa: E731
    res = calibrate(block, args.device, out, command, args.budget_s, args.fresh, log, t0)
    this = (f"this run measured {res.this_run} in {res.wall_s:.0f} s, {res.search_s:.1f} s of it in first "
            "calls: cuDNN's search on CUDA")
    if res.partial:
        log(f"partial: {res.measured} of {res.total} items measured ({this}; stopped by --budget-s "
            f"{args.budget_s:g}); to measure the remaining {res.total - res.measured}, rerun `{command}`: "
            f"the items already in {res.path} are kept")
    elif not res.unchanged:
        log(f"complete: {res.total} items in {res.path} ({this})")
    print(res.path)
    return 0
