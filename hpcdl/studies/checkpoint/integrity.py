"""Crash-safe commit and verification of checkpoint directories.

A checkpoint is a directory `<root>/<name>/` holding the payload files of one
format plus `MANIFEST.json` (format, and size + sha256 of every payload file).
It is built under a hidden temporary name, every file is fsync'd, the manifest is
written and fsync'd last, and only then is the directory renamed into place (and
the parent fsync'd). A process killed at any point therefore leaves either the
previous checkpoints untouched plus a `.tmp` directory that is never taken for a
checkpoint, or a complete new one. Loading verifies every file against the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "MANIFEST.json"
TMP_MARK = ".tmp-"
_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file."""


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def payload_files(directory: Path) -> list[Path]:
    """Every regular file under `directory` except the manifest, sorted by relative path."""
    files = [p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST]
    return sorted(files, key=lambda p: p.relative_to(directory).as_posix())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def evict_from_page_cache(directory: Path) -> None:
    """Drop the (clean, already fsync'd) pages of every file so the next read comes from storage."""
    if not hasattr(os, "posix_fadvise"):
        return
    for p in directory.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def new_tmp_dir(root: Path, name: str) -> Path:
    """A fresh hidden staging directory next to where `<root>/<name>` will land."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


@dataclass
class Commit:
    """Where a committed checkpoint landed and when each phase finished (perf_counter stamps)."""

    path: Path
    file_bytes: int
    durable_at: float   # every payload byte fsync'd
    committed_at: float  # manifest written and the directory renamed into place


def make_durable(tmp: Path) -> float:
    """fsync every payload file and subdirectory of a staging directory; returns the time stamp."""
    for p in payload_files(tmp):
        fsync_file(p)
    for d in sorted({p.parent for p in payload_files(tmp)} | {tmp}, key=lambda q: len(q.parts), reverse=True):
        fsync_dir(d)
    return time.perf_counter()


def commit(tmp: Path, final: Path, fmt: str) -> Commit:
    """Seal staging directory `tmp` (payload already written) as checkpoint `final`."""
    if final.exists():
        raise CheckpointError(f"checkpoint {final} already exists; refusing to overwrite it")
    durable_at = make_durable(tmp)
    files = {}
    total = 0
    for p in payload_files(tmp):
        size = p.stat().st_size
        files[p.relative_to(tmp).as_posix()] = {"bytes": size, "sha256": sha256_file(p)}
        total += size
    manifest = {"format": fmt, "files": files, "created_unix": time.time()}
    mpath = tmp / MANIFEST
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    return Commit(final, total, durable_at, time.perf_counter())


def read_manifest(path: Path) -> dict:
    mpath = Path(path) / MANIFEST
    if TMP_MARK in Path(path).name:
        raise CheckpointError(f"{path} is an uncommitted staging directory, not a checkpoint")
    if not mpath.is_file():
        raise CheckpointError(f"{mpath} is missing: {path} is not a committed checkpoint")
    try:
        manifest = json.loads(mpath.read_text())
    except ValueError as e:
        raise CheckpointError(f"{mpath} is unreadable: {e}") from None
    if not (isinstance(manifest, dict) and "format" in manifest and isinstance(manifest.get("files"), dict)):
        raise CheckpointError(f"{mpath} is malformed: needs 'format' and a 'files' mapping")
    return manifest


def verify(path: Path) -> dict:
    """Check every payload file against the manifest; returns the manifest or raises naming the file."""
    path = Path(path)
    manifest = read_manifest(path)
    for rel, want in manifest["files"].items():
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"checkpoint file {f} listed in {path / MANIFEST} is missing")
        size = f.stat().st_size
        if size != want["bytes"]:
            raise CheckpointError(f"checkpoint file {f} has {size} bytes, manifest says {want['bytes']}")
        if sha256_file(f) != want["sha256"]:
            raise CheckpointError(f"checkpoint file {f} fails its sha256 check (corrupt or modified)")
    extra = {p.relative_to(path).as_posix() for p in payload_files(path)} - set(manifest["files"])
    if extra:
        raise CheckpointError(f"checkpoint {path} holds files not in its manifest: {sorted(extra)}")
    return manifest


def committed(root: Path) -> list[Path]:
    """Committed checkpoint directories under `root`, oldest name first (staging dirs never count)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if p.is_dir() and TMP_MARK not in p.name and (p / MANIFEST).is_file())


def latest(root: Path) -> Path | None:
    found = committed(root)
    return found[-1] if found else None


def prune(root: Path, keep: int) -> None:
    """Keep only the newest `keep` committed checkpoints."""
    for p in committed(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
