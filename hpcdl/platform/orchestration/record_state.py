"""Whether a study's GPU record measured today's code, and which studies a device call spends its
minutes on (docs/architecture.md, "Devices").

A record's *fingerprint* names what its study ran: every file of its package (hpcdl/studies/<study>/),
of the platform kit (hpcdl/platform/kit/) and its task app (tasks/<study>.py), each by its git blob id,
and a digest of its block of configs/gpu.yaml with comments and blank lines left out (a trimmed
repeat's comment does not make a record stale; a changed value does). Blob ids are computed from
the files themselves, so a fingerprint is taken the same way from a working tree (on the device
machine, where the tree's own git metadata may be an older commit's) and from a commit in git
(for records made before fingerprints were written).

Standard library only: envs/gpu_run.py imports this module under the GPU image's interpreter.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hpcdl.platform.kit.atomic import atomic_write_json  # standard library only

GPU_CONFIG = "configs/gpu.yaml"
KIT = "hpcdl/platform/kit"
STATES = ("missing", "older code", "unknown code", "current")  # the order a call spends its time in
SHOWN_CHANGED = 4  # changed files named in a state's text; the rest are counted


def code_paths(study: str) -> list[str]:
    """The folders and files whose code a study's GPU run depends on."""
    return [f"hpcdl/studies/{study}", KIT, f"tasks/{study}.py"]


def config_block(text: str, study: str) -> str:
    """A study's top-level block of a YAML file, one line per setting: comments, blank lines and
    trailing spaces left out ('' where the file has no such block)."""
    lines, inside = [], False
    for raw in text.splitlines():
        if raw and not raw[0].isspace() and not raw.startswith("#"):
            inside = raw.split(":", 1)[0].strip() == study
        if not inside:
            continue
        line = _without_comment(raw).rstrip()
        if line.strip():
            lines.append(line)
    return "\n".join(lines)


def _without_comment(line: str) -> str:
    """The line up to a '#' that starts a YAML comment (after a space, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def blob_id(data: bytes) -> str:
    """git's object id of a file's content (`git hash-object`), computed without git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def tree_fingerprint(root: Path, study: str) -> dict:
    """The fingerprint of a study's code as it lies in a working tree."""
    root = Path(root)
    files = {}
    for rel in code_paths(study):
        path = root / rel
        found = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for f in found:
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
                files[f.relative_to(root).as_posix()] = blob_id(f.read_bytes())
    config = root / GPU_CONFIG
    block = config_block(config.read_text(), study) if config.is_file() else ""
    return {"files": dict(sorted(files.items())), "config": _digest(block)}


def commit_fingerprint(root: Path, commit: str, study: str) -> dict | None:
    """The fingerprint of a study's code at a commit of the repository at `root` (None where git or
    the commit is not at hand)."""
    listed = _git(root, "ls-tree", "-r", "-z", "--full-tree", commit, "--", *code_paths(study))
    config = _git(root, "show", f"{commit}:{GPU_CONFIG}")
    if listed is None or config is None:
        return None
    files = {}
    for entry in filter(None, listed.split("\0")):
        meta, path = entry.split("\t", 1)
        _mode, kind, oid = meta.split()
        if kind == "blob" and not path.endswith(".pyc"):
            files[path] = oid
    return {"files": dict(sorted(files.items())), "config": _digest(config_block(config, study))}


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def changed_files(recorded: dict, current: dict, study: str) -> list[str]:
    """The files (and the config block) in which two fingerprints differ."""
    old, new = recorded.get("files", {}), current.get("files", {})
    changed = sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p))
    if recorded.get("config") != current.get("config"):
        changed.append(f"{GPU_CONFIG} ({study} block)")
    return changed


@dataclass(frozen=True)
class RecordState:
    """A study's GPU record against today's code: its state (STATES), the files that changed and,
    where git knows both commits, how many commits touched them since."""
    study: str
    state: str
    changed: tuple[str, ...] = ()
    commits: int | None = None
    note: str = ""

    def text(self) -> str:
        if self.state in ("missing", "current"):
            return self.state + (f" ({self.note})" if self.note else "")
        if self.state == "unknown code":
            return f"unknown code ({self.note})"
        shown = ", ".join(self.changed[:SHOWN_CHANGED])
        more = len(self.changed) - SHOWN_CHANGED
        files = shown + (f" and {more} more" if more > 0 else "")
        return f"older code ({self._count()}these files changed: {files})"

    def _count(self) -> str:
        return "" if self.commits is None else f"{self.commits} commit{'s' if self.commits != 1 else ''}; "

    def summary(self) -> str:
        """The state in a few words: which parts changed (the study's package, the platform kit, its task
        app, its gpu.yaml block), not every file."""
        if self.state != "older code":
            return self.text()
        parts = {"package": f"hpcdl/studies/{self.study}/", "kit": KIT + "/",
                 "task app": f"tasks/{self.study}.py", "gpu.yaml block": GPU_CONFIG}
        changed = [name for name, prefix in parts.items() if any(f.startswith(prefix) for f in self.changed)]
        return f"older code ({self._count()}{', '.join(changed)} changed since)"


