"""A study's run folder, owned in one place (docs/architecture.md, "Data flow"):

    <results>/<study>/config.json       the study's block of the validated config
                      raw/              the task app's tables, their sidecars, run_summary.json and
                                        device.json (the device the run resolved, once, at its start)
                      tables/           the tables stage's derived tables and their sidecars
                      figures/          the figures stage's PNGs and the run's part of each caption
                      claims.json       the claims stage's verdicts, and claims.html as the report shows them
                      about.html        the page that opens the study in the report
                      logs/             one log per rule

Where a file lies, what a stage may read, and which device a run was measured on are answered here,
so no stage guesses its device from a folder's name or from the host it happens to run on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from hpcdl.platform.kit.atomic import atomic_write_json
from hpcdl.platform.kit.sidecars import measured_on, read_sidecars

RAW, TABLES, FIGURES, LOGS = "raw", "tables", "figures", "logs"
CLAIMS_JSON, CLAIMS_HTML, ABOUT_HTML = "claims.json", "claims.html", "about.html"
CONFIG_FILE = "config.json"
RUN_SUMMARY = "run_summary.json"  # raw/, written by every task app (hpcdl.platform.kit.points.StudyRun)
DEVICE_FILE = "device.json"  # raw/, written by StudyDir.record_device when a task app starts
STAGES = ("tables", "figures", "claims", "about")
# What a provenance record says about the device (hpcdl.platform.kit.device.device_record).
DEVICE_KEYS = ("device_requested", "device", "gpu_model", "gpu_count", "gpu_capability", "gpu_memory_bytes",
               "driver", "cuda", "cudnn", "nccl")


def _with_sidecars(paths: list[Path]) -> list[Path]:
    return [q for p in paths for q in (p, p.with_name(p.stem + ".provenance.json"))]


@dataclass(frozen=True)
class StudyDir:
    """One study's run folder: its paths, the files each stage may read, the device it was run on."""

    root: Path
    config: Path = field(init=False)  # the study's block of the validated config
    raw: Path = field(init=False)
    tables: Path = field(init=False)
    figures: Path = field(init=False)
    claims_json: Path = field(init=False)  # the claims stage's verdicts (hpcdl.platform.kit.claims)
    claims_html: Path = field(init=False)  # the same, as the report shows them
    about_html: Path = field(init=False)  # the page that opens the study in the report
    logs: Path = field(init=False)  # one log per rule

    def __post_init__(self):
        root = Path(self.root)
        parts = {"root": root, "config": root / CONFIG_FILE, "raw": root / RAW, "tables": root / TABLES,
                 "figures": root / FIGURES, "claims_json": root / CLAIMS_JSON,
                 "claims_html": root / CLAIMS_HTML, "about_html": root / ABOUT_HTML, "logs": root / LOGS}
        for name, path in parts.items():
            object.__setattr__(self, name, path)

    @classmethod
    def holding(cls, path: str | Path) -> tuple[StudyDir, str] | None:
        """The run folder a table or figure file lies in and its part (raw, tables or figures), or None
        for a file outside any run folder (a table written by a benchmark or a test)."""
        path = Path(path)
        part = path.parent.name
        return (cls(path.parent.parent), part) if part in (RAW, TABLES, FIGURES) else None

    def table(self, name: str, part: str = TABLES) -> Path:
        """A derived table, `tables/<name>.csv` (or the table `name` in another part)."""
        return self.root / part / f"{name}.csv"

    def raw_table(self, name: str) -> Path:
        """A table the task app wrote, `raw/<name>.csv`."""
        return self.table(name, RAW)

    def figure(self, name: str) -> Path:
        return self.figures / f"{name}.png"

    # ---- what each rule writes and reads (hpcdl.platform.orchestration.wiring wires them) ----
    def run_outputs(self, spec, config: dict) -> list[Path]:
        """What the task app writes: each raw table with its sidecar, the run summary, the device
        record, and the other files the study declares (StudySpec.run_files)."""
        return [*_with_sidecars([self.table(t, RAW) for t in spec.raw_tables]), self.raw / RUN_SUMMARY,
                self.raw / DEVICE_FILE, *map(Path, spec.run_files(config))]

    def table_outputs(self, spec) -> list[Path]:
        return _with_sidecars([self.table(t) for t in spec.tables])

    def figure_outputs(self, spec) -> list[Path]:
        return [self.figure(f) for f in spec.figures]

    def stage_inputs(self, spec, config: dict, stage: str) -> list[Path]:
        """Every file a stage may read: the config, the run's files and the study's declared extra
        files (StudySpec.stage_files); the figures and claims stages also read the derived tables."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        files = [self.config, *self.run_outputs(spec, config), *map(Path, spec.stage_files(config))]
        return files if stage in ("tables", "about") else files + self.table_outputs(spec)

    # ---- provenance: what the run was measured on ----
    def sidecars(self) -> list[dict]:
        """The run's provenance: its raw tables' sidecars (the derived tables' where there are none)."""
        return read_sidecars(self.raw) or read_sidecars(self.tables)

    def measured_on(self) -> str:
        return measured_on(self.sidecars())

    def task_runtimes(self) -> list[dict]:
        """The task backends the run's raw tables record (a derived table copies them)."""
        seen = []
        for rec in read_sidecars(self.raw):
            if rec.get("runtime") and rec["runtime"] not in seen:
                seen.append(rec["runtime"])
        return seen

    def record_device(self, record: dict) -> dict:
        """Record the device the run's task app resolved, once, at its start (raw/device.json: a
        hpcdl.platform.kit.device.device_record); every table and figure of the run reads it back."""
        atomic_write_json(self.raw / DEVICE_FILE, record)
        return record

    def device(self) -> dict:
        """The device record of the run (raw/device.json), else what its raw tables' sidecars say
        (runs from before the record existed); {} where the run recorded none."""
        try:
            record = json.loads((self.raw / DEVICE_FILE).read_text())
            if isinstance(record, dict) and record.get("device"):
                return record
        except (OSError, ValueError):
            pass
        for rec in read_sidecars(self.raw):
            if rec.get("device"):
                return {k: rec[k] for k in DEVICE_KEYS if k in rec}
        return {}
