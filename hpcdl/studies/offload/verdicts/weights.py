"""The equal-weights claim (weights_equal): every strategy trains to 'none''s final weights, same seed and
steps, at every size; bit for bit, or (zero_offload, whose host Adam runs other kernels) within
tolerance.py's tolerance. Not gated by the slow tier's speed (gate.py): the weights do not depend on it."""

from __future__ import annotations

from hpcdl.platform import every, not_measured, why_point_missing
from hpcdl.studies.offload import tolerance
from hpcdl.studies.offload.sweep import CPU_ONLY_SKIPPED
from hpcdl.studies.offload.verdicts.common import precision_of, row, tier_of

# strategies whose update runs other kernels than none's: equal within tolerance.py's tolerance
WITHIN_TOLERANCE = ("zero_offload",)
SAMPLED = 256  # precision.SAMPLE (not imported: that module loads torch)


def claim_weights(tr, block, fails) -> dict:
    cid = "weights_equal"
    tier = tier_of(tr, block)
    # on CPU torch's save_on_cpu has nothing to move (its saved tensors already are in host memory): the
    # sweep does not run it there (sweep.CPU_ONLY_SKIPPED), so the claim names what it compares
    absent = {s: why for s, why in CPU_ONLY_SKIPPED.items()
              if s in block["strategies"] and tier == "ram>file"}
    compared = [s for s in block["strategies"] if s != "none" and s not in absent]
    exact = [s for s in compared if s not in WITHIN_TOLERANCE]
    close = [s for s in compared if s in WITHIN_TOLERANCE]
    precision = precision_of(tr, block)
    steps = int(tr["steps"].max()) if not tr.empty and "steps" in tr else int(block.get("steps", 1))
    statement = (
        (f"{', '.join(exact)} each train to bit-identical weights (sha256 of the final parameters) as "
         "'none', same seed and steps, at every size" if exact or not close else "")
        + ("; " if exact and close else "")
        + "".join(f"{s} trains to the weights of 'none' at the same precision ({precision}), same seed and "
                  f"steps, at every size: bit-identical, or within sqrt(steps) / 2 = "
                  f"{tolerance.tolerance(steps):.3g} units in the last place of {precision} (root mean "
                  f"square over {SAMPLED} sampled weights; its host Adam runs other kernels than the fast "
                  "tier's)"
                  for s in close)
        + "".join(f"; {s} not compared on this tier ({why})" for s, why in absent.items())
    )
    if "none" not in block["strategies"]:
        return not_measured(cid, statement, "offload.strategies lacks 'none'")
    holds, missing, deviations = {}, {}, {}
    for d in sorted(block["model"]["depths"]):
        for s in compared:
            r, n = row(tr, s, d), row(tr, "none", d)
            if r is None or n is None:
                missing[f"{s}/{d}L"] = "; ".join(
                    why_point_missing(fails, "steps", strategy=x, depth=d)
                    for x, found in ((s, r), ("none", n))
                    if found is None
                )
                continue
            same = str(r["weights_sha256"]) == str(n["weights_sha256"])
            if same or s not in close:
                holds[f"{s}/{d}L"] = same
                continue
            a, b = (tolerance.parse_sample(x.get("weights_sample")) for x in (r, n))
            if not a or len(a) != len(b):
                missing[f"{s}/{d}L"] = ("its weights differ from none's and tradeoff.csv holds no comparable "
                                        "weights_sample: rerun the study")
                continue
            dev = tolerance.deviation(a, b, precision)
            deviations[f"{s}/{d}L"] = round(dev, 4)
            holds[f"{s}/{d}L"] = dev <= tolerance.tolerance(steps)
    within = {"within_tolerance": close, "deviation_ulps": deviations,
              "tolerance_ulps": round(tolerance.tolerance(steps), 4)} if close else {}
    return every(
        cid, statement, holds, missing, compared=compared, not_compared=absent,
        required="sha256 equal to none's" + (f" ({', '.join(exact)})" if close else ""),
        tolerance="0 (bit-identical)"
        + ("; zero_offload: sqrt(steps)/2 ulps rms (tolerance.py)" if close else ""),
        **within,
    )
