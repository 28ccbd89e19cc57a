"""The paper predictions' terms beside the published speedups (paper_scale.predictions).

The breakdown (paper_breakdown.csv, `breakdown`): per measured basis and setting, the terms of the time
per iteration (compute, optimizer, halo, all-reduce, gather to the head, input) and, beside a published
speedup (resources/papers.yaml, read only to compare: nothing here is fitted to it), how far the
prediction is from it and, where that is beyond spatial.paper_tolerance, what each term alone, at either
end of the speedup, would have to take to meet it (`meet_<term>_ms`: the others as predicted).
"""

from __future__ import annotations

import re
from pathlib import Path

from hpcdl.studies.spatial.paper_scale.predictions import usable_bases

# resources/papers.yaml's network names (lower case, letters and digits) -> spatial.papers' keys
NETWORKS = {"cosmoflow": "cosmoflow", "3dunet": "unet3d"}
TERMS = (("compute", "compute_s"), ("optimizer", "optimizer_s"), ("halo", "halo_s"),
         ("allreduce", "allreduce_s"), ("gather", "gather_s"), ("input", "io_s"))


def published_speedups(path) -> dict[str, dict]:
    """network -> the published strong-scaling speedup of spatial.papers' network (resources/papers.yaml's
    spatial entries with unit speedup: id, value, gpus_from, gpus_to, mini_batch, source); {} without the
    file. Read to compare only."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    out = {}
    for e in doc.get("spatial", []) or []:
        st = e.get("setting") or {}
        net = NETWORKS.get(re.sub(r"[^a-z0-9]", "", str(st.get("network", "")).lower()))
        if e.get("unit") == "speedup" and net and "value" in e:
            out[net] = {"id": e["id"], "value": float(e["value"]), "gpus_from": int(st["gpus_from"]),
                        "gpus_to": int(st["gpus_to"]), "mini_batch": st.get("mini_batch"),
                        "source": e.get("source", "")}
    return out


def _meet(rows: dict[int, dict], pub: dict, tol: float) -> dict[int, dict]:
    """gpus -> the comparison columns of the published speedup's two settings: the predicted speedup, how
    far from the paper's, and beyond the tolerance what each term of that row alone would have to take."""
    a, b = rows[pub["gpus_from"]], rows[pub["gpus_to"]]
    t_a, t_b = a["time_per_iter_s"], b["time_per_iter_s"]
    pred, want = t_a / t_b, pub["value"]
    off = pred / want - 1
    beyond = abs(off) > tol
    out = {}
    for row, gpus in ((a, pub["gpus_from"]), (b, pub["gpus_to"])):
        cols = {"paper_id": pub["id"], "paper_speedup": want,
                "paper_gpus": f"{pub['gpus_from']}->{pub['gpus_to']}", "predicted_speedup": pred,
                "speedup_off": off, "beyond_tolerance": beyond}
        parts = []
        for term, col in TERMS:
            now = row[col]
            # the term alone moved, the other setting's time as predicted
            need = (t_a / want - (t_b - now)) if row is b else (want * t_b - (t_a - now))
            ok = beyond and need >= 0
            cols[f"meet_{term}_ms"] = need * 1e3 if ok else float("nan")
            if ok:
                parts.append(f"{term} {now * 1e3:.1f} -> {need * 1e3:.1f} ms")
        if beyond:
            cols["to_meet"] = (f"to meet {want:g}x (predicted {pred:.2f}x, {off:+.0%}) with one term at "
                               f"{gpus} GPUs: " + ("; or ".join(parts) if parts
                                           else "no single term can (each would need < 0 ms)"))
        else:
            cols["to_meet"] = f"within {tol:.0%} of {want:g}x (predicted {pred:.2f}x, {off:+.0%})"
        out[gpus] = cols
    return out


def breakdown(block: dict, cal=None, published: dict | None = None,
              rows: list[dict] | None = None) -> list[dict]:
    """Per measured basis (mapped, calibrated; assumed where no calibration serves) and setting: the terms
    of the predicted time per iteration in ms, the items measured and interpolated, and beside a published
    speedup (published_speedups) the comparison and, beyond spatial.paper_tolerance, `_meet`'s columns.
    `rows`: paper_predictions(block, cal, every_basis=True) where the caller has them (else computed)."""
    tol = float(block.get("paper_tolerance", 0.10))
    if rows is None:
        usable = list(usable_bases(block, cal, free=False))
    else:
        usable = [(b, [r for r in rows if r["compute_basis"] == b]) for b in dict.fromkeys(
            r["compute_basis"] for r in rows)]
    chosen = [(b, r) for b, r in usable if b != "assumed"] or usable[-1:]
    out = []
    for basis, rows in chosen:
        for name, setting in block["papers"].items():
            mine = {r["gpus"]: r for r in rows if r["network"] == name}
            pub = (published or {}).get(name)
            extra: dict[int, dict] = {}
            note = ""
            if pub and not {pub["gpus_from"], pub["gpus_to"]} <= set(mine):
                note = (f"{pub['id']}: {pub['gpus_from']} or {pub['gpus_to']} GPUs is not a setting of "
                        "spatial.papers")
            elif pub and pub.get("mini_batch") not in (None, setting["batch_size"]):
                note = (f"{pub['id']}: published at mini-batch {pub['mini_batch']}, spatial.papers.{name} "
                        f"has {setting['batch_size']}")
            elif pub:
                extra = _meet(mine, pub, tol)
            for gpus, r in mine.items():
                out.append({
                    "compute_basis": basis, "network": name, "gpus": gpus, "depth": r["depth"],
                    "height": r["height"], **{f"{t}_ms": r[c] * 1e3 for t, c in TERMS},
                    "time_per_iter_ms": r["time_per_iter_s"] * 1e3,
                    "terms_sum_ms": sum(r[c] for _, c in TERMS) * 1e3,
                    "speedup_vs_first": r["speedup_vs_first"], "measured_items": r["measured_items"],
                    "interpolated_items": r["interpolated_items"], "fixed_cost": r["fixed_cost"],
                    "compute_gpu": r["compute_gpu"], **extra.get(gpus, {"to_meet": note} if note else {}),
                })
    return out


BREAKDOWN_COLUMNS = (["compute_basis", "network", "gpus", "depth", "height"] + [f"{t}_ms" for t, _ in TERMS]
                     + ["time_per_iter_ms", "terms_sum_ms", "speedup_vs_first", "measured_items",
                        "interpolated_items", "fixed_cost", "compute_gpu", "paper_id", "paper_gpus",
                        "paper_speedup", "predicted_speedup", "speedup_off", "beyond_tolerance", "to_meet"]
                     + [f"meet_{t}_ms" for t, _ in TERMS])
