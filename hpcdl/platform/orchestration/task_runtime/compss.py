"""Command lines that run a study's task app: plain Python locally, runcompss/enqueue_compss under COMPSs.

The COMPSs runtime cannot be installed on the build machines, so everything here only *builds*
commands (unit-tested flag by flag); Snakemake's `<study>_run` rule executes the string.

Under `runtime: compss` each rule gets its own directory `<results_dir>/<study>/compss/<rule>/` holding
the generated project/resources XML, the COMPSs logs (`log/`, via --specific_log_dir, so no shared
~/.COMPSs sandbox) and the worker working dir (`worker/`): two rules never share one.
The worker's computing units default to what Slurm granted the step (SLURM_CPUS_PER_TASK), else nproc,
resolved when the rule runs.

The tasks' `computing_units` ("$HPCDL_<STUDY>_UNITS", hpcdl.platform.orchestration.task_runtime.units) and,
for a study whose tasks can hold GPUs, their GPUs ("$HPCDL_<STUDY>_GPUS",
hpcdl.platform.orchestration.task_runtime.gpus, which says where `device: auto` is resolved) are read by
COMPSs from its own environment when it starts, so every generated command sets them in front of runcompss /
enqueue_compss. Such a study's generated resources.xml offers the node's visible GPUs; its enqueue_compss job
asks for them (--gpus_per_node).

    python -m hpcdl compss command STUDY --config FILE      # print the rule's runcompss command
    python -m hpcdl compss enqueue STUDY --config FILE      # print the enqueue_compss equivalent
    python -m hpcdl compss xml --out DIR --cpus N [--gpus N|visible]  # write DIR/project.xml, resources.xml
    python -m hpcdl compss gpus STUDY --config FILE         # print GPUs per task of STUDY on this host
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[4]
RUNTIMES = ("local", "compss")
# Resolved by the shell when the rule runs: the CPUs Slurm gave this step, else every core.
RUNTIME_CPUS = "${SLURM_CPUS_PER_TASK:-$(nproc)}"

# Top-level `compss:` block (configs/schema/compss.yaml); defaults for configs without one.
COMPSS_DEFAULTS = {
    "python_interpreter": "python3",
    "log_level": "off",
    "computing_units": None,        # None: SLURM_CPUS_PER_TASK or nproc at run time
    "project_xml": None,            # site-provided XML replaces the generated pair
    "resources_xml": None,
    "extra_flags": [],
    # enqueue_compss only
    "num_nodes": 1,
    "exec_time_min": 60,
    "cpus_per_node": 48,
    "queue": None,
    "qos": None,
    "project_name": None,
}


def _config_error(key: str, value, allowed: str) -> Exception:
    from hpcdl.platform.kit.config import ConfigError  # lazy: keeps this module importable on its own

    return ConfigError(key, value, allowed)


def study_runtime(study: str, cfg: dict) -> str:
    runtime = (cfg.get(study) or {}).get("runtime", "local")
    if runtime not in RUNTIMES:
        raise _config_error(f"{study}.runtime", runtime, ", ".join(RUNTIMES))
    return runtime


def compss_options(cfg: dict) -> dict:
    opts = dict(COMPSS_DEFAULTS)
    block = cfg.get("compss") or {}
    unknown = sorted(set(block) - set(COMPSS_DEFAULTS))
    if unknown:
        raise _config_error(f"compss.{unknown[0]}", block[unknown[0]], ", ".join(COMPSS_DEFAULTS))
    opts.update(block)
    if (opts["project_xml"] is None) != (opts["resources_xml"] is None):
        key = "compss.resources_xml" if opts["resources_xml"] is None else "compss.project_xml"
        raise _config_error(key, None, "set project_xml and resources_xml together, or neither")
    cu = opts["computing_units"]
    if cu is not None and (not isinstance(cu, int) or isinstance(cu, bool) or cu < 1):
        raise _config_error("compss.computing_units", cu, "an integer >= 1, or null (use Slurm's grant)")
    return opts


def rule_dir(study: str, cfg: dict, rule: str | None = None) -> Path:
    """Absolute per-rule COMPSs directory (absolute: runcompss resolves paths from its own cwd)."""
    return Path(os.path.abspath(Path(cfg.get("results_dir", "results")) / study / "compss"
                                / (rule or f"{study}_run")))


def app_path(study: str) -> Path:
    return REPO_ROOT / "tasks" / f"{study}.py"


def local_command(study: str, config_path: str) -> list[str]:
    return ["python", "-m", f"tasks.{study}", "--config", str(config_path)]


def runcompss_command(study: str, config_path: str, cfg: dict, *, rule: str | None = None) -> list[str]:
    """runcompss argv for one rule (XML files under rule_dir must exist: see xml_command)."""
    opts = compss_options(cfg)
    rdir = rule_dir(study, cfg, rule)
    if opts["project_xml"]:
        project, resources = opts["project_xml"], opts["resources_xml"]
    else:
        project, resources = rdir / "project.xml", rdir / "resources.xml"
    return ["runcompss", "--lang=python",
            f"--project={project}", f"--resources={resources}",
            f"--specific_log_dir={rdir / 'log'}",
            f"--pythonpath={REPO_ROOT}",
            f"--python_interpreter={opts['python_interpreter']}",
            f"--log_level={opts['log_level']}", "--summary",
            *opts["extra_flags"],
            str(app_path(study)), "--config", str(config_path)]


def _may_hold_gpus(study: str, cfg: dict) -> bool:
    from hpcdl.platform.kit.device import requested
    from hpcdl.platform.orchestration.task_runtime.gpus import declared_gpus

    return bool(declared_gpus(study, cfg)) and requested(cfg, study) != "cpu"


def xml_command(study: str, cfg: dict, *, rule: str | None = None) -> str:
    """Shell snippet writing the rule's project/resources XML; computing units (and, for a study whose
    tasks may hold GPUs, the node's visible GPUs) resolved at run time."""
    opts = compss_options(cfg)
    rdir = rule_dir(study, cfg, rule)
    cpus = str(opts["computing_units"]) if opts["computing_units"] else f'"{RUNTIME_CPUS}"'
    gpus = " --gpus visible" if _may_hold_gpus(study, cfg) else ""
    return (f"python -m hpcdl compss xml --out {shlex.quote(str(rdir))} "
            f"--working-dir {shlex.quote(str(rdir / 'worker'))} --cpus {cpus}{gpus}")


