"""GPU records: what a `make gpu` run measured, committed under `<data.resources_dir>/gpu-records/` and
shown by the report beside this run's numbers, labelled "recorded on <gpu>", never counted in this
run's verdict (docs/architecture.md, "Report").

    python -m hpcdl gpu-records import PATH [--root DIR]   # gpu-records.tgz (or its folder) -> DIR/<gpu>/
    python -m hpcdl gpu-records list [--root DIR]          # what is recorded, per GPU and study

A run's records (envs/gpu_run.py): device.json (hpcdl.platform.kit.device.cuda_record plus the python and
torch versions), one folder per study holding its claims.json and its tables' *.csv and
*.provenance.json copied flat, and what is no study's (calibration/, engines/, logs, summary.json).

The committed form, one folder per GPU model (hpcdl.platform.kit.device.gpu_slug):

    <root>/<slug>/record.json   the GPU, the latest device record, the imports (each archive by its
                                file name and sha256), and per study the commit, start/end time and
                                device of its run (from its sidecars), how long its Snakemake call
                                took (duration_s, from the run's summary.json) and the fingerprint of
                                the code it ran (record_state: from the device's tree where the run
                                wrote one, else from git at its commit)
    <root>/<slug>/<study>/      claims.json, *.csv, *.provenance.json as the GPU run wrote them

An import replaces the studies it brings and keeps the others, since a GPU run may take two device
calls (`make gpu`, then `make gpu-studies` for the studies the first had no time for); what else the
folder holds (a README.md, the device calls' logs/) is kept as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from hpcdl.platform.kit.atomic import atomic_write_json
from hpcdl.platform.kit.claims import STATUSES
from hpcdl.platform.kit.device import gpu_slug
from hpcdl.platform.kit.sidecars import measured_on
from hpcdl.platform.orchestration import record_state

DEFAULT_ROOT = "resources/gpu-records"
REPO = Path(__file__).resolve().parents[3]  # the code a record's fingerprint is held against
RECORD = "record.json"
NOT_STUDIES = ("calibration", "engines")  # folders of a run's records that hold no study
STUDY_FILES = ("claims.json", "*.csv", "*.provenance.json")  # what gpu_run copies into a study folder
MEASURED_CHARS = 200  # measured values shown per recorded claim


class RecordError(ValueError):
    """A run's records, or a committed record, that do not have the expected layout."""


def records_root(cfg: dict) -> str | None:
    """Where a config's committed GPU records lie (None where the config names no resources_dir)."""
    resources = (cfg.get("data") or {}).get("resources_dir")
    return f"{resources}/gpu-records" if resources else None


def _load(path: Path, what: str):
    if not path.is_file():
        raise RecordError(f"{path}: missing ({what})")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path}: {what} does not parse: {exc}") from None


def _check_claims(path: Path, study: str) -> list[dict]:
    doc = _load(path, f"the claims of study {study}")
    if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list):
        raise RecordError(f"{path}: no 'claims' list (hpcdl.platform.kit.claims.write_claims writes one)")
    if doc.get("study", study) != study:
        raise RecordError(f"{path}: claims of study {doc['study']!r} in the folder of study {study!r}")
    for i, c in enumerate(doc["claims"]):
        if not isinstance(c, dict) or not {"id", "status"} <= set(c) or c["status"] not in STATUSES:
            raise RecordError(f"{path}: claims[{i}] needs an 'id' and a 'status' in {', '.join(STATUSES)}")
    return doc["claims"]


def _fingerprint(folder: Path, commit: str) -> dict | None:
    """What the study ran: the fingerprint the run wrote from its own tree, else the one of its
    commit in this repository's git (None where neither is at hand, or the tree had uncommitted
    changes and wrote none: then nothing says what it ran)."""
    written = folder / "fingerprint.json"
    if written.is_file():
        fp = _load(written, "the fingerprint of the code the study ran")
        if not isinstance(fp, dict) or not isinstance(fp.get("files"), dict) or "config" not in fp:
            raise RecordError(f"{written}: needs 'files' and 'config' (record_state.tree_fingerprint)")
        return {**fp, "commit": commit, "from": "the run's working tree"}
    return _git_fingerprint(folder.name, commit)


