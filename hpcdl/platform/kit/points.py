"""The point store: every sweep point's record, kept the moment its task finishes
(docs/architecture.md, "Points").

A task app's main program plans each sweep through a `StudyRun`: points whose record is in the
store are reused, the others are submitted with a `Slot`, and the task body runs its one hpcdl call
through `slot.run(fn, ...)`, which writes the record itself (temp file + rename) before returning.
So a kill of the main program (or of Snakemake above it) loses nothing a worker finished, on the
local backend and under COMPSs alike (the results directory is on the file system workers share).

Layout, under `<results_dir>/<study>/points/`:

    <key>.json                 {"key", "study", "task", "status": "ok" | "failed", "result" |
                                "error" + "traceback", "session", "started", "finished", "inputs"}
    started/<session>/<key>    an empty file per execution: which points ran in which session

Key: sha256 of (study, task name, the point's inputs), where the inputs are what the task body
receives and its result depends on. Each app passes exactly that: the checkpoint and shuffle
points are self-contained dicts; the spatial tasks receive the part of the `spatial:` block their
unit of work reads (hpcdl.studies.spatial.sweep.*_block), never the whole block. So a grown or shrunk sweep
list, or a key only the analysis reads, recomputes nothing, and a changed parameter recomputes
exactly the points that receive it. Settings that only bound waiting (any key ending in
`timeout_s`) are left out of the key: they decide whether a point finishes, not what it measures.
The key does not cover the code: after changing what a study computes, delete its `points/`.

Records are JSON (the task results are plain rows of numbers and strings; numpy scalars are
converted, anything else is refused so that the point fails naming the type). A fresh result is
handed back as it reads back from its JSON, so fresh and reused points give identical rows.

A failed point is stored as failed and run again by the next run; with HPCDL_KEEP_FAILED=1 a
stored failure is final and reused as a failed row.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from hpcdl.platform.kit.atomic import atomic_write_bytes, atomic_write_json
from hpcdl.platform.kit.config import study_dir
from hpcdl.platform.kit.results import config_hash
from hpcdl.platform.kit.study_dir import RUN_SUMMARY, StudyDir

KEEP_FAILED_ENV = "HPCDL_KEEP_FAILED"
SUMMARY_KEYS = ("ok", "failed", "skipped", "total")
ERROR_TAIL = 2000  # characters of a failure kept in a table row (the traceback's end names the error)
_VOLATILE = re.compile(r"timeout_s$")


def _key_form(obj):
    """The inputs as hashed: dict keys that only bound waiting dropped, at any depth."""
    if isinstance(obj, dict):
        return {k: _key_form(v) for k, v in obj.items() if not _VOLATILE.search(str(k))}
    if isinstance(obj, list | tuple):
        return [_key_form(v) for v in obj]
    return obj


def point_key(study: str, task: str, inputs) -> str:
    return config_hash({"study": study, "task": task, "inputs": _key_form(inputs)})[:32]


def _plain(obj):
    """json.dumps default: numpy scalars and paths; anything else is not a record value."""
    if isinstance(obj, Path):
        return str(obj)
    if type(obj).__module__ == "numpy" and hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    raise TypeError(f"a point record holds plain data (dicts, lists, strings, numbers); "
                    f"got {type(obj).__module__}.{type(obj).__name__}")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _write_record(root: Path, record: dict) -> dict:
    """Write atomically; return the record as it reads back (what a reused point will give)."""
    text = json.dumps(record, default=_plain)
    atomic_write_bytes(root / f"{record['key']}.json", text.encode("utf-8"))
    return json.loads(text)


def read_record(root: str | Path, key: str) -> dict | None:
    """The stored record for `key`, or None: missing, unreadable or not this key's (then it is rerun)."""
    path = Path(root) / f"{key}.json"
    try:
        rec = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        print(f"[points] ignoring unreadable record {path}: {exc}", file=sys.stderr, flush=True)
        return None
    if not isinstance(rec, dict) or rec.get("key") != key or rec.get("status") not in ("ok", "failed"):
        print(f"[points] ignoring record {path}: not a record of key {key}", file=sys.stderr, flush=True)
        return None
    return rec


@dataclass(frozen=True)
class Slot:
    """Where one point's record goes. Small and picklable: it travels with the task to its worker."""

    root: str
    study: str
    task: str
    key: str
    session: str
    inputs: Any = None

    def run(self, fn: Callable, *args, **kwargs):
        """Call fn, store its result (or its failure, then re-raise) and return the stored result."""
        root = Path(self.root)
        marker = root / "started" / self.session / self.key
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        base = {"key": self.key, "study": self.study, "task": self.task, "session": self.session,
                "started": _now()}
        try:
            result = fn(*args, **kwargs)
            return _write_record(root, {**base, "status": "ok", "finished": _now(), "result": result,
                                        "inputs": _key_form(self.inputs)})["result"]
        except Exception as exc:  # a kill (SIGKILL, KeyboardInterrupt) leaves no record: rerun
            self.fail(f"{type(exc).__name__}: {exc}", base, traceback.format_exc())
            raise

    def fail(self, error: str, base: dict | None = None, trace: str = "") -> None:
        base = base or {"key": self.key, "study": self.study, "task": self.task, "session": self.session}
        _write_record(Path(self.root), {**base, "status": "failed", "finished": _now(), "error": error,
                                        "traceback": trace, "inputs": _key_form(self.inputs)})


