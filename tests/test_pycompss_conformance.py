"""Conformance of the task apps with the real PyCOMPSs binding (vendored: ../shared/vendor/pycompss).

1. Each task app run with the binding's decorators in its sequential mode (HPCDL_RUNTIME=pycompss,
   no runtime) writes the same raw tables as the local backend on every deterministic column.
2. In the binding's master context, its C extension replaced by a recorder, every task of every
   app passes the binding's decorator validation and registers the intended constraints: read as
   the COMPSs runtime reads them, in the environment the generated command sets, they ask for the
   configured cores and, for a study whose tasks can hold GPUs, for HPCDL_<STUDY>_GPUS GPUs.
3. Backend detection: COMPSs in the master (and worker) context, local outside it; the 2.x API.

The binding is found through HPCDL_PYCOMPSS_BINDING or a `shared/vendor/pycompss` beside the
checkout (or beside one of its parents); without it these tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from raw_tables import assert_same_raw_tables

from hpcdl.platform.kit.config import studies
from hpcdl.platform.kit.procenv import child_env

REPO = Path(__file__).resolve().parent.parent
STUDIES = studies()  # the registry's: a new study is checked here or fails below


def _find_binding() -> Path | None:
    env = os.environ.get("HPCDL_PYCOMPSS_BINDING")
    candidates = [Path(env)] if env else [p / "shared" / "vendor" / "pycompss" for p in REPO.parents]
    for path in candidates:
        if (path / "pycompss" / "api" / "task.py").is_file():
            return path
    return None


BINDING = _find_binding()
pytestmark = pytest.mark.skipif(
    BINDING is None, reason="PyCOMPSs binding not found: set HPCDL_PYCOMPSS_BINDING to the directory "
                            "holding pycompss/ (the vendored copy is ../shared/vendor/pycompss)")

# What each app's tasks must register: computing units ("study" = the study's configured cores)
# and the on_failure action the binding submits them with.
INTENDED = {
    "checkpoint": {"io_point": ("study", "IGNORE"), "ranks_point": ("study", "IGNORE"),
                   "resume_point": (1, "IGNORE"), "overhead_point": ("study", "IGNORE")},
    "hpo": {"train_chunk": ("study", "IGNORE"), "test_accuracy": ("study", "IGNORE"),
            "warm_up": ("study", "FAIL")},
    "shuffle": {"run_point": ("study", "IGNORE")},
    "spatial": {"exactness": ("study", "IGNORE"), "calibrate": ("study", "IGNORE"),
                "scaling_run": ("study", "IGNORE"), "gpu_calibration": ("study", "IGNORE")},
    "hetmem": {"app_point": ("study", "IGNORE")},
    "microbatch": {"network_point": ("study", "IGNORE"), "cudnn_point": ("study", "IGNORE")},
    "malleable": {"response_point": ("study", "IGNORE"), "oversub_point": ("study", "IGNORE"),
                  "cosched_point": ("study", "IGNORE")},
    "offload": {"run_point": ("study", "IGNORE"), "capacity_point": ("study", "IGNORE")},
}
# Cores each study's tasks must get in the config below: set (checkpoint) or derived (largest M,
# largest run's ranks x threads).
# tasks an app submits only where its device resolves to cuda (not here: the runs below are on the CPU)
CUDA_ONLY = {"spatial": {"gpu_calibration"}, "microbatch": {"cudnn_point"}}
CONFIGURED_UNITS = {"checkpoint": 2, "hpo": 1, "shuffle": 2, "spatial": 2, "hetmem": 1, "microbatch": 1,
                    "malleable": 2, "offload": 1}


def test_every_registered_study_has_its_intended_tasks_and_units():
    missing = {name: [s for s in STUDIES if s not in table]
               for name, table in (("INTENDED", INTENDED), ("CONFIGURED_UNITS", CONFIGURED_UNITS))}
    assert not any(missing.values()), f"registered studies with no conformance entry: {missing}"


def _env(*pythonpath, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCDL_") or k == "HPCDL_PYCOMPSS_BINDING"}
    return child_env(*pythonpath, base=env, **{"HPCDL_PROGRESS": "0", "MPLBACKEND": "Agg", **extra})


def _conformance_config(tmp_path: Path, test_config: dict, name: str, runtime: str) -> Path:
    """test.yaml, trimmed so every task of every app still runs at least once."""
    cfg = yaml.safe_load(yaml.safe_dump(test_config))
    cfg["results_dir"] = str(tmp_path / name)
    for study in STUDIES:
        cfg[study]["runtime"] = runtime
    ck = cfg["checkpoint"]
    # one format (io_point and resume_point run the same task for each): DCP, which ranks_point needs
    ck.update(formats=["dcp"], modes=["sync"], computing_units="2",
              sizes={"min_params": 4096, "max_params": 4096, "points": 1})
    ck["overhead"].update(modes=["sync"], intervals=[2])
    cfg["shuffle"]["kakurenbo"] = {"fractions": [0], "world_size": 2}
    sp = cfg["spatial"]
    sp["hybrid"] = {"grid": 16, "layouts": []}
    sp["strong"]["layouts"] = [[1, 2, 1]]  # one scaling run on 2 ranks, then the train run
    sp["hybrid"]["layouts"], sp["ceiling"] = [], False  # more runs of the same task add nothing here
    sp["calibration"] = {"pingpong_bytes": [1024, 4096], "fractions": [1.0], "repeats": 1, "rounds": 1}
    cfg["shuffle"]["grids"] = [{"world_sizes": [2], "qs": [0.5], "partitionings": ["skewed"]}]
    cfg["hetmem"]["apps"] = [{"name": "gups", "size": 10, "iters": 1}]
    # one candidate, undivided: the plan (and so every raw column but the timings) is deterministic
    cfg["microbatch"].update(algorithms=["onednn-nchw"], policies=["undivided"], backward_forms=["fused"])
    ml = cfg["malleable"]  # one point per task: each point starts a driver and a torch forkserver
    ml["response"]["methods"], ml["oversub"]["modes"] = ["signal"], ["follow"]
    ml["cosched"]["policies"], ml["repeats"] = ["equal"], 1
    # one depth: a second one runs the same two tasks on a bigger model
    cfg["offload"]["model"]["depths"] = cfg["offload"]["model"]["depths"][:1]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _runtime_reading(constraints: str, env: dict) -> dict[str, int]:
    """Computing units per processor type, as the COMPSs runtime reads the constraint string the
    binding registers: MethodResourceDescription(String) and EnvironmentLoader of COMPSs 3.3, the
    commit the vendored binding comes from (the Java runtime itself cannot be installed here).

    Keys lose "_" and case; `processors` is a list of {key: value, ...}; a "$VAR" value comes from
    the environment ("" when unset: the field then keeps its default); a processor with 0 units is
    dropped; the top-level processor (computing_units) is a CPU, added when set or when no CPU was.
    """
    def load(value: str) -> str:
        m = re.fullmatch(r"\$\{?(\w+)\}?", value)
        return env.get(m.group(1), "") if m else value

    units: dict[str, int] = {}

    def add(kind: str, cu: int) -> None:
        if cu > 0:
            units[kind] = units.get(kind, 0) + cu

    top = None
    for item in filter(None, constraints.split(";")):
        key, value = item.split(":", 1)
        key, value = key.strip().replace("_", "").lower(), value.strip()
        if key == "processors":
            assert value.startswith("[") and value.endswith("]"), value
            for body in re.findall(r"\{([^}]*)\}", value):
                proc = {"processortype": "CPU", "computingunits": ""}
                for field in body.split(","):
                    name, raw = field.split(":")[:2]
                    proc[name.strip().lower()] = load(raw.strip()) or proc.get(name.strip().lower(), "")
                add(proc["processortype"].upper(), int(proc["computingunits"] or 1))
        elif key == "computingunits":
            top = int(load(value) or 1)
        else:
            raise AssertionError(f"constraint {key!r}: not one this suite reads")
    if top is not None:
        add("CPU", top)
    elif "CPU" not in units:
        add("CPU", 1)
    return units


def test_runtime_reading_mirrors_compss():
    env = {"U": "4", "G": "2", "Z": "0"}
    assert _runtime_reading("computing_units:$U;", env) == {"CPU": 4}
    assert _runtime_reading("processors:[{processorType: CPU, computingUnits: $U}, "
                            "{processorType: GPU, computingUnits: $G}];", env) == {"CPU": 4, "GPU": 2}
    # a GPU of 0 units is dropped; a GPU alone still gets COMPSs's default CPU; an unset GPU count is 1
    assert _runtime_reading("processors:[{processorType: CPU, computingUnits: $U}, "
                            "{processorType: GPU, computingUnits: $Z}];", env) == {"CPU": 4}
    gpu_only = "processors:[{processorType: GPU, computingUnits: $%s}];"
    assert _runtime_reading(gpu_only % "G", env) == {"CPU": 1, "GPU": 2}
    assert _runtime_reading(gpu_only % "NOPE", env) == {"CPU": 1, "GPU": 1}


def _run_app(study: str, config: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", f"tasks.{study}", "--config", str(config)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("study", STUDIES)
def test_sequential_binding_writes_the_local_backends_tables(study, tmp_path, test_config):
    # Equal-length result paths: DCP's metadata holds the checkpoint path, so file sizes depend on it.
    local_cfg = _conformance_config(tmp_path, test_config, "L", "local")
    seq_cfg = _conformance_config(tmp_path, test_config, "S", "local")
    _run_app(study, local_cfg, _env(HPCDL_RUNTIME="local"))
    # Sequential mode runs tasks in the main process: give torch the threads a local worker gets.
    units = str(CONFIGURED_UNITS[study]) if study in ("checkpoint", "hpo", "offload") else "1"
    proc = _run_app(study, seq_cfg, _env(BINDING, REPO, HPCDL_RUNTIME="pycompss",
                                         OMP_NUM_THREADS=units))
    assert f"[{study}] task backend pycompss-sequential" in proc.stderr
    local_raw, seq_raw = tmp_path / "L" / study / "raw", tmp_path / "S" / study / "raw"
    for name in assert_same_raw_tables(seq_raw, local_raw):
        sidecar = json.loads((seq_raw / name.replace(".csv", ".provenance.json")).read_text())
        assert sidecar["runtime"]["name"] == "pycompss-sequential"
        assert sidecar["runtime"]["pycompss_api"] == "3.x"
        local_sidecar = json.loads((local_raw / name.replace(".csv", ".provenance.json")).read_text())
        assert local_sidecar["runtime"]["name"] == "local"


@pytest.mark.slow
@pytest.mark.parametrize("study", STUDIES)
def test_master_context_registers_every_task_with_its_constraints(study, tmp_path, test_config):
    cfg = _conformance_config(tmp_path, test_config, "master", "compss")
    out = tmp_path / "recorded.json"
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "pycompss_master.py"), str(BINDING), study,
                           str(cfg), str(out)], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads(out.read_text())
    intended = INTENDED[study]
    assert sorted(rec["tasks"]) == sorted(intended), "a task was added or removed: update INTENDED"
    on_cpu = set(intended) - CUDA_ONLY.get(study, set())
    assert set(rec["submitted"]) == on_cpu, "every task (but the CUDA-only ones) must be called at least once"
    env = rec["units_env"]
    # GPUs per task: the study's tasks hold them where its device (auto here) resolves to cuda
    from hpcdl.platform.kit.config import load_config
    from hpcdl.platform.orchestration.task_runtime.gpus import declared_gpus, gpus_var, task_gpus

    loaded = load_config(cfg)
    gpu_study, gpus = declared_gpus(study, loaded) > 0, task_gpus(study, loaded)
    if gpu_study:
        assert env[gpus_var(study)] == str(gpus), env
    by_signature = {r["signature"]: r for r in rec["registered"]}
    for task, (units, on_failure) in intended.items():
        if task not in on_cpu:  # the binding registers a task at its first call
            assert f"tasks.{study}.{task}" not in by_signature, task
            continue
        reg = by_signature[f"tasks.{study}.{task}"]
        cores = CONFIGURED_UNITS[study] if units == "study" else units
        reading = _runtime_reading(reg["constraints"], env)
        assert reading == {"CPU": cores, **({"GPU": gpus} if gpus else {})}, (task, reg["constraints"], env)
        if gpu_study:
            # the GPU count travels by its variable: a runtime started with 3 gives each task 3
            three = {**env, gpus_var(study): "3"}
            assert _runtime_reading(reg["constraints"], three) == {"CPU": cores, "GPU": 3}
        actions = {p["on_failure"] for p in rec["processed"] if p["signature"] == f"tasks.{study}.{task}"}
        assert actions == {on_failure}, (task, actions)
    # The app finished with the binding's objects in place: its raw tables exist, no failed point.
    raw = tmp_path / "master" / study / "raw"
    for table in raw.glob("*.csv"):
        df = pd.read_csv(table)
        if "status" in df:
            assert (df["status"] == "ok").all(), (table.name, df.get("error"))
        sidecar = json.loads(table.with_name(table.stem + ".provenance.json").read_text())
        assert sidecar["runtime"]["name"] == "compss"
    assert any(raw.glob("*.csv"))


def _detect_in_subprocess(setup: str, env: dict | None = None) -> dict:
    code = (f"import sys; sys.path[:0] = [{str(BINDING)!r}, {str(REPO)!r}]\n{setup}\n"
            "import json, hpcdl.platform.orchestration.task_runtime as r\n"
            "print(json.dumps({**r.BACKEND_INFO.as_dict(), 'task': r.task.__module__}))")
    proc = subprocess.run([sys.executable, "-c", code], env=env or _env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_detection_picks_compss_in_the_master_context():
    info = _detect_in_subprocess("from pycompss.util.context import CONTEXT; CONTEXT.set_master()")
    assert info["name"] == "compss" and info["pycompss_api"] == "3.x"
    assert info["task"] == "pycompss.api.task"


def test_detection_picks_compss_in_the_worker_context():
    info = _detect_in_subprocess("from pycompss.util.context import CONTEXT; CONTEXT.set_worker()")
    assert info["name"] == "compss" and info["task"] == "pycompss.api.task"


def test_detection_picks_local_outside_the_runtime_even_with_the_binding_importable():
    info = _detect_in_subprocess("")
    assert info["name"] == "local" and info["pycompss_importable"] is True
    assert "not running under the COMPSs runtime" in info["why"]
    assert info["task"] == "hpcdl.platform.orchestration.task_runtime.local"


def test_forced_pycompss_outside_the_runtime_is_the_sequential_binding():
    info = _detect_in_subprocess("", _env(HPCDL_RUNTIME="pycompss"))
    assert info["name"] == "pycompss-sequential" and info["task"] == "pycompss.api.task"


def test_detection_uses_the_2x_module_function_when_there_is_no_context_object(tmp_path):
    """PyCOMPSs 2.x exposed `pycompss.util.context.in_pycompss()`: a package with only that API."""
    ctx = tmp_path / "old" / "pycompss" / "util"
    ctx.mkdir(parents=True)
    (ctx.parent / "__init__.py").write_text("")
    (ctx / "__init__.py").write_text("")
    (ctx / "context.py").write_text("import os\n\ndef in_pycompss():\n"
                                    "    return os.environ.get('FAKE_SCOPE') == 'master'\n")
    backend_py = str(REPO / "hpcdl" / "platform" / "orchestration" / "task_runtime" / "backend.py")
    code = (f"import sys, importlib.util; sys.path.insert(0, {str(tmp_path / 'old')!r})\n"
            f"spec = importlib.util.spec_from_file_location('b', {backend_py!r})\n"
            "b = sys.modules['b'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)\n"
            "print(b.detect().name, b.detect().pycompss_api)")
    for scope, expected in (("master", "compss 2.x"), ("", "local 2.x")):
        proc = subprocess.run([sys.executable, "-c", code], env=_env(FAKE_SCOPE=scope), capture_output=True,
                              text=True, timeout=60)
        assert proc.stdout.strip() == expected, proc.stderr
