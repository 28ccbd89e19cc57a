"""Run one task app in the PyCOMPSs binding's master context, its C extension replaced by a recorder.

    python tests/pycompss_master.py BINDING_DIR STUDY CONFIG OUT_JSON

As `runcompss` does before it runs an app, the binding is put in its master context; the
environment gets the computing-units and GPU assignments the generated runcompss command sets
(its `device: auto` resolved here, as the rule's shell would on this host). Every
task call then goes through the binding's own decorators (argument validation, core-element
registration, task submission), which reach the recorder instead of the Java runtime. Since no
runtime executes the submitted task, the call also runs the task's function inline and hands its
value back, so the app carries on to its next tasks, as it would once COMPSs had run them.
OUT_JSON gets the recorded registrations and submissions.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Recorder:
    """Stands in for the binding's `compss` C extension: records every call it gets."""

    def __init__(self, working_dir: str):
        self.calls: list[tuple[str, tuple]] = []
        self.working_dir = working_dir

    def __getattr__(self, name):
        def record(*args):
            self.calls.append((name, args))
            if name in ("get_master_working_path", "get_logging_path"):
                return self.working_dir
            if name == "read_pipes":
                return ""
            return None
        return record


def main(binding: str, study: str, config: str, out_json: str) -> None:
    sys.path[:0] = [binding, str(REPO)]
    from pycompss.runtime.management.COMPSs import COMPSs
    from pycompss.util.context import CONTEXT

    CONTEXT.set_master()
    recorder = Recorder(tempfile.mkdtemp(prefix="pycompss-master-"))
    COMPSs.compss = recorder

    from hpcdl.platform.kit.config import load_config
    from hpcdl.platform.orchestration.task_runtime.compss import gpus_assignments, units_assignments

    cfg = load_config(config)
    words = units_assignments(study, cfg, resolve_now=True) + gpus_assignments(study, cfg, resolve_now=True)
    for word in words:
        name, value = word.split("=", 1)
        os.environ[name] = value

    from hpcdl.platform.orchestration import task_runtime

    assert task_runtime.BACKEND == "compss", task_runtime.BACKEND_INFO
    app = importlib.import_module(f"tasks.{study}")
    tasks = {name: obj for name, obj in vars(app).items()
             if inspect.isfunction(obj) and obj.__module__ == app.__name__ and hasattr(obj, "__wrapped__")}
    submitted: list[str] = []

    def through_binding(name, decorated):
        user_function = inspect.unwrap(decorated)

        def call(*args, **kwargs):
            future = decorated(*args, **kwargs)
            if type(future).__name__ != "Future":
                raise AssertionError(f"task {name} returned {type(future).__name__}, not a binding Future")
            submitted.append(name)
            return user_function(*args, **kwargs)
        return call

    for name, decorated in tasks.items():
        setattr(app, name, through_binding(name, decorated))
    app.compss_wait_on = lambda *objs, **_: objs[0] if len(objs) == 1 else list(objs)
    app.main(["--config", config])

    registered = [{"signature": a[0], "impl_signature": a[1], "constraints": a[2], "type": a[3]}
                  for name, a in recorder.calls if name == "register_core_element"]
    processed = [{"signature": a[1], "on_failure": a[2], "num_returns": a[11]}
                 for name, a in recorder.calls if name == "process_task"]
    env = {k: v for k, v in os.environ.items() if k.startswith("HPCDL_") and k.endswith(("_UNITS", "_GPUS"))}
    Path(out_json).write_text(json.dumps({"tasks": sorted(tasks), "submitted": submitted,
                                          "registered": registered, "processed": processed,
                                          "units_env": env}, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:5])
