"""The platform as a study sees it: `from hpcdl.platform import write_table, claim, ...`.

The platform has two wings (docs/architecture.md, "Layers"):

- `hpcdl.platform.kit`: what a study may use: config types, tables and their provenance, claims and
  intervals, device records, the point store, what the analysis stages share, the study declaration,
  a child process's environment and the rank runtime;
- `hpcdl.platform.orchestration`: what runs the studies: the CLI, the rules' wiring, Slurm, the
  verdict and the report pages, and the task runtime. It may use the kit; the kit never uses it.

This module is the one door studies (hpcdl/studies/) and shared code (hpcdl/common/) go through: it
exports exactly the kit's names they use, and nothing of the orchestration wing
(tests/test_layering.py checks both). Each name is imported from its module on first use, so
`import hpcdl.platform` loads nothing else; type checkers read the imports below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcdl.platform.kit.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
    from hpcdl.platform.kit.claims import claim, every, not_measured
    from hpcdl.platform.kit.config import ConfigError, check_inside, load_config
    from hpcdl.platform.kit.confirmation import confirmed_on, deterministic, measured_afresh, unseeded
    from hpcdl.platform.kit.device import Placement, cuda_record, gpu_slug
    from hpcdl.platform.kit.host_load import HostLoad, machine_cpu_s, other_load_cores
    from hpcdl.platform.kit.intervals import (
        CONFIDENCE,
        above,
        all_of,
        any_of,
        at_best_straddles,
        below,
        interval_for,
        mean_interval,
        paired,
        proportion_interval,
    )
    from hpcdl.platform.kit.procenv import PACKAGE_ROOT, child_env
    from hpcdl.platform.kit.rank_runtime.launch import run_ranks
    from hpcdl.platform.kit.rank_runtime.placement import current as current_placement
    from hpcdl.platform.kit.results import (
        config_hash,
        cpu_model,
        git_commit,
        mark_no_data,
        read_table,
        save_figure,
        write_table,
    )
    from hpcdl.platform.kit.sidecars import provenance_path
    from hpcdl.platform.kit.stages import (
        FAILURE_COLUMNS,
        failed_because,
        failures_table,
        last_error_line,
        ok_rows,
        pyplot,
        read_or_empty,
        read_tables,
        started_at,
        why_point_missing,
    )
    from hpcdl.platform.kit.study import Ours, RunFiles, StudySpec, computing_units_of
    from hpcdl.platform.kit.study_dir import StudyDir

# The face, written once: per group, kit module -> the names exported from it. EXPORTS and __all__
# follow from it; tests/test_layering.py checks the TYPE_CHECKING imports above against it.
FACE: dict[str, dict[str, tuple[str, ...]]] = {
    "what a study declares": {
        "study": ("Ours", "RunFiles", "StudySpec", "computing_units_of"),
        "confirmation": ("confirmed_on", "deterministic", "measured_afresh", "unseeded"),
        "config": ("ConfigError", "check_inside", "load_config"),
    },
    "what a stage writes": {
        "study_dir": ("StudyDir",),
        "results": ("config_hash", "cpu_model", "git_commit", "mark_no_data", "read_table", "save_figure",
                    "write_table"),
        "sidecars": ("provenance_path",),
        "stages": ("FAILURE_COLUMNS", "failed_because", "failures_table", "last_error_line", "ok_rows",
                   "pyplot", "read_or_empty", "read_tables", "started_at", "why_point_missing"),
        "claims": ("claim", "every", "not_measured"),
        "intervals": ("CONFIDENCE", "above", "all_of", "any_of", "at_best_straddles", "below", "interval_for",
                      "mean_interval", "paired", "proportion_interval"),
        "atomic": ("atomic_write_bytes", "atomic_write_json", "atomic_write_text"),
    },
    "what a run uses": {
        "device": ("Placement", "cuda_record", "gpu_slug"),
        "procenv": ("PACKAGE_ROOT", "child_env"),
        "rank_runtime.launch": ("run_ranks",),
        "rank_runtime.placement": ("current_placement",),
        "host_load": ("HostLoad", "machine_cpu_s", "other_load_cores"),
    },
}
# names the face gives apart from their module's (a bare `current` says nothing here)
_RENAMED = {"current_placement": "current"}


def _lazy_names(namespace: dict, table: dict, renamed: dict, prefix: str = "", uncached=()):
    """(EXPORTS, __getattr__, __dir__) of a door module whose names come from `table` (group -> module
    -> names; `prefix` + module is the module's dotted name): each imported on first use and then kept
    in `namespace`, but for the `uncached` ones, asked for anew each time."""
    exports = {name: (prefix + module, renamed.get(name, name))
               for modules in table.values() for module, names in modules.items() for name in names}

    def get(name: str):
        try:
            module, attr = exports[name]
        except KeyError:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), attr)
        if name not in uncached:
            namespace[name] = value  # later lookups skip __getattr__
        return value

    def names() -> list[str]:
        return sorted({*namespace, *exports})
    return exports, get, names


# face name -> (module, attribute)
EXPORTS, __getattr__, __dir__ = _lazy_names(globals(), FACE, _RENAMED, "hpcdl.platform.kit.")
__all__ = sorted(EXPORTS)
