"""Every GPU step of the project in one call of at most 9 minutes, ending in one archive (`make gpu`).

    python3 envs/gpu_run.py --python PY --records DIR                  # make gpu
    python3 envs/gpu_run.py --plan                                     # the step budget, nothing run
    python3 envs/gpu_run.py --steps setup,studies --studies "a b" ...  # make gpu-studies (a second call)
    python3 envs/gpu_run.py --smoke --records DIR                      # make gpu-smoke: the plumbing on a CPU

A lent GPU machine has one GPU and about 15 minutes, start-up included, in calls of at most 10 minutes,
so each step runs under its own time limit (its process group is killed at the limit, what it wrote
is kept) and a failing step does not stop the next: one call shows everything. The records (device,
logs, calibration, engine table, each study's claims and tables) end in DIR.tgz (at most 16 MiB) and
a summary is printed. Runs on the standard library alone: the GPU image's interpreter is a venv of its
own, which this script never imports from.

The image's interpreter is reached through a wrapper script that execs it: a symlink would hide its
venv (Python finds pyvenv.cfg beside the path it was started by). Packages the image lacks come from
`make gpu-carry`, installed into .gpu-carry/site and put in front of PYTHONPATH, never in its place.

--smoke proves the same plumbing on a CPU (docs/architecture.md, "Devices"): an "image" venv that
sees the project's packages only through its own site directory, minus the packages the image lacks
(envs/gpu_image_packages.txt), which come from a carried site directory on PYTHONPATH as on the GPU;
the calibration at tiny shapes under a budget, killed once and resumed; the engine-table driver
(which says "needs CUDA" on a CPU); and the studies step's Snakemake invocation on a test config.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "envs"), str(ROOT)]
import gpu_carry  # noqa: E402  (envs/ is not a package)
import gpu_smoke_env  # noqa: E402
from gpu_files import archive_records, code_version, copy_matching, fresh_results  # noqa: E402

from hpcdl.platform.kit.device import gpu_slug  # noqa: E402  (standard library at import)
from hpcdl.platform.kit.procenv import child_env  # noqa: E402  (standard library only)
from hpcdl.platform.orchestration import record_state  # noqa: E402  (standard library only)

CALL_BUDGET_S = 540  # 9 minutes: a device call's 10 less start-up and the archive
FASHION_FILES = gpu_carry.FASHION_FILES
# What a study never recorded on a GPU is expected to take (one Snakemake call, seconds on one H200);
# once recorded, its record's measured duration (record.json's duration_s) takes the place of its
# estimate (hpcdl.platform.orchestration.record_state.plan). Measured on H200s: spatial 322 (2026-11-27,
# 6d2b8b0); microbatch 67, hetmem 76, offload 104 (2026-11-27, 212b6e8); hpo 344 (2026-11-28, 03d7b09).
# Shuffle was killed at 361 s in the 15th of its 15 tasks (2026-11-27: KAKURENBO's 26 single-rank runs
# need 130-180 s), checkpoint at 455 s after 43 of its 51 tasks (2026-11-28: 8 overhead runs of about
# 10 s left, then its tables): neither fits a 540-s call beside set-up, so neither starts until a call
# is given their seconds (GPU_CALL_BUDGET=590). Checkpoint's 520: those 560 s less 4 of its 10 overhead
# runs (gpu.yaml's intervals 5 -> 3, #56). Malleable's is its laptop time, doubled (its 16-core block
# keeps the laptop's iteration times, #56). Offload's 180: its 104 s before zero_offload and bf16 (#58),
# whose capacity search of `both` now reaches the 96-layer cap (estimated 150-180 s). Microbatch's 420:
# its 67 s at mini-batch 64 became AlexNet, ResNet-18 and DeepBench at 256 (#58; estimated 270-420 s).
ESTIMATE_S = {"microbatch": 420, "hetmem": 85, "offload": 180, "spatial": 340, "malleable": 300, "hpo": 360,
              "shuffle": 430, "checkpoint": 520}
RECORDS_ROOT = ROOT / "resources" / "gpu-records"


@dataclass
class Step:
    name: str
    budget_s: int
    what: str


STEPS = (
    Step("setup", 60, "wrapper interpreter, carried wheels, Fashion-MNIST; imports checked; device.json"),
    Step("tests", 210, "the `cuda` tests, pytest-xdist --dist worksteal"),
    Step("engines", 60, "the micro-batch cuDNN engine table for the networks' layers"),
    Step("calibrate", 150, "the spatial oracle's calibration (paper shapes, predictions' items first)"),
    Step("studies", 60, "configs/gpu.yaml studies, missing and stale first, as many as the rest of the call "
                        "allows"),
)


def cuda_tests_argv(python, workers: int) -> list:
    """The `cuda` tests spread by work stealing: with --dist loadfile one worker got all five checkpoint
    resume tests (122 s of the H200 run's 151 s); a hung test is cut at 150 s, not the whole step."""
    return [python, "-m", "pytest", "-m", "cuda", "-n", str(workers), "--dist", "worksteal",
            "--timeout", "150", "-p", "no:cacheprovider", "-rs", "--durations=20", "tests"]


def study_plan(chosen: str, budget_s: float, slug: str | None, smoke_s: float | None = None) -> list:
    """The studies a call records, in the order it starts them (record_state.plan): `chosen` names a
    subset (space-separated; all where empty), `slug` the GPU whose committed records say what is
    missing or stale, `smoke_s` the seconds every study is taken to need in a smoke run."""
    names = chosen.split() if chosen else list(ESTIMATE_S)
    unknown = sorted(set(names) - set(ESTIMATE_S))
    if unknown:
        raise SystemExit(f"gpu_run: --studies: unknown {unknown}; the studies are {sorted(ESTIMATE_S)}")
    record = record_state.load_record(RECORDS_ROOT / slug) if slug else None
    estimates = dict.fromkeys(names, smoke_s) if smoke_s else ESTIMATE_S
    if smoke_s:  # a smoke's studies are not the GPU's: their recorded durations do not apply
        record = None
    return record_state.plan(names, record, ROOT, budget_s, estimates)


def plan_text(steps=STEPS) -> str:
    rows = [f"  {s.name:<10} {s.budget_s:>4} s  {s.what}" for s in steps]
    total = sum(s.budget_s for s in steps)
    return "\n".join(["make gpu: one device call, each step under its own limit", *rows,
                      f"  {'total':<10} {total:>4} s  ({total / 60:.1f} min; a device call allows 10)"])


class Runner:
    def __init__(self, args):
        self.args = args
        self.records = Path(args.records).resolve()
        if self.records.is_dir():
            # a device machine may keep ignored folders between calls: an earlier call's records left
            # there (the 2026-11-26 hetmem and offload in the 2026-11-27 archive) are not this call's
            print(f"[gpu_run] {self.records.name}: an earlier call's records removed", flush=True)
            shutil.rmtree(self.records)
        self.records.mkdir(parents=True)
        self.bin = ROOT / (".gpu-smoke/bin" if args.smoke else ".gpu-bin")
        self.wrapper = self.bin / "python"
        # the smoke's carried site is its own: a real .gpu-carry/site stays untouched
        self.carry_site = (ROOT / ".gpu-smoke" / "carry-site" if args.smoke
                           else Path(args.carry).resolve() / "site")
        self.deadline = time.monotonic() + args.call_budget_s
        self.summary: list[dict] = []
        self.study_seconds: dict[str, dict] = {}  # per study: seconds and exit (record.json's duration_s)

    # ---- environment ----
    def env(self) -> dict:
        return child_env(self.carry_site, ROOT, PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
                         MPLBACKEND="Agg")

    def run(self, step: str, argv: list, limit_s: float, log_name: str | None = None) -> int:
        """argv in its own process group under a time limit, output to the step's log and stdout."""
        log = self.records / f"{log_name or step}.log"
        limit_s = max(1.0, min(limit_s, self.deadline - time.monotonic()))
        with open(log, "a") as out:
            out.write(f"$ {shlex.join(map(str, argv))}   (limit {limit_s:.0f} s)\n")
            out.flush()
            proc = subprocess.Popen([str(a) for a in argv], cwd=ROOT, env=self.env(), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(limit_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                out.write(f"\n[gpu_run] {step}: stopped at its limit of {limit_s:.0f} s\n")
                rc = 124
        print(f"[gpu_run] {step}: exit {rc} ({log.name})", flush=True)
        return rc

    # ---- steps ----
    def setup(self, limit_s: float) -> int:
        t0 = time.monotonic()
        if self.args.smoke:
            interpreter = gpu_smoke_env.build(ROOT / ".gpu-smoke", Path(sys.executable), self.carry_site)
        else:
            interpreter = Path(_which(self.args.python))
        self.bin.mkdir(parents=True, exist_ok=True)
        tmp = self.wrapper.with_suffix(".tmp")
        tmp.write_text(f'#!/bin/sh\nexec {shlex.quote(str(interpreter))} "$@"\n')
        tmp.chmod(0o755)
        os.replace(tmp, self.wrapper)
        wheels = sorted((Path(self.args.carry) / "wheels").glob("*.whl"))
        if wheels and not self.args.smoke:
            pip = [self.wrapper, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                   "--no-cache-dir", "--upgrade", "--target", self.carry_site, *wheels]
            rc = self.run("setup", pip, limit_s - (time.monotonic() - t0))
            if rc:
                return rc
        sdists = sorted((Path(self.args.carry) / "sdists").glob("*.tar.gz"))
        if sdists and not self.args.smoke:
            # compiled here against the image's own Python (envs/gpu_carry.py); a failure costs only the
            # study that imports the package, so it is logged and the call goes on
            build = [self.wrapper, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                     "--no-cache-dir", "--no-build-isolation", "--upgrade", "--target", self.carry_site,
                     *sdists]
            if self.run("setup", build, limit_s - (time.monotonic() - t0)):
                print(f"[gpu_run] setup: building {[s.name for s in sdists]} failed (setup.log); the studies "
                      "that import them will fail", flush=True)
        data = Path(self.args.fashion_mnist)
        carried = Path(self.args.carry) / "fashion-mnist"
        if not _has_fashion(data) and carried.is_dir():
            data.mkdir(parents=True, exist_ok=True)
            for f in carried.glob("*.xz"):   # raw IDX files, which the loader reads as they are
                tmp = data / f"{f.stem}.tmp"
                tmp.write_bytes(lzma.decompress(f.read_bytes()))
                os.replace(tmp, data / f.stem)
        check = ("import json, sys, jsonschema, pandas, torch\n"
                 "cuda = torch.cuda.is_available()\n"
                 f"if {not self.args.smoke} and not cuda: sys.exit('make gpu: torch sees no CUDA GPU here')\n"
                 "from hpcdl.platform.kit.device import cuda_record\n"
                 "rec = cuda_record() if cuda else {'device': 'cpu'}\n"
                 "rec.update(python=sys.executable, torch=torch.__version__, pandas=pandas.__version__)\n"
                 "text = json.dumps(rec, indent=1)\n"
                 "print(text)\n"
                 "open(sys.argv[1], 'w').write(text + '\\n')\n")
        rc = self.run("setup", [self.wrapper, "-c", check, self.records / "device.json"],
                      limit_s - (time.monotonic() - t0))
        if not _has_fashion(data):
            print(f"[gpu_run] setup: Fashion-MNIST is not in {data} (run `make gpu-carry` where it is)",
                  flush=True)
            return rc or 3
        return rc

    def tests(self, limit_s: float) -> int:
        if self.args.smoke:
            return self._skip("tests", "no CUDA test runs on a CPU (each skips, saying so)")
        return self.run("tests", cuda_tests_argv(self.wrapper, self.args.workers), limit_s, "cuda-tests")

    def engines(self, limit_s: float) -> int:
        out = self.records / "engines"
        out.mkdir(exist_ok=True)
        config = "configs/test.yaml" if self.args.smoke else "configs/gpu.yaml"
        started = time.time()
        rc = self.run("engines", [self.wrapper, "-m", "hpcdl.studies.microbatch.cudnn.engine_table",
                                  "--config", config,
                                  "--out", ROOT / "tests" / "data" / "microbatch_cudnn_{gpu}.csv",
                                  "--budget-s", int(limit_s - 10)], limit_s)
        # this call's table only: a committed one (tests/data/microbatch_cudnn_h200.csv) is not its output
        copy_matching(ROOT / "tests" / "data", out, ("microbatch_cudnn_*.csv", "microbatch_cudnn_*.json"),
                       since=started)
        return rc

    def calibrate(self, limit_s: float) -> int:
        if self.args.smoke:
            return gpu_smoke_env.calibrate_killed_and_resumed(self, limit_s)
        out = ROOT / "resources" / "calibration"
        rc = self.run("calibrate", [self.wrapper, "-m", "hpcdl", "spatial", "calibrate", "--config",
                                    "configs/paper.yaml", "--device", "cuda", "--out", out,
                                    "--budget-s", int(limit_s - 15)], limit_s, "spatial-calibrate")
        copy_matching(out, self.records / "calibration", ("*.csv", "*.provenance.json"))
        return rc

    def studies(self, limit_s: float) -> int:
        config = "configs/test.yaml" if self.args.smoke else "configs/gpu.yaml"
        results = ROOT / (".gpu-smoke/results" if self.args.smoke else "results-gpu")
        if self.args.smoke and results.exists():
            shutil.rmtree(results)  # the smoke runs the studies it names, never reuses them
        rows = study_plan(self.args.studies, limit_s, self._gpu_slug(), 20 if self.args.smoke else None)
        print(record_state.plan_text(rows, limit_s, self._gpu_slug() or "an unrecorded GPU"), flush=True)
        order, needs_s = [r.study for r in rows], {r.study: r.needs_s for r in rows}
        stop = time.monotonic() + limit_s
        rc, left, checked = 0, [], self.args.smoke  # the smoke's results are its own, removed above
        for study in order:
            remaining = min(stop, self.deadline) - time.monotonic()
            needs = needs_s[study]  # its last recorded GPU run's seconds, else its estimate
            if remaining < needs:  # started, it would be killed and keep nothing
                print(f"[gpu_run] studies: {study} needs about {needs:.0f} s, {remaining:.0f} s left: "
                      "not started", flush=True)
                left.append(study)
                continue
            if not checked:  # only once a study starts: a call that runs none leaves results-gpu alone
                fresh_results(results, code_version())
                checked = True
            settings = [f"studies=[{study}]", *([f"results_dir={results}"] if self.args.smoke else [])]
            # what this study runs from, taken from the files themselves: this machine's git metadata
            # may be an older commit's (the working tree travels, the repository's history may not)
            record_state.write_fingerprint(ROOT, study, self.records / study / "fingerprint.json")
            started = time.time()
            got = self.run("studies", [self.wrapper, "-m", "snakemake", "--cores", "all", "--configfile",
                                       config, "--config", *settings, "--rerun-incomplete",
                                       "--scheduler", "greedy",  # PuLP is not carried (envs/gpu_carry.py)
                                       "--resources", f"gpu={self.args.gpus}", "--keep-going",
                                       "--printshellcmds"], remaining, "workflow")
            rc = rc or got
            self.study_seconds[study] = {"seconds": round(time.time() - started, 1), "exit": got}
            # this call's outputs only: a claims.json left by an earlier run must not pass as this one's
            dest = self.records / study
            copy_matching(results / study, dest, ("claims.json",), since=started)
            copy_matching(results / study / "tables", dest, ("*.csv", "*.provenance.json"), since=started)
            if got == 124:
                left.append(study)
        if left:
            print(f"[gpu_run] studies not run in this call: {' '.join(left)} "
                  f"(next call: make gpu-studies GPU_STUDIES=\"{' '.join(left)}\")", flush=True)
            (self.records / "studies-left.txt").write_text(" ".join(left) + "\n")
        return rc

    def _gpu_slug(self) -> str | None:
        """This machine's GPU by its records' folder name (from setup's device.json), else None."""
        try:
            return gpu_slug(json.loads((self.records / "device.json").read_text())["gpu_model"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _skip(self, step: str, why: str) -> int:
        print(f"[gpu_run] {step}: skipped ({why})", flush=True)
        return 0

    # ---- the call ----
    def main(self, names: list[str]) -> int:
        print(plan_text([s for s in STEPS if s.name in names]), flush=True)
        for step in STEPS:
            if step.name not in names:
                continue
            t0 = time.monotonic()
            remaining = self.deadline - time.monotonic()
            limit = remaining if step.name == "studies" else min(step.budget_s, remaining)
            rc = getattr(self, step.name)(limit) if remaining > 5 else 125
            self.summary.append({"step": step.name, "exit": rc, "seconds": round(time.monotonic() - t0, 1),
                                 "budget_s": step.budget_s, "timed_out": rc == 124})
            if step.name == "studies":
                self.summary[-1]["per_study"] = self.study_seconds
            if step.name == "setup" and rc:
                break  # nothing else can run without the interpreter
        (self.records / "summary.json").write_text(json.dumps(self.summary, indent=1) + "\n")
        archive = archive_records(self.records)
        print("\nmake gpu summary")
        for s in self.summary:
            state = "ok" if s["exit"] == 0 else ("TIMED OUT" if s["timed_out"] else f"FAILED ({s['exit']})")
            print(f"  {s['step']:<10} {s['seconds']:>6.1f} s of {s['budget_s']:>3}  {state}")
        print(f"  archive    {archive} ({archive.stat().st_size / 2**20:.2f} MiB)")
        return 0 if all(s["exit"] == 0 for s in self.summary) else 1


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(5)
            break
        except subprocess.TimeoutExpired:
            continue


def _which(name: str) -> str:
    from shutil import which

    found = which(name)
    if not found:
        raise SystemExit(f"gpu_run: interpreter {name!r} not found (set GPU_PY)")
    return os.path.abspath(found)  # not resolved: a venv interpreter must keep its own path


def _has_fashion(d: Path) -> bool:
    return all((d / n).exists() or (d / f"{n}.gz").exists() for n in FASHION_FILES)



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="store_true", help="print the step budget and run nothing")
    ap.add_argument("--smoke", action="store_true", help="the plumbing on a CPU (make gpu-smoke)")
    ap.add_argument("--python", default="python3", help="the GPU image's interpreter")
    ap.add_argument("--records", default=str(ROOT / "gpu-records"))
    ap.add_argument("--carry", default=str(ROOT / ".gpu-carry"))
    ap.add_argument("--fashion-mnist", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--steps", default=",".join(s.name for s in STEPS))
    ap.add_argument("--studies", default="", help="a subset of the studies step (space-separated)")
    ap.add_argument("--workers", type=int, default=6, help="pytest-xdist workers of the tests step")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--call-budget-s", type=float, default=CALL_BUDGET_S)
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.steps.split(",") if n.strip()]
    unknown = sorted(set(names) - {s.name for s in STEPS})
    if unknown:
        ap.error(f"--steps: unknown {unknown}; the steps are {[s.name for s in STEPS]}")
    if args.plan:
        steps = [s for s in STEPS if s.name in names]
        print(plan_text(steps))
        if "studies" in names:
            # the studies step has what the call's other steps leave; the GPU is the one recorded last
            budget = args.call_budget_s - sum(s.budget_s for s in steps if s.name != "studies")
            slug = record_state.newest_slug(RECORDS_ROOT)
            rows = study_plan(args.studies, budget, slug)
            print(record_state.plan_text(rows, budget, slug or "an unrecorded GPU"))
        return 0
    return Runner(args).main(names)


if __name__ == "__main__":
    sys.exit(main())
