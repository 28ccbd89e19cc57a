"""Command line for the study steps after the task app: aggregate, plot, claims.

    python -m hpcdl.cli {aggregate,plot,claims} <study> --config <config.yaml|json>

Each study provides hpcdl/<study>/analysis.py with aggregate(cfg, study_dir),
plot(cfg, study_dir) and claims(cfg, study_dir) -> list of hpcdl.claims dicts, and declares
the ids its claims() can emit in CLAIMS.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from hpcdl.claims import write_claims
from hpcdl.config import STUDIES, ConfigError, load_config, study_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcdl.cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["aggregate", "plot", "claims"])
    parser.add_argument("study", choices=STUDIES)
    parser.add_argument("--config", required=True, help="full config file (YAML or JSON)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        cfg = load_config(args.config)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.study not in cfg:
        print(f"error: config {args.config} has no '{args.study}' block", file=sys.stderr)
        return 2
    analysis = importlib.import_module(f"hpcdl.{args.study}.analysis")
    out_dir = study_dir(cfg, args.study)
    if args.step == "claims":
        claims = analysis.claims(cfg, out_dir)
        write_claims(out_dir, args.study, claims, analysis.CLAIMS)
        shown = {"passed": "PASS", "failed": "FAIL", "not_measured": "NOT MEASURED"}
        for c in claims:
            why = f" ({c['reason']})" if c.get("reason") else ""
            print(f"[{shown[c['status']]}] {c['id']}: {c['statement']}{why}")
    else:
        getattr(analysis, args.step)(cfg, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
