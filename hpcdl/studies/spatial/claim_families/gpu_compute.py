"""Claim compute_term: the oracle's compute sum against whole one-GPU steps measured in one GPU calibration,
and where that calibration came from (this run's own or a committed file), which confirms the verdict."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hpcdl.platform import StudyDir, every, measured_afresh, not_measured, unseeded


def _short(commit: str) -> str:
    sha, dirty = str(commit).removesuffix("-dirty"), str(commit).endswith("-dirty")
    return sha[:7] + ("-dirty" if dirty else "")


def calibration_source(cfg: dict, study_dir: Path, check: pd.DataFrame) -> dict | None:
    """Where the compute check's calibration came from, found as the tables stage found it
    (tables.gpu_calibration): {"confirmation": entry, "calibration": evidence}, the committed file named
    with its GPU, dates and commits (its provenance sidecar) or this run's own; None where the config
    names none (no data.resources_dir) or the file's GPU is not the check's."""
    from hpcdl.studies.spatial.tables import gpu_calibration

    if check.empty or "gpu" not in check or "resources_dir" not in cfg.get("data", {}):
        return None
    cal = gpu_calibration(cfg, study_dir)
    if cal is None or cal.path is None or cal.gpu_model != str(check["gpu"].iloc[0]):
        return None
    if cal.path.parent == StudyDir(study_dir).raw / "gpu_calibration":
        own = measured_afresh(f"GPU times of this run's own calibration raw/gpu_calibration/{cal.path.name}")
        return {"confirmation": own.resolve({}, "compute_term"),
                "calibration": {"file": str(cal.path), "this_run": True}}
    sessions = cal.meta.get("sessions") or [cal.meta]
    dates = list(dict.fromkeys(str(x.get("date", "?"))[:10] for x in sessions))
    commits = list(dict.fromkeys(_short(x.get("git_commit", "?")) for x in sessions))
    partial = f"; partial: {cal.measured_items} of {cal.total_items} items" if cal.partial else ""
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    text = (f"read from the committed calibration {cal.path} ({cal.gpu_model}, {when}, commit "
            f"{', '.join(commits)}{partial}), not measured in this run")
    return {"confirmation": unseeded(text).resolve({}, "compute_term"),
            "calibration": {"file": str(cal.path), "this_run": False, "gpu": cal.gpu_model, "dates": dates,
                            "commits": commits, "partial": cal.partial}}


def claim_compute_term(block: dict, check: pd.DataFrame, source: dict | None = None) -> dict:
    """The oracle's compute sum against a whole one-GPU step measured in the same calibration run: a check of
    the model on the GPU it was calibrated on (not of the paper predictions' mapping or communication), at
    the in-sample slabs (spatial.gpu_calibration.steps, at its tolerance) and the held-out ones
    (held_out_steps: layer shapes the calibration left out, at spatial.claims.max_oracle_error): what one
    GPU can judge of the oracle. `source` (calibration_source): the calibration's file, named in the
    evidence and the confirmation."""
    tol = block["gpu_calibration"]["tolerance"]
    bound = block.get("claims", {}).get("max_oracle_error", tol)
    statement = (f"on the calibrated GPU, the oracle's compute term (sum of the per-layer forward + backward "
                 f"times and the optimizer step of the calibration table, each layer's fixed cost as "
                 f"spatial.gpu_calibration.fixed_cost says) is within {tol:.0%} of a measured whole one-GPU "
                 "training step at the same slab, at every checked slab (spatial.gpu_calibration.steps), and "
                 f"within {bound:.0%} at every held-out slab, whose layer shapes the calibration left out "
                 "(held_out_steps; measured in one calibration run)")
    if check.empty or "error" not in check:
        return not_measured("compute_term", statement, "no GPU calibration with whole-step rows: run "
                            "`python -m hpcdl spatial calibrate --device cuda` on a GPU and commit its "
                            "resources/calibration/<gpu>.csv", tolerance=tol)
    held = (check["sample"].astype(str) == "held_out") if "sample" in check else pd.Series(False, check.index)
    name = {i: ("held out " if held[i] else "") + f"{r.network} {int(r.depth)}x{int(r.height)}"
            for i, r in zip(check.index, check.itertuples(), strict=True)}
    per = {name[i]: float(check.at[i, "error"]) for i in check.index}
    line = {name[i]: bound if held[i] else tol for i in check.index}
    gpu = str(check["gpu"].iloc[0])
    extra = {k: {name[i]: (float(check.at[i, k]) if k != "fixed_cost" else str(check.at[i, k]))
                 for i in check.index}
             for k in ("error_items", "fixed_cost", "interpolated_items") if k in check}
    c = every("compute_term", statement, {k: abs(e) <= line[k] for k, e in per.items()}, {}, error=per,
              measured_step_s={name[i]: float(check.at[i, "measured_step_s"]) for i in check.index},
              oracle_compute_s={name[i]: float(check.at[i, "oracle_compute_s"]) for i in check.index},
              tolerance=tol, held_out_bound=bound, gpu=gpu, **extra,
              **({"calibration": source["calibration"]} if source else {}))
    # the verdict is confirmed by whichever calibration it read: a committed one is not measured afresh
    return {**c, "confirmation": source["confirmation"]} if source else c
