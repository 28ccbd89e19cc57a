"""Atomic files: written to a temp file in the same directory, fsynced and renamed, so a reader never
sees half a file (docs/architecture.md, "Results")."""

from __future__ import annotations

import json
import os
import tempfile
from functools import cache
from pathlib import Path


@cache
def _umask() -> int:
    """The process's umask, read once, on first use rather than at import. Linux shows it in
    /proc/self/status; elsewhere reading it means setting it (to 0, for a moment) and back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write to a temp file in the same directory, fsync, rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def json_text(obj) -> str:
    """The project's JSON file form: indented, keys sorted, a final newline."""
    return json.dumps(obj, indent=2, sort_keys=True, default=json_default) + "\n"


def atomic_write_json(path: str | Path, obj) -> Path:
    return atomic_write_text(path, json_text(obj))


def json_default(obj):
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