def units_assignments(study: str, cfg: dict, *, resolve_now: bool = False) -> list[str]:
    """`NAME=value` shell words for the tasks' computing_units variables.

    A "$VAR" setting stays "${VAR}" (double-quoted, expanded by the shell that runs the rule, e.g.
    on the Slurm node); with resolve_now it is read from this process's environment instead.
    """
    from hpcdl.platform.orchestration.task_runtime.units import resolve, task_units, units_exports, units_var

    if resolve_now:
        value = resolve(task_units(study, cfg), f"{study}.computing_units")
        return [f"{units_var(study)}={value}"]
    return [f'{name}="{word}"' if word.startswith("$") else f"{name}={word}"
            for name, word in units_exports(study, cfg).items()]


def gpus_assignments(study: str, cfg: dict, config_path: str | None = None, *,
                     resolve_now: bool = False) -> list[str]:
    """`NAME=value` shell words for the tasks' GPU variable (none for a study whose tasks hold none).

    `device: auto` stays a command substitution the shell that runs the rule evaluates where the tasks run
    (hpcdl.platform.orchestration.task_runtime.gpus); with resolve_now it is resolved in this process.
    """
    from hpcdl.platform.orchestration.task_runtime.gpus import (
        declared_gpus,
        gpus_exports,
        gpus_var,
        task_gpus,
    )

    if resolve_now:
        return [f"{gpus_var(study)}={task_gpus(study, cfg)}"] if declared_gpus(study, cfg) else []
    return [f'{name}="{word}"' if word.startswith("$") else f"{name}={word}"
            for name, word in gpus_exports(study, cfg, str(config_path)).items()]


