"""Print every timing claim's value of one spatial study run (for repeated runs on an idle machine).

    python -m hpcdl spatial summary --config FILE

One block: pass/fail of each claim, the efficiency against the ceiling with the raw speedup and the
ceiling, the oracle's mean, worst and per-run error (held out; in sample beside it), and the phases left
out as disturbed with the load measured from /proc during them, and the papers' settings as
tables/paper_breakdown.csv has them (terms, items measured and interpolated, the published speedup's gap
and what one term would have to take to meet it). Reads only claims.json and tables/ (nothing is
recomputed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from hpcdl.platform import StudyDir


def summary(study_dir: Path) -> str:
    study = StudyDir(study_dir)  # `run` below names the study's runs
    claims = {c["id"]: c for c in json.loads((study.root / "claims.json").read_text())["claims"]}
    lines = [f"spatial run in {study.root}"]
    for cid, c in claims.items():
        lines.append(f"  {cid:24s} {c['status'].upper()}" + (f" ({c['reason']})" if c.get("reason") else ""))
    eff = claims.get("strong_efficiency_2", {}).get("measured", {})
    for run, e in (eff.get("efficiency") or {}).items():
        lines.append(f"  efficiency {run}: {e:.3f} (speedup {eff['speedup'][run]:.3f} / ceiling "
                     f"{eff['ceiling_speedup'][run]:.3f}; goal >= {eff.get('threshold')})")
    ora = claims.get("oracle_error", {}).get("measured", {})
    if "mean_abs_error" in ora:
        lines.append(f"  oracle mean |error| held out {100 * ora['mean_abs_error']:.1f} % (goal <= "
                     f"{100 * ora['threshold']:.0f} %): " + ", ".join(f"{r} {100 * v:+.1f} %"
                                                             for r, v in ora["per_run"].items()))
        worst = ora.get("worst_run") or {}
        if worst:
            iv = worst.get("interval")
            lines.append(f"  oracle worst held-out run {worst['run']} {100 * worst['error']:+.1f} %"
                         + (f", repeats {100 * iv['mean']:+.1f} % [{100 * iv['ci95'][0]:+.1f}, "
                            f"{100 * iv['ci95'][1]:+.1f}] (95 % CI, n={iv['n']})" if iv else "")
                         + "; each run judged on its own")
        inside = ora.get("in_sample") or {}
        if inside.get("mean_abs_error") is not None:
            per_run = ", ".join(f"{r} {100 * v:+.1f} %" for r, v in inside["per_run"].items())
            lines.append(f"  oracle mean |error| in sample {100 * inside['mean_abs_error']:.1f} % "
                         f"(not judged): {per_run}")
    runs = pd.read_csv(study.table("runs"))
    cols = [c for c in ("run", "time_per_iter_s", "time_per_iter_median_s", "iterations_timed", "phases",
                        "phases_disturbed", "other_load_cores", "other_load_cores_max", "halo_s",
                        "allreduce_s", "gather_s") if c in runs]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.precision", 4):
        lines.append(runs[cols].to_string(index=False))
    fit = pd.read_csv(study.table("calibration_fit"))
    cal = {c.removeprefix("calibration_"): getattr(v := fit[c].iloc[0], "item", lambda: v)() for c in fit
           if c.startswith("calibration_")}  # numbers, and the held-out shapes (a string)
    lines.append(f"  calibration: {cal}")
    bd_path = study.table("paper_breakdown")
    bd = pd.read_csv(bd_path) if bd_path.exists() else pd.DataFrame()
    for r in bd.itertuples():  # the papers' settings: terms, items measured / interpolated, the paper's gap
        names = ("compute", "optimizer", "halo", "allreduce", "gather", "input")
        terms = ", ".join(f"{t} {getattr(r, f'{t}_ms'):.1f}" for t in names)
        lines.append(f"  paper setting {r.compute_basis} {r.network} {int(r.gpus)} GPUs ({int(r.depth)}x"
                     f"{int(r.height)}): {r.time_per_iter_ms:.1f} ms ({terms}); items "
                     f"{int(r.measured_items)} measured, {int(r.interpolated_items)} interpolated")
        if isinstance(r.to_meet, str) and r.to_meet:
            lines.append(f"    {r.to_meet}")
    return "\n".join(lines)