@dataclass
class Outcome:
    """A point's result in this run: computed now, or reused from the store (`reused`)."""

    point: Any
    ok: bool
    result: Any = None
    error: str = ""
    reused: bool = False


@dataclass
class _Entry:
    point: Any
    slot: Slot
    stored: dict | None
    why: str  # new | reuse | retry (failed before) | interrupted (started before, never finished)
    future: Any = None


@dataclass
class Batch:
    """One sweep's points as planned: stored ones to reuse, the rest submitted."""

    task: str
    entries: list[_Entry] = field(default_factory=list)


def failed_row(label: dict, error: str | None) -> dict:
    """The one shape of a failed point's table row: its labels, status=failed and its error.

    A long error (a RankFailure carries every rank's traceback) keeps its head, which names the
    exception, and its tail, where the failing rank's own error is.
    """
    error = error or "task failed without a reason"
    if len(error) > ERROR_TAIL:
        error = error[:ERROR_TAIL // 4] + "\n[...]\n" + error[-(ERROR_TAIL - ERROR_TAIL // 4):]
    return {**label, "status": "failed", "error": error}


def _keep_failed_from_env() -> bool:
    value = os.environ.get(KEEP_FAILED_ENV, "0").strip().lower()
    if value not in ("", "0", "1", "false", "true", "no", "yes"):
        raise ValueError(f"environment variable {KEEP_FAILED_ENV}={value!r}: use 1 (stored failures are "
                         "final) or 0 (failed points run again, the default)")
    return value in ("1", "true", "yes")


class StudyRun:
    """One run of a task app, the object `start_app` returns: its config, the device it resolved once,
    its run folder (`files`, a StudyDir: raw tables, claims, about page, logs), its start time, its
    session id, its point store and its counts."""

    def __init__(self, cfg: dict, study: str, keep_failed: bool | None = None, device: str | None = None,
                 wait: Callable | None = None, reason: Callable | None = None):
        self.started = time.time()  # the start time every table of this run records
        self.cfg, self.study = cfg, study
        self.dir = study_dir(cfg, study)  # absolute: COMPSs runs tasks in a sandbox directory
        self.files = StudyDir(self.dir)
        self.root = self.dir / "points"
        stamp = datetime.fromtimestamp(self.started, UTC).strftime("%Y%m%dT%H%M%S")
        self.session = f"{stamp}-{os.getpid()}"
        self.keep_failed = _keep_failed_from_env() if keep_failed is None else keep_failed
        self.counts = {"ok": 0, "failed": 0, "skipped": 0}
        self._started_before: set[str] | None = None
        self._resolved = device  # start_app's: the device is resolved once, where the app starts
        # the task runtime's compss_wait_on and failure_reason (start_app's), the defaults of gather/one
        self.wait, self.reason = wait, reason

    @property
    def raw(self) -> Path:
        """raw/, where the task app writes its tables."""
        return self.files.raw

    @cached_property
    def device(self) -> str:
        """cpu or cuda, recorded in raw/device.json, which every table and figure of the run reads back:
        the one start_app resolved, else resolved here (a ConfigError for `cuda` without a GPU)."""
        from hpcdl.platform.kit.device import device_record, requested, resolve
        from hpcdl.platform.kit.study import registered

        if self.study in registered():
            record = device_record(self.cfg, self.study, self._resolved)
        else:  # a point store outside the registry (a test's): no declared devices to resolve among
            want = requested(self.cfg, self.study)
            record = {"device_requested": want,
                      "device": self._resolved or resolve(want, f"{self.study}.device")}
        return self.files.record_device(record)["device"]

    def log(self, msg: str) -> None:
        print(f"[{self.study}] {msg}", file=sys.stderr, flush=True)

    def plan(self, task: str, points: Iterable, inputs: Callable = lambda p: p) -> Batch:
        """Look every point up in the store; `inputs(point)` is what its key covers."""
        batch = Batch(task)
        for p in points:
            inp = inputs(p)
            key = point_key(self.study, task, inp)
            slot = Slot(str(self.root), self.study, task, key, self.session, inp)
            rec = read_record(self.root, key)
            why = "new" if rec is None else "reuse"
            if rec is None and key in self._earlier():
                why = "interrupted"
            elif rec is not None and rec["status"] == "failed" and not self.keep_failed:
                rec, why = None, "retry"
            batch.entries.append(_Entry(p, slot, rec, why))
        return batch

    def _earlier(self) -> set[str]:
        """Keys that started executing in some earlier session (read once per run)."""
        if self._started_before is None:
            self._started_before = set(executions(self.root))
        return self._started_before

    def submit(self, task: str, points: Iterable, submit: Callable, inputs: Callable = lambda p: p,
               quiet: bool = False) -> Batch:
        """Plan, then call submit(point, slot) for every point not reused (it returns the task's future)."""
        batch = self.plan(task, points, inputs)
        todo = [e for e in batch.entries if e.stored is None]
        if not quiet and (len(todo) < len(batch.entries) or any(e.why != "new" for e in todo)):
            why = [f"{sum(e.why == w for e in todo)} {text}" for w, text in
                   (("retry", "failed before"), ("interrupted", "interrupted in an earlier run"))
                   if any(e.why == w for e in todo)]
            self.log(f"{task}: {len(batch.entries) - len(todo)} of {len(batch.entries)} point(s) reused "
                     f"from {self.root}; {len(todo)} to run" + (f" ({', '.join(why)})" if why else ""))
        for e in todo:
            e.future = submit(e.point, e.slot)
        return batch

    def gather(self, batches: list[Batch], wait: Callable | None = None,
               reason: Callable | None = None) -> list[list[Outcome]]:
        """Wait for every submitted point (one wait, so they run together); one Outcome list per batch.
        `wait` and `reason` default to the task runtime's the run was started with (start_app)."""
        wait, reason = wait or self.wait, reason or self.reason
        if wait is None or reason is None:
            raise TypeError("gather needs the task runtime's wait and reason: pass them, or start the run "
                            "with start_app")
        pending = [e for b in batches for e in b.entries if e.stored is None]
        values = wait([e.future for e in pending]) if pending else []
        got = {id(e): v for e, v in zip(pending, values, strict=True)}
        out = []
        for b in batches:
            outcomes = []
            for e in b.entries:
                if e.stored is not None:
                    o = self._reused(e)
                elif got[id(e)] is not None:
                    o = Outcome(e.point, True, got[id(e)])
                    self.counts["ok"] += 1
                else:
                    o = self._failed(e, reason(e.future))
                outcomes.append(o)
            out.append(outcomes)
        return out

    def one(self, task: str, point, submit: Callable, wait: Callable | None = None,
            reason: Callable | None = None, inputs: Callable = lambda p: p) -> Outcome:
        """A point on its own (the main program waits for it before going on)."""
        return self.gather([self.submit(task, [point], submit, inputs, quiet=True)], wait, reason)[0][0]

    def _reused(self, e: _Entry) -> Outcome:
        if e.stored["status"] == "ok":
            self.counts["skipped"] += 1
            return Outcome(e.point, True, e.stored["result"], reused=True)
        self.counts["failed"] += 1
        return Outcome(e.point, False, error=e.stored.get("error", ""), reused=True)

    def _failed(self, e: _Entry, runtime_reason: str | None) -> Outcome:
        self.counts["failed"] += 1
        rec = read_record(self.root, e.slot.key)
        if rec is not None and rec["status"] == "failed" and rec.get("session") == self.session:
            error = rec["error"]  # the task body's own traceback (COMPSs gives the main program none)
        else:  # the body never got to write (its worker died): store the failure here
            error = runtime_reason or "task returned no result"
            e.slot.fail(error)
        return Outcome(e.point, False, error=error)

    def summary(self) -> dict:
        c = self.counts
        return {"ok": c["ok"], "failed": c["failed"], "skipped": c["skipped"],
                "total": c["ok"] + c["failed"] + c["skipped"]}

    def write_summary(self, counts: dict | None = None) -> Path:
        """`raw/run_summary.json`: points ok / failed (now or kept) / skipped (reused) / total, atomically."""
        summary = self.summary() if counts is None else {k: int(counts[k]) for k in SUMMARY_KEYS}
        _ = self.device  # raw/device.json: as the summary, a declared output of every run
        if summary["total"] != summary["ok"] + summary["failed"] + summary["skipped"]:
            raise ValueError(f"run summary does not add up: {summary}")
        self.log(f"points: {summary['ok']} ok, {summary['failed']} failed, "
                 f"{summary['skipped']} finished in an earlier run and reused")
        return atomic_write_json(self.raw / RUN_SUMMARY, summary)


def executions(root: str | Path) -> dict[str, list[str]]:
    """{key: [session, ...]}: every session in which each point started executing."""
    runs: dict[str, list[str]] = {}
    started = Path(root) / "started"
    for session in sorted(started.iterdir()) if started.is_dir() else []:
        for marker in session.iterdir():
            runs.setdefault(marker.name, []).append(session.name)
    return runs


