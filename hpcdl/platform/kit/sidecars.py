"""Reading provenance sidecars (`<table>.provenance.json`, written beside every table by
hpcdl.platform.kit.results.write_table): where they are, what they say, what they were measured on.
A run folder's own (which tables, which device) are hpcdl.platform.kit.study_dir.StudyDir's."""

from __future__ import annotations

import json
from pathlib import Path


def provenance_path(table_path: str | Path) -> Path:
    table_path = Path(table_path)
    return table_path.with_name(table_path.stem + ".provenance.json")


def read_sidecars(directory: str | Path, table: str = "*") -> list[dict]:
    """The provenance sidecars of the tables in `directory` (or of one `table`), in name order.

    A sidecar that cannot be read or parsed is left out: provenance informs, it never stops a stage.
    """
    records = []
    for side in sorted(Path(directory).glob(f"{table}.provenance.json")):
        try:
            records.append(json.loads(side.read_text()))
        except (OSError, ValueError):
            continue
    return [r for r in records if isinstance(r, dict)]


def measured_on(records: list[dict]) -> str:
    """The device a run was measured on, from its provenance records: "GPU: <model>" where they
    name a GPU, else "CPU: <model> (<n> cores)"; "" without records. Distinct values are joined
    with " / " (tables from different machines)."""
    if not records:
        return ""
    gpus = sorted({str(r["gpu_model"]) for r in records if r.get("gpu_model")})
    if gpus:
        return "GPU: " + " / ".join(gpus)
    cpus = sorted({f"{r.get('cpu_model') or 'unknown model'} ({r.get('cores', '?')} cores)" for r in records})
    return "CPU: " + " / ".join(cpus)
