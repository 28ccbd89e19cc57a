"""Backend choice without the PyCOMPSs binding: forced choices, clear refusals, provenance.

(With the binding, detection in and out of the COMPSs context: tests/test_pycompss_conformance.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from hpcdl.platform.kit.procenv import child_env
from hpcdl.platform.orchestration.task_runtime.app import RuntimeSelectionError, check_backend
from hpcdl.platform.orchestration.task_runtime.backend import BackendInfo, backend_info, detect
from hpcdl.platform.orchestration.task_runtime.units import UnitsError, apply_units, resolve

REPO = Path(__file__).resolve().parent.parent


def _no_binding_env(**extra) -> dict:
    """This environment without HPCDL_ settings and without a PyCOMPSs binding on PYTHONPATH (carried
    packages stay: the GPU image needs them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCDL_")}
    binding = [e for e in env.get("PYTHONPATH", "").split(os.pathsep)
               if e and (Path(e) / "pycompss").is_dir()]
    return child_env(base=env, drop=binding, HPCDL_PROGRESS="0", **extra)


def test_without_the_binding_the_local_backend_is_chosen_and_says_why():
    try:
        import pycompss  # noqa: F401
        pytest.skip("PyCOMPSs is importable in this environment")
    except ImportError:
        pass
    info = detect({})
    assert info.name == "local" and info.pycompss_importable is False and info.pycompss_api is None
    assert "PyCOMPSs is not importable" in info.why


def test_a_bad_forced_backend_names_the_variable():
    with pytest.raises(ValueError, match=r"HPCDL_RUNTIME='mpi' is not allowed; allowed: local, pycompss"):
        detect({"HPCDL_RUNTIME": "mpi"})


def test_forcing_pycompss_without_the_binding_is_an_error():
    with pytest.raises(ValueError, match="HPCDL_RUNTIME=pycompss but PyCOMPSs is not importable"):
        detect({"HPCDL_RUNTIME": "pycompss"})


def test_runtime_compss_refused_on_any_other_backend():
    cfg = {"checkpoint": {"runtime": "compss"}}
    local = BackendInfo("local", True, "3.x", None, "PyCOMPSs 3.x context API: not running under the "
                                                    "COMPSs runtime")
    with pytest.raises(RuntimeSelectionError, match=r"'checkpoint.runtime' is 'compss' but the local backend "
                                                    r"was selected \(.*not running under the COMPSs runtime"):
        check_backend("checkpoint", cfg, local)
    check_backend("checkpoint", cfg, BackendInfo("compss", True, "3.x", None, "inside"))
    check_backend("checkpoint", {"checkpoint": {"runtime": "local"}}, local)


def test_task_app_with_runtime_compss_exits_2_and_writes_nothing(write_config, tmp_path):
    cfg = write_config(checkpoint={"runtime": "compss"})
    proc = subprocess.run([sys.executable, "-m", "tasks.checkpoint", "--config", str(cfg)], cwd=REPO,
                          env=_no_binding_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "'checkpoint.runtime' is 'compss' but the local backend was selected" in proc.stderr
    assert "PyCOMPSs is not importable" in proc.stderr
    assert not (tmp_path / "results" / "checkpoint" / "raw").exists()


def test_units_must_match_what_the_compss_runtime_started_with(monkeypatch):
    grid = {"world_sizes": [2, 4], "qs": [0], "partitionings": ["random"]}
    cfg = {"shuffle": {"seeds": [0], "grids": [grid], "kakurenbo": {"fractions": [0], "world_size": 2}}}
    monkeypatch.delenv("HPCDL_SHUFFLE_UNITS", raising=False)
    with pytest.raises(UnitsError, match=r"started with HPCDL_SHUFFLE_UNITS=None but the shuffle config "
                                         r"needs 4.*start runcompss with HPCDL_SHUFFLE_UNITS=4"):
        apply_units("shuffle", cfg, "compss")
    monkeypatch.setenv("HPCDL_SHUFFLE_UNITS", "4")
    assert apply_units("shuffle", cfg, "compss") == 4
    monkeypatch.delenv("HPCDL_SHUFFLE_UNITS")
    assert apply_units("shuffle", cfg, "local") == 4 and os.environ["HPCDL_SHUFFLE_UNITS"] == "4"


@pytest.mark.parametrize("value, message", [("$NOPE_UNSET", "NOPE_UNSET, which is not set"),
                                            ("0", "is not a core count"), ("two", "is not a core count")])
def test_bad_units_settings_name_the_key(value, message):
    with pytest.raises(UnitsError, match=rf"hpo.computing_units=.*{message}"):
        resolve(value, "hpo.computing_units", environ={})
    assert resolve("${CORES}", "k", environ={"CORES": "3"}) == 3


def test_provenance_records_the_backend_and_derived_tables_their_tasks_backend(tmp_path):
    from hpcdl.platform.kit.results import write_table

    backend_info()  # as every task app does first (start_app): the runtime records its choice
    started = time.time()
    raw = write_table(pd.DataFrame({"x": [1]}), tmp_path / "s" / "raw" / "points.csv", {"a": 1}, started)
    side = json.loads(raw.with_name("points.provenance.json").read_text())
    assert side["runtime"]["name"] == "local" and "why" in side["runtime"]
    assert set(side["runtime"]) == {"name", "pycompss_importable", "pycompss_api", "pycompss_version", "why"}
    derived = write_table(pd.DataFrame({"x": [1]}), tmp_path / "s" / "tables" / "t.csv", {"a": 1}, started)
    side = json.loads(derived.with_name("t.provenance.json").read_text())
    raw_runtime = json.loads(raw.with_name("points.provenance.json").read_text())["runtime"]
    assert side["task_runtime"] == [raw_runtime]


def test_a_process_that_chose_no_task_backend_writes_no_runtime(tmp_path):
    """The study wing never asks the task runtime: a table written where no task app chose a backend
    (a stage, a notebook) names none; once the runtime has chosen, the next table names it."""
    code = ("import json, sys, pandas as pd\n"
            "from hpcdl.platform.kit.results import write_table\n"
            "def side(name):\n"
            "    p = write_table(pd.DataFrame({'x': [1]}), f'{sys.argv[1]}/{name}.csv', {'a': 1}, 0.0)\n"
            "    return json.loads(p.with_name(f'{name}.provenance.json').read_text())\n"
            "before = side('before')\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('hpcdl.platform.orchestration'))\n"
            "from hpcdl.platform.orchestration.task_runtime.backend import backend_info\n"
            "backend_info()\n"
            "print(json.dumps({'before': before.get('runtime'), 'loaded': loaded, "
            "'after': side('after').get('runtime')}))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=child_env(REPO),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] is None and got["loaded"] == []
    assert got["after"]["name"] == "local" and "why" in got["after"]
