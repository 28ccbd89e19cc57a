"""The files of one GPU call (envs/gpu_run.py): the records' archive, a results folder kept only where
this code made it, and the copies that gather records. Standard library only, like gpu_run itself."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE_MAX_BYTES = 16 * 2**20


def archive_records(records: Path) -> Path:
    """records/ as records.tgz, at most 16 MiB: the largest logs are cut to their tails first."""
    archive = records.with_suffix(".tgz")
    for _ in range(8):
        tmp = archive.with_suffix(".tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(records, arcname=records.name)
        os.replace(tmp, archive)
        if archive.stat().st_size <= ARCHIVE_MAX_BYTES:
            return archive
        biggest = max(records.rglob("*.log"), key=lambda p: p.stat().st_size)
        data = biggest.read_bytes()
        biggest.write_bytes(b"[cut to its last 1 MiB for the archive]\n" + data[-2**20:])
    raise SystemExit(f"{archive} is over {ARCHIVE_MAX_BYTES >> 20} MiB after cutting the logs")


RESULTS_MARK = ".gpu_run-code"


def code_version() -> str:
    """HEAD, and a digest of the uncommitted changes where there are any ("unknown" outside git).
    Not hpcdl.platform.kit.results.git_commit: its "-dirty" cannot tell two edited trees apart (and
    it imports pandas, which this script never does)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty-{hashlib.sha256(diff).hexdigest()[:12]}" if diff else head


def fresh_results(results: Path, version: str) -> None:
    """Keep a results folder only where this code made it: a device machine may keep ignored folders
    between sessions, and a study reuses its stored points by their inputs, not by the code that
    computed them (hpcdl.platform.kit.points), so another commit's points would pass as this one's.
    Within one session (same code) a second call still resumes what the first left."""
    mark = results / RESULTS_MARK
    made_by = mark.read_text().strip() if mark.exists() else None
    if results.is_dir() and made_by != version:
        print(f"[gpu_run] {results.name}: made by {made_by or 'unrecorded code'}, not {version}: removed",
              flush=True)
        shutil.rmtree(results)
    results.mkdir(parents=True, exist_ok=True)
    mark.write_text(version + "\n")


def copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.write_bytes(src.read_bytes())
    os.replace(tmp, dst)


def copy_matching(src: Path, dst: Path, patterns, since: float = 0.0) -> None:
    for pattern in patterns:
        for f in sorted(src.glob(pattern)) if src.is_dir() else []:
            if f.stat().st_mtime >= since:
                copy(f, dst / f.name)