def state_of(study: str, run: dict | None, root: Path, current: dict | None = None) -> RecordState:
    """A study's record state; `run`: its entry in a GPU record's record.json (None: no record)."""
    if run is None:
        return RecordState(study, "missing")
    recorded = run.get("fingerprint")
    if not recorded:
        return RecordState(study, "unknown code", note="the record has no fingerprint")
    current = current if current is not None else tree_fingerprint(root, study)
    changed = changed_files(recorded, current, study)
    note = recorded.get("note", "")
    if not changed:
        return RecordState(study, "current", note=note)
    base = str(run.get("commit") or recorded.get("commit") or "").split("-dirty")[0]
    commits = None
    if base:
        paths = [p.split(" (")[0] for p in changed]
        counted = _git(root, "rev-list", "--count", f"{base}..HEAD", "--", *sorted(set(paths)))
        commits = int(counted) if counted and counted.strip().isdigit() else None
    return RecordState(study, "older code", tuple(changed), commits, note)


# ---- which studies a device call records ----

@dataclass(frozen=True)
class PlanRow:
    study: str
    state: RecordState
    last_s: float | None   # how long its last recorded GPU run took (None: never measured)
    needs_s: float         # what the call must have left to start it: last_s, else the estimate
    runs: bool             # whether the plan fits it into the call


def plan(studies: list[str], record: dict | None, root: Path, budget_s: float,
         estimates: dict[str, float]) -> list[PlanRow]:
    """Missing studies first, then those recorded on older (or unknown) code, then current ones; within
    a state the shortest first. A study is planned only where the budget left covers its last measured
    duration (or, never measured, its estimate), as envs/gpu_run.py starts one."""
    runs = (record or {}).get("studies", {})
    rows = []
    for study in studies:
        st = state_of(study, runs.get(study), root)
        last = runs.get(study, {}).get("duration_s")
        rows.append((st, last, float(last if last else estimates.get(study, budget_s))))
    rows.sort(key=lambda r: (STATES.index(r[0].state), r[2], r[0].study))
    left, out = budget_s, []
    for st, last, needs in rows:
        fits = needs <= left
        left -= needs if fits else 0
        out.append(PlanRow(st.study, st, last, needs, fits))
    return out


def plan_text(rows: list[PlanRow], budget_s: float, gpu: str) -> str:
    lines = [f"studies on {gpu}: {budget_s:.0f} s for studies in this call (missing first, then older code, "
             "then current; shortest first within each)"]
    for r in rows:
        if r.last_s:
            last = f"{r.last_s:.0f} s last time"
        else:  # a record from before durations were kept has none
            last = ("never recorded" if r.state.state == "missing" else "no duration recorded") + \
                f", estimate {r.needs_s:.0f} s"
        verb = "records" if r.runs else "skips  "
        lines.append(f"  {verb} {r.study:<11} {last:<36} {r.state.text()}")
    return "\n".join(lines)


def load_record(records_dir: Path) -> dict | None:
    """A GPU's committed record.json (None where that GPU has none yet)."""
    path = Path(records_dir) / "record.json"
    return json.loads(path.read_text()) if path.is_file() else None


def newest_slug(records_root: Path) -> str | None:
    """The GPU whose committed record was imported last (where the GPU of a call is not yet known)."""
    found = []
    for folder in Path(records_root).glob("*"):
        rec = load_record(folder) if folder.is_dir() and not folder.name.startswith(".") else None
        if rec:
            found.append((str((rec.get("imports") or [{}])[-1].get("at", "")), folder.name))
    return max(found)[1] if found else None


def write_fingerprint(root: Path, study: str, out: Path) -> None:
    """The fingerprint of the tree a study is about to run from, written beside its records."""
    atomic_write_json(out, tree_fingerprint(root, study))
