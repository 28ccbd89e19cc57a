"""The environment a child process starts with: the caller's, with paths put in front of PYTHONPATH.

Every subprocess the project starts (task apps, ranks, drivers, tests) builds its environment here.
Replacing PYTHONPATH instead of prepending to it loses whatever the caller put there: on the GPU image
the packages carried by `make gpu-carry` live on PYTHONPATH, so a child without them cannot import
jsonschema or pandas (docs/architecture.md, "Devices").
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

# The folder holding the hpcdl package: children started by the library find it whatever the install.
PACKAGE_ROOT = Path(__file__).resolve().parents[3]


def pythonpath(*prepend: str | Path, base: str | None = None, drop: Iterable[str | Path] = ()) -> str:
    """`prepend` in front of `base` (default: this process's PYTHONPATH), without repeats or `drop`."""
    rest = os.environ.get("PYTHONPATH", "") if base is None else base
    dropped = {os.path.abspath(str(p)) for p in drop}
    entries: list[str] = []
    for entry in [*(str(p) for p in prepend), *rest.split(os.pathsep)]:
        if entry and entry not in entries and os.path.abspath(entry) not in dropped:
            entries.append(entry)
    return os.pathsep.join(entries)


def child_env(*prepend: str | Path, base: Mapping[str, str] | None = None, drop: Iterable[str | Path] = (),
              **overrides: str) -> dict[str, str]:
    """A copy of `base` (default os.environ) with `prepend` in front of its PYTHONPATH, then `overrides`.

    PYTHONPATH may not be an override: that is the replacement this helper exists to prevent.
    """
    if "PYTHONPATH" in overrides:
        raise ValueError("child_env: pass PYTHONPATH entries positionally (they are prepended), "
                         "not as PYTHONPATH=... (which would replace the caller's)")
    env = dict(os.environ if base is None else base)
    path = pythonpath(*prepend, base=env.get("PYTHONPATH", ""), drop=drop)
    if path:
        env["PYTHONPATH"] = path
    else:
        env.pop("PYTHONPATH", None)
    env.update({k: str(v) for k, v in overrides.items()})
    return env
