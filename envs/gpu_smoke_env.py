"""The GPU image's Python situation rebuilt on a CPU, for `make gpu-smoke` (envs/gpu_run.py --smoke).

On the GPU image the interpreter is a venv of its own that has torch, pandas and most of our
dependencies; what it lacks (envs/gpu_image_packages.txt) comes from a carried site directory on
PYTHONPATH. Here: a bare venv whose site directory points (one .pth line) at a folder of links to the
project venv's packages minus the carried ones, and a carried folder of links to those. So a symlinked
interpreter (which loses its venv, hence torch and pandas) or a child whose PYTHONPATH was replaced
(which loses jsonschema and snakemake) fails here as it failed on the H200.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gpu_carry


def _top_level_entries(site: Path) -> dict[str, set[str]]:
    """Each installed distribution (normalised name) -> the entries of `site` it owns (from RECORD)."""
    owned: dict[str, set[str]] = {}
    for info in site.glob("*.dist-info"):
        name = None
        for line in (info / "METADATA").read_text(errors="replace").splitlines():
            if line.startswith("Name:"):
                name = gpu_carry.norm(line.split(":", 1)[1].strip())
                break
        entries = {info.name}
        record = info / "RECORD"
        for line in record.read_text().splitlines() if record.exists() else []:
            top = line.split(",", 1)[0].split("/", 1)[0]
            if top and top != "__pycache__" and not top.startswith("..") and (site / top).exists():
                entries.add(top)
        if name:
            owned.setdefault(name, set()).update(entries)
    return owned


def _link_farm(site: Path, entries: set[str], dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for entry in sorted(entries):
        (dest / entry).symlink_to(site / entry)


def build(smoke_dir: Path, host_python: Path, carry_site: Path) -> Path:
    """The stand-in image interpreter (a venv's python, by its own path) and the carried site."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    carried_names = {gpu_carry.norm(p.split("==")[0]) for p in gpu_carry.missing_pins()}
    lacking = {gpu_carry.norm(p.split("==")[0]) for p in gpu_carry.image_lacks()}  # PuLP: in neither
    owned = _top_level_entries(site)
    carried = set().union(*(e for n, e in owned.items() if n in carried_names))
    absent = set().union(*(e for n, e in owned.items() if n in lacking))
    image = {p.name for p in site.iterdir()} - absent - {"__pycache__"}
    image = {e for e in image if not e.endswith(".pth") and not e.startswith("__editable__")}
    _link_farm(site, image, smoke_dir / "image-packages")
    _link_farm(site, carried, carry_site)
    venv = smoke_dir / "image-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([str(host_python), "-m", "venv", "--without-pip", str(venv)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    pth = venv / "lib" / version / "site-packages" / "image-packages.pth"
    pth.write_text(str((smoke_dir / "image-packages").resolve()) + "\n")
    return python


def calibrate_killed_and_resumed(runner, limit_s: float) -> int:
    """The calibration at tiny shapes under a budget, SIGKILLed once it has written rows, then resumed:
    each item exactly once, the same items as the plan, nothing marked partial at the end."""
    out = runner.records / "smoke-calibration"
    if out.exists():
        shutil.rmtree(out)
    argv = [str(runner.wrapper), "-m", "hpcdl", "spatial", "calibrate", "--config",
            str(tiny_config(runner.records)), "--device", "cpu", "--out", str(out),
            "--budget-s", str(int(limit_s / 2))]
    log = open(runner.records / "spatial-calibrate.log", "a")  # noqa: SIM115 (closed below)
    try:
        log.write(f"$ {' '.join(argv)}   (killed once it has written a row)\n")
        log.flush()
        proc = subprocess.Popen(argv, cwd=runner_root(), env=runner.env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + limit_s / 2
        rows_at_kill = 0
        while time.monotonic() < deadline and proc.poll() is None:
            rows_at_kill = _data_rows(out)
            if rows_at_kill >= 1:
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            log.write("[gpu_run] the calibration ended before it could be killed: the kill-resume check "
                      "needs more items\n")
            return 4
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.write(f"\n[gpu_run] killed with {rows_at_kill}+ rows written\n")
    finally:
        log.close()
    rc = runner.run("calibrate", argv, limit_s / 2, "spatial-calibrate")
    if rc:
        return rc
    return _check_complete(runner, out, rows_at_kill)


# The papers' layouts at toy sizes: a few dozen items, seconds on a CPU (configs/test.yaml keeps the
# papers' own layouts, hundreds of items).
TINY_SPATIAL = {
    "papers": {"cosmoflow": {"grid": 8, "batch_size": 2, "gpus": [4, 8]},
               "unet3d": {"grid": 8, "in_channels": 1, "levels": [2, 4], "outputs": 2, "batch_size": 2,
                          "gpus": [4]}},
    "gpu_calibration": {"repeats": 2, "steps": [["cosmoflow", 4, 2, 1], ["unet3d", 4, 2, 1]]},
}


def tiny_config(records: Path) -> Path:
    """configs/test.yaml with the spatial block's paper layouts at toy sizes."""
    import yaml

    cfg = yaml.safe_load((runner_root() / "configs" / "test.yaml").read_text())
    cfg["spatial"] = {**cfg["spatial"], **TINY_SPATIAL}
    path = records / "smoke-calibration.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _data_rows(out: Path) -> int:
    files = [f for f in out.glob("*.csv")] if out.is_dir() else []
    return sum(max(0, len(f.read_text().splitlines()) - 1) for f in files)


def _check_complete(runner, out: Path, rows_at_kill: int) -> int:
    import csv
    import json

    tables = sorted(out.glob("*.csv"))
    problems = []
    if len(tables) != 1:
        problems.append(f"expected one calibration table in {out}, found {[t.name for t in tables]}")
    else:
        with open(tables[0], newline="") as f:
            rows = list(csv.DictReader(f))
        keys = [r.get("id") for r in rows]
        if len(keys) != len(set(keys)):
            problems.append("an item was measured twice after the resume")
        if len(rows) <= rows_at_kill:
            problems.append("the resumed run added nothing")
        prov = tables[0].with_suffix(".provenance.json")
        if not prov.exists() or json.loads(prov.read_text()).get("partial", False):
            problems.append(f"{prov.name}: missing or still marked partial after the resume")
    with open(runner.records / "spatial-calibrate.log", "a") as log:
        for p in problems:
            log.write(f"[gpu_run] smoke: {p}\n")
        if not problems:
            log.write(f"[gpu_run] smoke: killed after {rows_at_kill} rows, "
                      f"resumed to {len(rows)} distinct items\n")
    for p in problems:
        print(f"[gpu_run] calibrate: {p}", file=sys.stderr, flush=True)
    return 5 if problems else 0


def runner_root() -> Path:
    return Path(__file__).resolve().parents[1]
