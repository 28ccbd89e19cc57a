"""Importing hpcdl changes no process-wide setting (#39): every module imported in a fresh interpreter
leaves the environment, warning filters, start method, signal dispositions, umask and torch's
settings as they were, and the malleable study's forkserver preload is set when the study starts its
first job, not when its module is imported."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from hpcdl.platform.kit.procenv import child_env

REPO = Path(__file__).resolve().parent.parent
HPCDL = REPO / "hpcdl"
# entry points (run, never imported) and the forkserver preamble whose import is its whole purpose
NOT_IMPORTED = {"hpcdl.__main__", "hpcdl.studies.malleable._preload"}

PROBE = '''
import sys

def preloaded(conn):
    conn.send("hpcdl.studies.malleable.job" in sys.modules)
'''

SCRIPT = '''
import importlib, json, multiprocessing, os, signal, sys, warnings
import torch

def state():
    mask = os.umask(0)
    os.umask(mask)
    return {"environ": dict(os.environ), "filters": [repr(f) for f in warnings.filters],
            "start_method": multiprocessing.get_start_method(allow_none=True),
            "signals": {s: repr(signal.getsignal(getattr(signal, s)))
                        for s in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGPIPE")},
            "umask": mask, "threads": torch.get_num_threads(), "dtype": str(torch.get_default_dtype())}

def forkserver_preloaded():
    import probe
    ctx = multiprocessing.get_context("forkserver")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=probe.preloaded, args=(send,))
    proc.start()
    got = recv.recv()
    proc.join()
    return got

if __name__ == "__main__":
    for name in THIRD_PARTY:  # what the libraries themselves set at import is theirs, not hpcdl's
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    before = state()
    for name in MODULES:
        importlib.import_module(name)
    after = state()
    changed = sorted(k for k in before if before[k] != after[k])
    detail = {k: [before[k], after[k]] for k in changed if k != "environ"}
    if "environ" in changed:
        detail["environ"] = sorted(set(before["environ"].items()) ^ set(after["environ"].items()))
    print(json.dumps({"changed": detail, "preloaded": forkserver_preloaded(), "imported": len(MODULES)}))
'''


def _modules() -> list[str]:
    names = []
    for f in sorted(HPCDL.rglob("*.py")):
        parts = f.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name not in NOT_IMPORTED:
            names.append(name)
    return names


def _third_party() -> list[str]:
    """Every module outside hpcdl that hpcdl imports anywhere (the baseline is taken after them)."""
    names = set()
    for f in HPCDL.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
    return sorted(n for n in names if n.split(".")[0] not in ("hpcdl", "__future__"))


def _run(tmp_path: Path, extra: str = "") -> dict:
    (tmp_path / "probe.py").write_text(PROBE)
    script = tmp_path / "imports.py"
    body = SCRIPT.replace('if __name__ == "__main__":\n', f'if __name__ == "__main__":\n{extra}')
    script.write_text(f"MODULES = {_modules()!r}\nTHIRD_PARTY = {_third_party()!r}\n" + body)
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, env=child_env(REPO, tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_every_module_changes_no_process_wide_setting(tmp_path):
    out = _run(tmp_path)
    assert out["imported"] > 150  # every module, not a few
    assert out["changed"] == {}
    assert out["preloaded"] is False


def test_the_probe_sees_a_forkserver_preload_where_one_is_set(tmp_path):
    """The check above can fail: once the malleable study has set its preload (as its first job
    does, and as importing its forkserver module used to), the forkserver's children hold the job
    module before they import anything."""
    out = _run(tmp_path, "    importlib.import_module('hpcdl.studies.malleable.forkserver')._context()\n")
    assert out["preloaded"] is True


def test_result_files_take_the_umask_of_the_first_write_not_of_the_import(tmp_path):
    """The atomic writer reads the umask when it first writes (reading it used to set it, at import)."""
    code = ("import os, sys\nfrom hpcdl.platform.kit.atomic import atomic_write_bytes\nos.umask(0o027)\n"
            "p = atomic_write_bytes(sys.argv[1], b'x')\nprint(oct(os.stat(p).st_mode & 0o777))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "f.bin")], cwd=REPO,
                         env=child_env(REPO), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "0o640"


def _loaded_after(statement: str) -> list[str]:
    """The hpcdl modules a fresh interpreter holds after running `statement`."""
    code = (f"import json, sys\n{statement}\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('hpcdl'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(REPO), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_config_module_loads_no_study():
    """The list of studies is a function (config.studies()), so importing the config module (as every
    task app, stage and rank that validates a block does) imports none of the eight study packages;
    asking for the list does."""
    assert not [m for m in _loaded_after("import hpcdl.platform.kit.config") if m.startswith("hpcdl.studies")]
    after_call = _loaded_after("from hpcdl.platform.kit.config import studies\nstudies()")
    assert "hpcdl.studies.checkpoint" in after_call and "hpcdl.studies.spatial" in after_call


def test_the_platforms_face_loads_each_name_on_first_use():
    """`import hpcdl.platform` loads nothing behind it; asking for one name loads that name's module
    (and what it imports), not the rest of the study wing."""
    assert _loaded_after("import hpcdl.platform") == ["hpcdl", "hpcdl.platform"]
    loaded = _loaded_after("from hpcdl.platform import failed_because")
    assert "hpcdl.platform.kit.stages" in loaded
    others = {"config", "claims", "points", "results", "rank_runtime.launch"}
    assert not {f"hpcdl.platform.kit.{m}" for m in others} & set(loaded)