def task_app_command(study: str, config_path: str, cfg: dict, *, rule: str | None = None) -> str:
    """The shell command for `<study>_run`: local Python, or runcompss per `<study>.runtime`."""
    if study_runtime(study, cfg) == "local":
        return shlex.join(local_command(study, config_path))
    # runcompss may start the app from another directory: hand it an absolute config path.
    config_path = os.path.abspath(config_path)
    run = " ".join([*units_assignments(study, cfg), *gpus_assignments(study, cfg, config_path),
                    shlex.join(runcompss_command(study, config_path, cfg, rule=rule))])
    if compss_options(cfg)["project_xml"]:
        return run
    # A subshell, so a redirect the rule appends covers both steps.
    return f"({xml_command(study, cfg, rule=rule)} && {run})"


def enqueue_gpus(study: str, cfg: dict) -> tuple[int, str | None]:
    """(GPUs per task, the --gpus_per_node flag to add or None) of an enqueue_compss job.

    The command runs on the submitting host and the job has GPUs only if it asks for them, so
    `auto` means GPUs exactly when compss.extra_flags asks for --gpus_per_node >= 1; `cuda` asks
    for one GPU per task's GPU itself unless extra_flags already does.
    """
    from hpcdl.platform.kit.device import DEVICES, requested
    from hpcdl.platform.orchestration.task_runtime.gpus import declared_gpus

    declared = declared_gpus(study, cfg)
    if not declared:
        return 0, None
    want = requested(cfg, study)
    if want not in DEVICES:
        raise _config_error(f"{study}.device", want, ", ".join(DEVICES))
    given = [f for f in compss_options(cfg)["extra_flags"] if f.startswith("--gpus_per_node=")]
    asked = given[-1].split("=", 1)[1] if given else None
    if asked is not None and not asked.isdigit():
        raise _config_error("compss.extra_flags", given[-1], "--gpus_per_node=<integer >= 0>")
    gpus = declared if want == "cuda" or (want == "auto" and asked is not None and int(asked) >= 1) else 0
    if gpus and asked is not None and int(asked) < gpus:
        raise _config_error("compss.extra_flags", given[-1],
                            f"--gpus_per_node={gpus} or more: each {study} task holds {gpus} GPU(s)")
    return gpus, (f"--gpus_per_node={gpus}" if gpus and asked is None else None)


def enqueue_compss_command(study: str, config_path: str, cfg: dict, *, rule: str | None = None) -> list[str]:
    """The enqueue_compss equivalent: COMPSs submits its own Slurm job (no Snakemake around it)."""
    from hpcdl.platform.orchestration.task_runtime.gpus import declared_gpus, gpus_var

    opts = compss_options(cfg)
    rdir = rule_dir(study, cfg, rule)
    cpus = opts["computing_units"] or opts["cpus_per_node"]
    gpus, gpu_flag = enqueue_gpus(study, cfg)
    cmd = ["enqueue_compss", "--lang=python",
           f"--num_nodes={opts['num_nodes']}", f"--exec_time={opts['exec_time_min']}",
           f"--cpus_per_node={opts['cpus_per_node']}", f"--worker_in_master_cpus={cpus}",
           *([gpu_flag] if gpu_flag else []),
           f"--job_name=hpcdl_{study}",
           f"--master_working_dir={rdir / 'master'}", f"--worker_working_dir={rdir / 'worker'}",
           f"--base_log_dir={rdir / 'log'}",
           f"--pythonpath={REPO_ROOT}",
           f"--python_interpreter={opts['python_interpreter']}",
           f"--log_level={opts['log_level']}", "--summary"]
    for key in ("queue", "qos", "project_name"):
        if opts[key]:
            cmd.append(f"--{key}={opts[key]}")
    # sbatch hands the submitting environment to the job (Slurm's default --export=ALL): env sets it.
    gpu_env = [f"{gpus_var(study)}={gpus}"] if declared_gpus(study, cfg) else []
    return ["env", *units_assignments(study, cfg, resolve_now=True), *gpu_env, *cmd, *opts["extra_flags"],
            str(app_path(study)), "--config", str(config_path)]