def _git_fingerprint(study: str, commit: str) -> dict | None:
    """A study's fingerprint at the commit its record names, from this repository's git."""
    base = commit.split("-dirty")[0]
    fp = record_state.commit_fingerprint(REPO, base, study) if " / " not in commit else None
    if fp is None:
        return None
    dirty = commit.endswith("-dirty")
    note = f"taken at {base[:12]}; the run's tree had uncommitted changes" if dirty else ""
    return {**fp, "commit": commit, "from": f"git at {base[:12]}", **({"note": note} if note else {})}


def _durations(run: Path) -> dict[str, dict]:
    """Per study, its Snakemake call's seconds and exit, from the run's summary.json (gpu_run)."""
    path = run / "summary.json"
    steps = _load(path, "the run's summary") if path.is_file() else []
    for step in steps if isinstance(steps, list) else []:
        if isinstance(step, dict) and step.get("step") == "studies":
            return {k: v for k, v in (step.get("per_study") or {}).items() if isinstance(v, dict)}
    return {}


def _study_run(folder: Path) -> dict:
    """A study's commit, time span and device, from its tables' provenance sidecars."""
    sidecars = sorted(folder.glob("*.provenance.json"))
    if not sidecars:
        raise RecordError(f"{folder}/*.provenance.json: none, so the commit and date of the study's run "
                          "are unknown")
    records = []
    for side in sidecars:
        rec = _load(side, "a table's provenance")
        missing = [k for k in ("git_commit", "start_time") if not (isinstance(rec, dict) and rec.get(k))]
        if missing:
            raise RecordError(f"{side}: no {' and no '.join(missing)}")
        records.append(rec)
    ends = [r["end_time"] for r in records if r.get("end_time")]
    return {"commit": " / ".join(sorted({str(r["git_commit"]) for r in records})),
            "started": min(r["start_time"] for r in records),  # ISO 8601 UTC: string order is time order
            "ended": max(ends) if ends else None,
            "measured_on": measured_on(records)}


def _run_dir(folder: Path) -> Path:
    """The folder holding device.json: the one given, or the single folder an archive unpacks to."""
    if (folder / "device.json").exists():
        return folder
    inner = [d for d in folder.iterdir() if d.is_dir()]
    if len(inner) == 1 and (inner[0] / "device.json").exists():
        return inner[0]
    raise RecordError(f"{folder}/device.json: missing (a GPU run's records start with the device record)")


def validate(run: Path) -> tuple[dict, dict[str, dict], dict[str, str]]:
    """The device record, the studies (name -> folder, claims and run) and the study folders left
    out with why; an error naming the file where the layout is wrong."""
    device = _load(run / "device.json", "the device record")
    if not isinstance(device, dict) or not device.get("gpu_model"):
        raise RecordError(f"{run}/device.json: no 'gpu_model' (the run saw no GPU; a --smoke run's "
                          "records are no GPU record)")
    studies, left = {}, {}
    durations = _durations(run)
    for folder in sorted(d for d in run.iterdir() if d.is_dir() and d.name not in NOT_STUDIES):
        took = durations.get(folder.name, {})
        if not (folder / "claims.json").exists():
            # gpu_run copies a study's tables even when its claims stage did not finish
            why = "no claims.json (its claims stage did not finish on the GPU)"
            if took.get("seconds") is not None:
                why += f"; its call ran {took['seconds']:.0f} s, exit {took.get('exit')}"
            left[folder.name] = why
            continue
        claims = _check_claims(folder / "claims.json", folder.name)
        info = _study_run(folder)
        info["fingerprint"] = _fingerprint(folder, info["commit"])
        if took.get("exit") == 0 and took.get("seconds") is not None:
            info["duration_s"] = float(took["seconds"])
        studies[folder.name] = {"folder": folder, "claims": claims, "run": info}
    if not studies:
        raise RecordError(f"{run}/<study>/claims.json: none in any study folder, nothing to import")
    return device, studies, left


def _source(src: Path) -> dict:
    """An imported archive by its file name and sha256 (a folder by its name): a path on the importing
    machine says nothing to anyone else."""
    source = {"name": src.name}
    if src.is_file():
        source["sha256"] = hashlib.sha256(src.read_bytes()).hexdigest()
    return source


def _named(source: dict) -> dict:
    """An older import's source ({'path': ...}) in today's form ({'name': ...})."""
    if "path" not in source:
        return source
    return {"name": Path(source["path"]).name, **{k: v for k, v in source.items() if k != "path"}}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _kept_run(name: str, run: dict) -> dict:
    """A kept study's entry in today's form: its source by name, and a fingerprint from git at its
    commit where it was recorded before fingerprints were written."""
    run = dict(run)
    if isinstance(run.get("source"), str):
        run["source"] = Path(run["source"]).name
    if not run.get("fingerprint") and run.get("commit"):
        fp = _git_fingerprint(name, run["commit"])
        if fp:
            run["fingerprint"] = fp
    return run


