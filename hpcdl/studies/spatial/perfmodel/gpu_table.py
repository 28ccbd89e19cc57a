"""A GPU calibration as data (resources/calibration/<gpu>.csv + .provenance.json) and how the oracle reads it.

A row per item of hpcdl.studies.spatial.perfmodel.layouts (its `id`), with the median forward + backward
seconds over the item's repeats and their spread, the seconds of its first, untimed call (search_s: on
CUDA cuDNN's algorithm search for a conv shape not met before) and a fixed reference op timed after it
(ref_s: clock drift over the run). The calibration appends rows as items finish, so a table may be
partial (its sidecar's "partial": true, or a run killed before it ended): a reader drops a half-written
last line, and an item not measured yet follows the rules below like any other. The oracle asks for
the item a layer of a layout is; an item the table lacks is interpolated linearly in its local planes
(d x h) between the nearest measured items of the same layer (same kind, key, batch, axis) below and
above, and counted as interpolated; with no measured neighbour on one side it is refused
(CalibrationGap, which names a partial table and how to finish it), never extrapolated.

From the calibrated GPU to another (the papers' V100), each time is scaled by one stated rule from
datasheet figures (spatial.gpu_calibration.datasheets): an item whose arithmetic intensity (its FLOPs
over the bytes it must move at least, slabs.layer_item) is at or above the calibrated GPU's ridge point
(peak FLOP/s / memory bandwidth) uses a larger share of that GPU's peak FLOP/s than of its bandwidth
(the same comparison made on the measured time's achieved rates), so its time scales with the ratio of
the two GPUs' FP32 peaks; every other item (pools, halo copies, the optimizer) with the ratio of their
memory bandwidths; a face copy (device <-> pinned host) with the ratio of their host links
(`host_link_gbs`, one direction; memory bandwidth where a datasheet lacks it).

The fixed costs (slabs.fixed_items, spatial.gpu_calibration.fixed_cost: measured): every item's time
holds its kind's fixed cost as timed alone (launches, the autograd engine's start, the allocator, the
wait for a synchronised GPU), which a whole step pays differently, its layers issued back to back while
the GPU works. So a layer inside a step is priced as its own work, the item's time less its kind's
`alone` fixed cost (mapped like the item), and at least its kind's `chained` fixed cost, a minimal layer's
share of a chain of them issued as a step issues its layers: max(item - alone, chained). The host's part
is not mapped to another GPU (ASSUMPTION: the target's hosts issue layers as fast as the calibrating one).
A table without the fixed-cost rows prices every layer as its item (and says so).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pandas as pd

from hpcdl.common.layers import layer_key
from hpcdl.studies.spatial.perfmodel import slabs

COLUMNS = [
    "id",
    "kind",
    "key",
    "network",
    "axis",
    "d",
    "h",
    "w",
    "batch",
    "units",
    "flops",
    "bytes",
    "fwd_median_s",
    "bwd_median_s",
    "median_s",
    "p25_s",
    "p75_s",
    "min_s",
    "max_s",
    "repeats",
    "search_s",
    "ref_s",
    "session",
]


class CalibrationGap(ValueError):
    """An item the calibration neither measured nor brackets with measured neighbours."""


def slug(gpu_model: str) -> str:
    """The calibration file's name for a GPU model ("NVIDIA H100 80GB HBM3" -> nvidia-h100-80gb-hbm3)."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_model.lower()).strip("-")


def sidecar(path: Path) -> Path:
    return path.with_suffix(".provenance.json")


def read_rows(path: str | Path) -> pd.DataFrame:
    """A calibration table as the calibration left it: a last line without its newline (a run killed while
    appending it) is dropped, and an id met twice keeps its first row."""
    text = Path(path).read_text()
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    if not text.strip():
        return pd.DataFrame(columns=COLUMNS)
    rows = pd.read_csv(io.StringIO(text))
    return rows.drop_duplicates("id") if "id" in rows else rows