def project_xml(working_dir: str | Path) -> str:
    return f"""<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<Project>
    <MasterNode/>
    <ComputeNode Name="localhost">
        <InstallDir>{os.environ.get("COMPSS_HOME", "/opt/COMPSs")}</InstallDir>
        <WorkingDir>{working_dir}</WorkingDir>
    </ComputeNode>
</Project>
"""


def resources_xml(cpus: int, gpus: int = 0) -> str:
    # GPUs as COMPSs's own generate_resources.sh lists them: a processor of Type GPU
    gpu = f"""
        <Processor Name="GPU">
            <Type>GPU</Type>
            <ComputingUnits>{gpus}</ComputingUnits>
        </Processor>""" if gpus else ""
    return f"""<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<ResourcesList>
    <ComputeNode Name="localhost">
        <Processor Name="MainProcessor">
            <ComputingUnits>{cpus}</ComputingUnits>
        </Processor>{gpu}
        <Adaptors>
            <Adaptor Name="es.bsc.compss.nio.master.NIOAdaptor">
                <SubmissionSystem>
                    <Interactive/>
                </SubmissionSystem>
                <Ports>
                    <MinPort>43001</MinPort>
                    <MaxPort>43002</MaxPort>
                </Ports>
            </Adaptor>
        </Adaptors>
    </ComputeNode>
</ResourcesList>
"""


def write_xml(out: str | Path, cpus: int, working_dir: str | Path, gpus: int = 0) -> tuple[Path, Path]:
    from hpcdl.platform.kit.atomic import atomic_write_text

    if cpus < 1:
        raise ValueError(f"--cpus must be >= 1, got {cpus}")
    if gpus < 0:
        raise ValueError(f"--gpus must be >= 0, got {gpus}")
    out = Path(out)
    (out / "log").mkdir(parents=True, exist_ok=True)
    Path(working_dir).mkdir(parents=True, exist_ok=True)
    return (atomic_write_text(out / "project.xml", project_xml(working_dir)),
            atomic_write_text(out / "resources.xml", resources_xml(cpus, gpus)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcdl compss", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    x = sub.add_parser("xml", help="write project.xml and resources.xml for a single-node COMPSs run")
    x.add_argument("--out", required=True)
    x.add_argument("--cpus", required=True, type=int)
    x.add_argument("--working-dir", required=True)
    x.add_argument("--gpus", default="0",
                   help="GPUs the node offers: a count, or `visible` (those this process sees)")
    for name, what in (("command", "the shell command of the study's run rule (runcompss under "
                                    "runtime: compss)"),
                       ("enqueue", "the enqueue_compss command for a study"),
                       ("gpus", "the GPUs each task of a study holds on this host")):
        e = sub.add_parser(name, help=f"print {what}")
        e.add_argument("study")
        e.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    if args.cmd == "xml":
        if args.gpus == "visible":
            from hpcdl.platform.kit.device import visible_gpus

            gpus = visible_gpus()
        elif args.gpus.isdigit():
            gpus = int(args.gpus)
        else:
            parser.error(f"--gpus must be a count or `visible`, got {args.gpus!r}")
        for path in write_xml(args.out, args.cpus, args.working_dir, gpus):
            print(path)
        return 0
    from hpcdl.platform.kit.config import ConfigError, load_config
    from hpcdl.platform.orchestration.task_runtime.gpus import GpuError, task_gpus
    from hpcdl.platform.orchestration.task_runtime.units import UnitsError

    try:
        cfg = load_config(args.config)
        if args.cmd == "command":
            print(task_app_command(args.study, args.config, cfg))
        elif args.cmd == "gpus":
            print(task_gpus(args.study, cfg))
        else:
            print(shlex.join(enqueue_compss_command(args.study, os.path.abspath(args.config), cfg)))
    except (UnitsError, GpuError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0

