"""The platform's command line, the only entry point besides the task apps (docs/architecture.md).

    python -m hpcdl <study> tables  --config FILE   # raw/ -> tables/*.csv (+ provenance sidecars)
    python -m hpcdl <study> figures --config FILE [--config-files F …]   # tables/ -> figures/*.png
                                                    # and the run's part of each caption
    python -m hpcdl <study> claims  --config FILE   # tables/ (+ raw/) -> claims.json, claims.html
    python -m hpcdl <study> summary --config FILE   # a study's own digest, where it has summary.py
    python -m hpcdl <study> about --config FILE [--config-files F …]   # the report page opening the study
    python -m hpcdl <study> <command> …             # a study's own commands (its commands.py), e.g.
    python -m hpcdl spatial calibrate --config configs/paper.yaml --device cuda   # the oracle's GPU times
    python -m hpcdl compss {command,enqueue,xml,gpus} …  # runcompss / enqueue_compss command lines
    python -m hpcdl verdict --results-dir DIR --out FILE STUDY[=TITLE] …
    python -m hpcdl compare-verdicts DIR DIR …      # did consecutive runs give each claim one verdict
    python -m hpcdl ranks-probe [N [DEVICE]]        # N torch.distributed ranks all-reduce (launcher check)
    python -m hpcdl gpu-records {import PATH,list} [--root DIR]  # a GPU run's records, committed and listed

A study's stages are the modules hpcdl/studies/<study>/{tables,figures,claims}.py with
`tables.write(cfg, study_dir)`, `figures.draw(cfg, study_dir)` and `claims.judge(cfg, study_dir)`
(a list of hpcdl.platform.kit.claims dicts, whose ids claims.CLAIMS declares). The `about` stage is the
platform's own (hpcdl.platform.orchestration.about), from the study's declaration.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

STAGES = ("tables", "figures", "claims", "summary", "about")


def run_stage(study: str, stage: str, cfg: dict, out_dir, config_files: list[str] | None = None) -> None:
    """Run one analysis stage of a study on a validated config."""
    from hpcdl.platform.kit.claims import SHOWN, annotate, write_claims
    from hpcdl.platform.kit.confirmation import describe

    if stage == "about":
        from hpcdl.platform.kit.study import spec
        from hpcdl.platform.orchestration import about

        about.write(spec(study), cfg, out_dir, config_files or [])
        return
    module = importlib.import_module(f"hpcdl.studies.{study}.{stage}")
    if stage == "tables":
        module.write(cfg, out_dir)
    elif stage == "figures":
        from hpcdl.platform.kit.study import spec
        from hpcdl.platform.orchestration import captions

        module.draw(cfg, out_dir)
        captions.write(spec(study), cfg, out_dir, config_files or [])
    elif stage == "claims":
        claims = module.judge(cfg, out_dir)
        # a study without a CONFIRMATION declaration is refused, naming its first claim id
        said = dict(tuned=cfg[study].get("tuned", []), confirmation=getattr(module, "CONFIRMATION", {}),
                    block=cfg[study])
        write_claims(out_dir, study, claims, module.CLAIMS, **said)
        for c in annotate(claims, study, module.CLAIMS, **said):
            why = f" ({c['reason']})" if c.get("reason") else ""
            note = "".join(f" [tuned: {n['key']}: {n['why']}]" for n in c.get("tuned", []))
            print(f"[{SHOWN[c['status']][1]}] {c['id']}: {c['statement']}{why}{note} "
                  f"[{describe(c['confirmation'])}]")
    else:
        print(module.summary(out_dir))


def study_main(argv: list[str]) -> int:
    from hpcdl.platform.kit.config import ConfigError, load_config, studies, study_dir

    parser = argparse.ArgumentParser(prog="python -m hpcdl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", choices=studies())
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--config", required=True, help="full config file (YAML or JSON)")
    parser.add_argument("--config-files", nargs="*", default=[],
                        help="figures, about: the config files the workflow was given (the run's scale, "
                             "named in captions and on the about page)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    if args.stage == "summary" and importlib.util.find_spec(f"hpcdl.studies.{args.study}.summary") is None:
        print(f"error: study {args.study} has no summary stage (hpcdl/studies/{args.study}/summary.py)",
              file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.study not in cfg:
        print(f"error: config {args.config} has no '{args.study}' block", file=sys.stderr)
        return 2
    run_stage(args.study, args.stage, cfg, study_dir(cfg, args.study), args.config_files)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv else ""
    if command == "compss":
        from hpcdl.platform.orchestration.task_runtime.compss import main as compss_main

        return compss_main(argv[1:])
    if command == "verdict":
        from hpcdl.platform.orchestration.verdict import main as verdict_main

        return verdict_main(argv[1:])
    if command == "compare-verdicts":
        from hpcdl.platform.orchestration.verdict_compare import main as compare_main

        return compare_main(argv[1:])
    if command == "gpu-records":
        from hpcdl.platform.orchestration.gpu_records import main as records_main

        return records_main(argv[1:])
    if command == "ranks-probe":
        from hpcdl.platform.kit.rank_runtime.probes import main as probe_main

        return probe_main(argv[1:])
    if len(argv) >= 2 and argv[1] not in STAGES and not argv[1].startswith("-"):
        own = study_command(argv[0], argv[1])
        if own is not None:
            return own(argv[2:])
    return study_main(argv)


def study_command(study: str, command: str):
    """A study's own command (`COMMANDS` of hpcdl/studies/<study>/commands.py), found by name: the
    platform imports no study (docs/architecture.md, "Layers")."""
    if not study.isidentifier() or importlib.util.find_spec(f"hpcdl.studies.{study}") is None:
        return None
    if importlib.util.find_spec(f"hpcdl.studies.{study}.commands") is None:
        return None
    commands = importlib.import_module(f"hpcdl.studies.{study}.commands").COMMANDS
    if command not in commands:
        return None
    module, _, function = commands[command].partition(":")
    return getattr(importlib.import_module(module), function)


if __name__ == "__main__":
    sys.exit(main())
