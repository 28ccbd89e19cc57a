"""The GPU calibration's table kept as a journal: a row appended (flushed, fsynced) as each item finishes.

A run opens <out>/<gpu slug>.csv: the rows of an earlier run with the same device, GPU model, torch,
CUDA and cuDNN versions, repeats and settings are kept (keyed by the item's id, so their order and the
config's other items do not matter), the table is rewritten atomically with them alone (which also drops
a last line half-written by a killed run, before anything is appended after it), and only the items not
in it are measured. Anything else there (another setting, an older table's columns, --fresh) is
replaced, and the run says why. The sidecar is written when the run starts, marked partial, and
rewritten when it ends (complete, or partial where the budget stopped it): a killed run leaves it
partial. A reader counts the rows itself (gpu_table.read_rows).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import torch

from hpcdl.platform import atomic_write_json, atomic_write_text
from hpcdl.studies.spatial.perfmodel.gpu_table import COLUMNS, read_rows, sidecar

# what must match for an earlier run's rows to stand beside this run's
IDENTITY = ("device", "gpu_model", "torch", "cuda", "cudnn", "repeats", "tf32", "cudnn_benchmark")


def identity(meta: dict) -> dict:
    out = {k: meta.get(k) for k in IDENTITY}
    out["device"] = torch.device(out["device"]).type if out["device"] else None
    return out


def _line(row: dict) -> str:
    return pd.DataFrame([row], columns=COLUMNS).to_csv(index=False, header=False)


class Journal:
    """The rows of one calibration table, as kept from an earlier run and appended by this one."""

    def __init__(self, path: str | Path, meta: dict, ids: list[str], fresh: bool = False, log=None):
        self.path = Path(path)
        self.rows: dict[str, dict] = {}
        self.sessions: list[dict] = []
        self.previous: dict = {}  # the kept table's provenance
        why = "--fresh" if fresh else self._resume(meta, set(ids))
        if why and (self.path.exists() or sidecar(self.path).exists()):
            if log:
                log(f"{self.path}: starting over ({why})")
            self.rows, self.sessions, self.previous = {}, [], {}
        elif self.rows and log:
            log(f"{self.path}: resuming, {len(self.rows)} of {len(ids)} items already measured")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, self.frame(ids).to_csv(index=False))

    def _resume(self, meta: dict, ids: set[str]) -> str | None:
        """Load an earlier run's rows; None if kept (or there were none), else why they are not."""
        side = sidecar(self.path)
        if not self.path.exists():
            return None
        if not side.exists():
            return f"no provenance sidecar {side.name}"
        try:
            old = json.loads(side.read_text())
            rows = read_rows(self.path)
        except (ValueError, pd.errors.ParserError) as exc:
            return f"unreadable: {exc}"
        if list(rows.columns) != COLUMNS:
            return "its columns are not this version's"
        was, now = identity(old), identity(meta)
        diff = [f"{k} {was[k]!r} -> {now[k]!r}" for k in IDENTITY if was[k] != now[k]]
        if diff:
            return "measured under other settings: " + ", ".join(diff)
        rows = rows.astype(object).where(rows.notna(), "")
        self.rows = {r["id"]: r for r in rows.to_dict("records") if r["id"] in ids}
        self.sessions, self.previous = list(old.get("sessions", [])), old
        return None

    def frame(self, ids: list[str]) -> pd.DataFrame:
        """The rows in the calibration's order (ids)."""
        return pd.DataFrame([self.rows[i] for i in ids if i in self.rows], columns=COLUMNS)

    def append(self, row: dict) -> None:
        """One finished item: its line written, flushed and fsynced before the next item starts."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(_line(row))
            f.flush()
            os.fsync(f.fileno())
        self.rows[row["id"]] = row

    def write_sidecar(self, meta: dict) -> None:
        atomic_write_json(sidecar(self.path), meta)

    def finish(self, ids: list[str], meta: dict) -> None:
        """The table rewritten atomically in the calibration's order, then its sidecar."""
        atomic_write_text(self.path, self.frame(ids).to_csv(index=False))
        self.write_sidecar(meta)