class GpuCalibration:
    def __init__(self, rows: pd.DataFrame, meta: dict, path: Path | None = None):
        missing = [c for c in ("id", "kind", "key", "median_s") if c not in rows]
        if missing:
            raise ValueError(f"{path or 'calibration'}: missing column(s) {missing}")
        self.rows, self.meta, self.path = rows, meta, path
        self.by_id = {r["id"]: r for r in rows.to_dict("records")}
        self.gpu_model = meta.get("gpu_model", "")
        if not self.gpu_model:
            raise ValueError(f"{sidecar(path) if path else 'calibration'}: no gpu_model in the provenance")
        # a run stopped by its budget says so; a killed one left "partial" from its start
        self.partial = bool(meta.get("partial", False))
        self.measured_items = len(self.by_id)
        self.total_items = int(meta.get("items", self.measured_items))

    def status(self) -> str:
        """Empty for a complete calibration, else what a partial one holds and how to finish it."""
        if not self.partial:
            return ""
        return (
            f"partial calibration: {self.measured_items} of {self.total_items} items measured; rerun "
            "`python -m hpcdl spatial calibrate` with the same --config, --device and --out to finish it"
        )

    @classmethod
    def read(cls, path: str | Path) -> GpuCalibration:
        path = Path(path)
        side = sidecar(path)
        if not side.exists():
            raise FileNotFoundError(f"{path}: calibration without its provenance sidecar {side.name}")
        return cls(read_rows(path), json.loads(side.read_text()), path)

    def seconds(self, item: dict) -> tuple[float, str]:
        """(median seconds, "measured" | "interpolated") of a slabs item; CalibrationGap where neither."""
        row = self.by_id.get(item["id"])
        if row is not None:
            return float(row["median_s"]), "measured"
        kind = item["kind"]
        if kind == "optimizer":
            same = [r for r in self.by_id.values() if r["kind"] == "optimizer"]
            x = float(item["units"])
            pts = sorted((float(r["units"]), float(r["median_s"])) for r in same)
            exact = [t for u, t in pts if u == x]
            if exact:  # the same parameter count (the network's own): measured
                return exact[0], "measured"
        else:
            same = [
                r
                for r in self.by_id.values()
                if r["kind"] == kind
                and r["key"] == item["key"]
                and int(r["batch"]) == item["batch"]
                and (kind not in ("halo", "face") or r["axis"] == item["axis"])
            ]
            x = float(item["d"] * item["h"])
            pts = sorted((float(r["d"] * r["h"]), float(r["median_s"])) for r in same)
        lo = [p for p in pts if p[0] <= x]
        hi = [p for p in pts if p[0] >= x]
        if not lo or not hi:
            have = ", ".join(f"{p[0]:g}" for p in pts) or "none"
            fix = self.status() or "rerun the calibration with this layout"
            raise CalibrationGap(
                f"{self.path or 'calibration'}: {item['id']} is not measured and has no measured "
                f"neighbour on both sides (measured sizes of this layer: {have}); "
                f"extrapolation refused: {fix}"
            )
        (x0, y0), (x1, y1) = lo[-1], hi[0]
        t = y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return t, "interpolated"


def datasheet(sheets: dict, gpu_model: str, key: str = "spatial.gpu_calibration.datasheets") -> dict:
    name = slug(gpu_model)
    if name not in sheets:
        raise ValueError(
            f"{key} has no entry {name!r} (the calibrated GPU {gpu_model!r}): add its FP32 peak "
            "TFLOP/s, memory GB/s and GB from its datasheet, with the source"
        )
    return sheets[name]


def bound(item: dict, sheet: dict) -> str:
    """ "flops" where the item's arithmetic intensity reaches the GPU's ridge point, else "memory"."""
    if item.get("flops", 0) <= 0 or item.get("bytes", 0) <= 0:
        return "memory"
    ridge = sheet["peak_tflops"] * 1e12 / (sheet["memory_gbs"] * 1e9)
    return "flops" if item["flops"] / item["bytes"] >= ridge else "memory"


MAPPINGS = ("roofline", "flops", "memory")


def scale(item: dict, source: dict, target: dict, mode: str = "roofline") -> float:
    """Factor from a time on the `source` GPU to the `target` GPU: the module's rule ("roofline"), or every
    item by the FP32 peaks ("flops") or by the memory bandwidths ("memory"), the rule's two bounds; a face
    copy by the host links in every mode."""
    if mode not in MAPPINGS:
        raise ValueError(f"spatial.gpu_calibration.mapping must be one of {MAPPINGS}, got {mode!r}")
    if item.get("kind") == "face" and source.get("host_link_gbs") and target.get("host_link_gbs"):
        return source["host_link_gbs"] / target["host_link_gbs"]
    if mode == "flops" or (mode == "roofline" and bound(item, source) == "flops"):
        return source["peak_tflops"] / target["peak_tflops"]
    return source["memory_gbs"] / target["memory_gbs"]


FIXED_COSTS = ("measured", "none")


