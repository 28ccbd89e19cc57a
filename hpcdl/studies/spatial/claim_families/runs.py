"""What a spatial run's timings can judge: why a configured run has no measurement, the phases other load
disturbed, and runs whose ranks shared fewer GPUs than they number (one_gpu_rule)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hpcdl.platform import StudyDir, failed_because


def run_missing(raw: pd.DataFrame, run: str) -> str:
    """Why a configured run has no measurement: its recorded failure, or that it is absent."""
    if not {"run", "status"} <= set(raw):
        return f"run {run} has no measurement"
    rows = raw[(raw["run"] == run) & (raw["status"] == "failed")]
    if len(rows):
        return failed_because(f"run {run}", rows["error"].iloc[-1])
    return f"run {run} has no measurement"


def load_evidence(df: pd.DataFrame, runs: list[str]) -> dict:
    """Per run: phases left out as disturbed by other load, and the other load (cores) it was timed under."""
    out = {}
    for r in runs:
        row = df[df["run"] == r] if "run" in df else df[:0]
        if len(row) and "phases_disturbed" in row:
            out[r] = {"phases_disturbed": int(row["phases_disturbed"].iloc[0]),
                      "phases": int(row["phases"].iloc[0]),
                      "other_load_cores": float(row["other_load_cores"].iloc[0]),
                      "all_phases_disturbed": bool(row["disturbed"].iloc[0])}
    return out


def all_disturbed(df: pd.DataFrame, runs: list[str], block: dict) -> str | None:
    """Why a timing claim is not judged: runs every one of whose phases other load disturbed."""
    if "disturbed" not in df:
        return None
    bad = df[df["run"].isin(runs) & df["disturbed"].astype(str).str.lower().eq("true")]
    if bad.empty:
        return None
    loads = ", ".join(f"{r.run} {r.other_load_cores:.2f}" for r in bad.itertuples())
    return (f"every timed phase of {len(bad)} run(s) was disturbed by other load above "
            f"{block.get('disturbed_load_cores')} cores (least-loaded phase, cores: {loads}); "
            "rerun on a quieter machine")


def one_gpu_rule(study_dir: Path, df: pd.DataFrame) -> dict[str, str]:
    """Run -> why it is not measured where the run had fewer GPUs than the run's ranks (ranks sharing a GPU
    over gloo, spatial.gpu_sharing): its timings are the shared GPU's and the host's, not that many GPUs',
    so a claim that needs them reads not measured. Empty off CUDA (ranks on CPU cores are what they time)."""
    dev = StudyDir(study_dir).device()
    if dev.get("device") != "cuda" or not {"run", "ranks"} <= set(df):
        return {}
    have = int(dev.get("gpu_count") or 1)
    gpu = dev.get("gpu_model") or "GPU"
    return {str(r.run): (f"needs {int(r.ranks)} GPUs: this run had {have} ({gpu}), its {int(r.ranks)} ranks "
                         "shared it over gloo (timings labelled shared GPU), which times the host staging, "
                         f"not {int(r.ranks)} GPUs") for r in df.itertuples() if int(r.ranks) > have}