def _merged_record(kept: dict, imports: list, device: dict, studies: dict, source: dict, left: dict) -> dict:
    imported = {"source": source, "at": _now(), "studies": sorted(studies), "not_imported": left}
    imports = [{**i, "source": _named(i.get("source", {}))} for i in imports]
    runs = {**{name: _kept_run(name, run) for name, run in kept.items()},
            **{name: {**s["run"], "device": device, "source": source["name"]} for name, s in studies.items()}}
    ends = [r["ended"] for r in runs.values() if r.get("ended")]
    return {"gpu": device["gpu_model"], "device": device, "studies": dict(sorted(runs.items())),
            "started": min(r["started"] for r in runs.values()), "ended": max(ends) if ends else None,
            "commits": sorted({r["commit"] for r in runs.values()}),
            "imports": [*imports, imported]}


def _import_run(run: Path, root: Path, source: dict) -> Path:
    device, studies, left = validate(run)
    try:
        slug = gpu_slug(device["gpu_model"])
    except ValueError as exc:
        raise RecordError(f"{run}/device.json: {exc}") from None
    final = root / slug
    old = _load(final / RECORD, "the committed GPU record") if (final / RECORD).exists() else None
    if old is not None and old.get("gpu") != device["gpu_model"]:
        raise RecordError(f"{final / RECORD}: records {old.get('gpu')!r}, not {device['gpu_model']!r} "
                          f"of {run}/device.json; both have the folder name {slug!r}")
    root.mkdir(parents=True, exist_ok=True)
    # Built whole beside the committed folder, then swapped in: a reader never sees half a record.
    tmp = Path(tempfile.mkdtemp(prefix=f".{slug}.", suffix=".tmp", dir=root))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; records are committed and shared
        kept = {name: run for name, run in (old or {}).get("studies", {}).items()
                if name not in studies and (final / name).is_dir()}
        for name in kept:
            shutil.copytree(final / name, tmp / name)
        # what people added beside the studies (README.md, logs/ of each device call) is no import's
        # to drop
        for extra in _not_studies(final, old):
            (shutil.copytree if extra.is_dir() else shutil.copyfile)(extra, tmp / extra.name)
        for name, s in studies.items():
            (tmp / name).mkdir()
            for pattern in STUDY_FILES:
                for f in sorted(s["folder"].glob(pattern)):
                    shutil.copyfile(f, tmp / name / f.name)
        record = _merged_record(kept, (old or {}).get("imports", []), device, studies, source, left)
        atomic_write_json(tmp / RECORD, {"slug": slug, **record})
        aside = root / f".{slug}.old"
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(final, aside)
        os.replace(tmp, final)
        shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _not_studies(final: Path, old: dict | None) -> list[Path]:
    """The committed folder's entries that are neither its record nor a study's folder."""
    if not final.is_dir():
        return []
    studies = set((old or {}).get("studies", {}))
    return sorted(p for p in final.iterdir() if p.name != RECORD and p.name not in studies)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def import_records(src: str | Path, dest_root: str | Path = DEFAULT_ROOT) -> Path:
    """Validate a GPU run's records (its .tgz archive or its folder) and commit-ready copy them into
    `<dest_root>/<gpu slug>/`; returns that folder."""
    src = Path(src)
    if src.is_dir():
        return _import_run(_run_dir(src), Path(dest_root), _source(src))
    if not src.is_file():
        raise RecordError(f"{src}: no such archive or folder")
    with tempfile.TemporaryDirectory(prefix="gpu-records-") as unpacked:
        try:
            with tarfile.open(src) as tar:
                tar.extractall(unpacked, filter="data")  # refuses absolute paths and links out of it
        except (tarfile.TarError, OSError) as exc:
            raise RecordError(f"{src}: not a readable .tgz archive: {exc}") from None
        return _import_run(_run_dir(Path(unpacked)), Path(dest_root), _source(src))


def _day(iso: str | None) -> str:
    return iso[:10] if iso else "?"