class Measured:
    """Compute times for the oracle (Machine.measured) from a calibration, on the calibrated GPU or mapped
    to `target` (a datasheet dict; None: the calibrated GPU itself), with the fixed costs as `fixed` says
    (module docstring). Counts the items it read and what it interpolated."""

    def __init__(self, cal: GpuCalibration, source: dict, target: dict | None = None, mode: str = "roofline",
                 fixed: str = "measured"):
        if fixed not in FIXED_COSTS:
            raise ValueError(f"spatial.gpu_calibration.fixed_cost must be one of {FIXED_COSTS}, "
                             f"got {fixed!r}")
        self.cal, self.source, self.target, self.mode, self.fixed = cal, source, target, mode, fixed
        self.interpolated: set[str] = set()
        self.used: set[str] = set()
        self.fixed_missing: set[str] = set()  # kinds whose fixed-cost rows the table lacks
        self.face_missing: set[str] = set()  # layers whose face copies a partial table cannot price yet

    def reset(self) -> None:
        self.interpolated.clear()
        self.used.clear()

    def counts(self) -> dict:
        """Items read since the last reset: measured, interpolated."""
        return {"measured_items": len(self.used - self.interpolated),
                "interpolated_items": len(self.interpolated)}

    def _scale(self, item: dict) -> float:
        return scale(item, self.source, self.target, self.mode) if self.target else 1.0

    def _raw(self, item: dict) -> float:
        t, how = self.cal.seconds(item)
        self.used.add(item["id"])
        if how == "interpolated":
            self.interpolated.add(item["id"])
        return t

    def _t(self, item: dict) -> float:
        """The item's time as measured (mapped), its fixed cost included."""
        return self._raw(item) * self._scale(item)

    def fixed_cost(self, kind: str) -> tuple[float, float] | None:
        """(alone, chained) seconds of a kind's fixed cost ("conv", ..., "optimizer:<network>"), or None
        where they are not used (fixed_cost: none) or not measured."""
        if self.fixed == "none":
            return None
        rows = [self.cal.by_id.get(slabs.fixed_id(kind, m)) for m in ("alone", "chained")]
        if any(r is None for r in rows):
            self.fixed_missing.add(kind)
            return None
        for m in ("alone", "chained"):
            self.used.add(slabs.fixed_id(kind, m))
        return float(rows[0]["median_s"]), float(rows[1]["median_s"])

    def in_step(self, item: dict, kind: str | None = None) -> float:
        """A compute item's seconds inside a step: max(item - its kind's alone fixed cost (mapped like the
        item), the kind's chained fixed cost); the item as measured where the fixed costs are not used."""
        raw = self._raw(item)
        fc = self.fixed_cost(kind or item["kind"])
        if fc is None:
            return raw * self._scale(item)
        alone, chained = fc
        return max((raw - alone) * self._scale(item), chained)

    def layer(self, L: dict, pd: int, ph: int, batch: int) -> float:
        return self.in_step(slabs.layer_item(L, pd, ph, batch))

    def halo(self, L: dict, pd: int, ph: int, batch: int) -> dict:
        """Seconds of one side's pack + unpack per split axis ({"d": s, "h": s})."""
        return {it["axis"]: self._t(it) for it in slabs.halo_items(L, pd, ph, batch)}

    def face(self, L: dict, pd: int, ph: int, batch: int) -> dict:
        """Seconds of one side's send buffer to pinned host memory and a received one back, per split axis.
        A partial table that cannot price a layer's face copies yet leaves them out (face_missing says so)
        rather than the whole layout; a complete one must have them."""
        out = {}
        for it in slabs.face_items(L, pd, ph, batch):
            try:
                out[it["axis"]] = self._t(it)
            except CalibrationGap:
                if not self.cal.partial:
                    raise
                self.face_missing.add(it["key"])
        return out

    def correction(self, L: dict, batch: int) -> float:
        return self.in_step(slabs.correction_item(L, batch), "conv")

    def optimizer(self, n_params: float) -> float:
        n = int(n_params)
        item = {"id": f"optimizer|?|n{n}", "kind": "optimizer", "key": "", "units": n, "batch": 1,
                "flops": 0.0, "bytes": 16 * 4 * n}
        nets = [r.get("network") for r in self.cal.by_id.values()
                if r["kind"] == "optimizer" and int(float(r.get("units", -1))) == n]
        net = next((x for x in nets if isinstance(x, str) and x), None)
        if net is None:  # no network's own parameter count: its time as interpolated, no fixed cost
            return self._t(item)
        return self.in_step(item, f"optimizer:{net}")


def find(directory: str | Path, use: str) -> GpuCalibration | None:
    """The calibration spatial.gpu_calibration.use names in `directory`: "none" -> None; "auto" -> the
    only <gpu>.csv there (None if there is none; a clear error if several); else <use>.csv."""
    directory = Path(directory)
    if use == "none":
        return None
    if use == "auto":
        found = sorted(p for p in directory.glob("*.csv")) if directory.is_dir() else []
        if not found:
            return None
        if len(found) > 1:
            raise ValueError(
                f"spatial.gpu_calibration.use is auto but {directory} holds several calibrations "
                f"({', '.join(p.stem for p in found)}): name one"
            )
        return GpuCalibration.read(found[0])
    path = directory / f"{use}.csv"
    if not path.exists():
        raise FileNotFoundError(f"spatial.gpu_calibration.use: {path} does not exist")
    return GpuCalibration.read(path)


__all__ = [
    "COLUMNS",
    "FIXED_COSTS",
    "MAPPINGS",
    "CalibrationGap",
    "GpuCalibration",
    "Measured",
    "bound",
    "datasheet",
    "find",
    "layer_key",
    "read_rows",
    "scale",
    "sidecar",
    "slug",
]
