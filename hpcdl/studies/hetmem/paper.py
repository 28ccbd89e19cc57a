"""The hetmem study's results beside Denoyelle, Gerofi et al.'s published ones (resources/papers.yaml; the
rows are built by hpcdl.platform.orchestration.paper_vs_ours).

Ours is the estimator's largest per-app mean |error| (each app's own mean over its validation
placements), since claim estimate_error_le_5pct judges per app: a mean over apps would pass where the
claim fails one. The paper measured KNL's DRAM vs MCDRAM hardware; on the CPU our reference is a
SIMULATED two-tier memory, which is never compared as if it were hardware (the row reads "other
setting"); on a GPU the reference is the hardware (GPU memory vs mapped host memory).
"""

from __future__ import annotations

from hpcdl.platform import Ours, RunFiles


def _error(run: RunFiles) -> dict | None:
    c, per = run.claim_measured("estimate_error_le_5pct", "per_app_mean_abs_error")
    if c is None or not per:
        return c and {"missing": c.get("reason", "no app has an estimate error")}
    ref = (c.get("measured") or {}).get("reference", "?")
    worst = max(per, key=lambda app: float(per[app]))
    apps = ", ".join(f"{app} {float(e):.3g}" for app, e in per.items())
    out = {"value": float(per[worst]),
           "setting": f"the largest of {len(per)} apps' errors ({worst}; {apps}) against the {ref} reference"
                      + ("" if c["status"] != "not_measured" else f"; {c.get('reason')}")}
    if not str(ref).startswith("hardware"):  # e.g. "hardware: GPU HBM vs mapped pinned host" on a GPU
        out["setting_differs"] = f"reference ours {ref}, paper real hardware (KNL)"
    return out


PAPER = {
    # an error: below the paper's counts as within; 25 % above it still does
    "estimate_error": Ours("claim estimate_error_le_5pct: per_app_mean_abs_error, the largest app's",
                           value=_error, tolerance=0.25, better="lower",
                           rests_on=("estimate_error_le_5pct",)),
    "estimate_speed": Ours("claim estimate_100x_faster", claims=("estimate_100x_faster",)),
    "error_metric": Ours("hetmem validation tables' error column", context=(
        "ours: the same metric, |estimate - reference| / reference per placement (tables/validation.csv)")),
}