def read_records(root: str | Path = DEFAULT_ROOT) -> list[dict]:
    """Every committed GPU record, by folder name: gpu, slug, device, date, commit, and per study its
    run (commit, date, measured_on, device) with its claims and passed / total, and whether it
    measured today's code (code_state, one of record_state.STATES, and code_text)."""
    root = Path(root)
    out = []
    for folder in sorted(d for d in root.glob("*") if d.is_dir() and not d.name.startswith(".")) \
            if root.is_dir() else []:
        rec = _load(folder / RECORD, "the committed GPU record")
        if not isinstance(rec, dict) or not rec.get("gpu") or not isinstance(rec.get("studies"), dict):
            raise RecordError(f"{folder / RECORD}: needs 'gpu' and a 'studies' object "
                              "(write it with `python -m hpcdl gpu-records import`)")
        studies = {}
        for name, run in rec["studies"].items():
            claims = _check_claims(folder / name / "claims.json", name)
            code = record_state.state_of(name, run, REPO)
            studies[name] = {**run, "date": _day(run.get("started")), "claims": claims,
                             "passed": sum(c["status"] == "passed" for c in claims), "total": len(claims),
                             "code_state": code.state, "code_text": code.text(),
                             "code_summary": code.summary()}
        out.append({**rec, "slug": folder.name, "path": str(folder), "date": _day(rec.get("started")),
                    "commit": " / ".join(rec.get("commits", [])) or "?", "studies": studies})
    return out


def study_records(root: str | Path | None, study: str) -> list[dict]:
    """A study's recorded runs, one per GPU that has one: its run and claims, with the GPU and slug."""
    if root is None:
        return []
    return [{**r["studies"][study], "gpu": r["gpu"], "slug": r["slug"]}
            for r in read_records(root) if study in r["studies"]]


def record_inputs(root: str | None, studies) -> list[str]:
    """The committed files a page showing `studies`' GPU records reads (rule inputs: a new or changed
    record reruns the page)."""
    if root is None or not Path(root).is_dir():
        return []
    files = []
    for folder in sorted(d for d in Path(root).glob("*") if d.is_dir() and not d.name.startswith(".")):
        files.append(f"{root}/{folder.name}/{RECORD}")
        files += [f"{root}/{folder.name}/{s}/claims.json" for s in studies
                  if (folder / s / "claims.json").exists()]
    return files


def label(entry: dict) -> str:
    """'recorded on <gpu> (<date>, commit <sha>)' for a study's recorded run (`study_records`), saying
    so where its tables were measured on no GPU."""
    commits = [c[:12] + (" (dirty)" if c.endswith("-dirty") else "") for c in entry["commit"].split(" / ")]
    text = f"recorded on {entry['gpu']} ({entry['date']}, commit {' / '.join(commits)})"
    if entry.get("measured_on") and not entry["measured_on"].startswith("GPU"):
        text += f"; its tables say measured on {entry['measured_on']}"
    if entry.get("code_text"):
        text += f"; {entry['code_text']}"
    return text


def measured_text(claim: dict, limit: int = MEASURED_CHARS) -> str:
    """A recorded claim's measured values (its reason first where it was not measured), cut to `limit`."""
    text = json.dumps(claim.get("measured", {}), separators=(", ", ": "), sort_keys=True)
    if claim.get("reason"):
        text = f"{claim['reason']}; {text}"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcdl gpu-records", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="a GPU run's records (.tgz or folder) -> <root>/<gpu>/")
    imp.add_argument("path")
    sub.add_parser("list", help="the committed records, per GPU and study")
    for p in sub.choices.values():
        p.add_argument("--root", default=DEFAULT_ROOT, help=f"committed records (default {DEFAULT_ROOT})")
    args = ap.parse_args(argv)
    try:
        if args.command == "import":
            folder = import_records(args.path, args.root)
            rec = json.loads((folder / RECORD).read_text())
            last = rec["imports"][-1]
            print(f"{folder}: {rec['gpu']}, studies {', '.join(last['studies'])} imported")
            for name, why in last["not_imported"].items():
                print(f"  not imported: {name}: {why}")
            return 0
        records = read_records(args.root)
    except RecordError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not records:
        print(f"no GPU records under {args.root}")
    for r in records:
        print(f"{r['slug']}: {r['gpu']} ({r['date']}, commit {r['commit']})")
        for name, s in r["studies"].items():
            took = f", {s['duration_s']:.0f} s" if s.get("duration_s") else ""
            print(f"  {name:<12} {s['passed']}/{s['total']} claims held  ({s['date']}, "
                  f"commit {s['commit'][:12]}, {s['measured_on']}{took}): {s['code_text']}")
    return 0
