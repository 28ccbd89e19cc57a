"""The oracle at exactly the papers' settings: CosmoFlow and 3D U-Net, hybrid data x spatial on the
cluster of `spatial.machine`.

Oyama et al. train with the mini-batch split one sample per data group and each sample split
spatially over GPUs / mini-batch GPUs. For each published setting this predicts the paper's own
hybrid (the fastest depth x height split of that many spatial ranks) and the oracle's free pick
among every strategy it models. No constant is fitted to the published speedups.

The compute term rests on one of three bases (column compute_basis):
  assumed     every layer at spatial.machine.efficiency x the GPU's FP32 peak (nothing measured)
  mapped      per-layer times measured on a GPU at the layouts' exact slab shapes
              (resources/calibration/<gpu>.csv), mapped to spatial.machine's GPU by datasheet ratios
              (hpcdl.studies.spatial.perfmodel.gpu_table)
  calibrated  the same times on the calibrated GPU itself (the same cluster with that GPU), so a
              reader sees what the mapping contributes
The headline (paper_predictions.csv) is `mapped` where a calibration exists, else `assumed`. Each row
counts the calibration items its layout read, measured and interpolated (`measured_items`,
`interpolated_items`; `interpolated_items_all_splits` over every split it compared), so a partial
table's rows say how much of them rests on interpolation.

The breakdown (paper_breakdown.csv, `breakdown`): per measured basis and setting, the terms of the time
per iteration (compute, optimizer, halo, all-reduce, gather to the head, input) and, beside a published
speedup (resources/papers.yaml, read only to compare: nothing here is fitted to it), how far the
prediction is from it and, where that is beyond spatial.paper_tolerance, what each term alone, at either
end of the speedup, would have to take to meet it (`meet_<term>_ms`: the others as predicted).

The input pipeline is modelled as the papers' code (LBANN) runs it, with both bounds shown, since
what the 2020 runs enabled is not published (spatial.pipeline, sources there):
  each rank reads its share of the sample: LBANN's HDF5 reader reads a hyperslab split along depth
  only (num_io_partitions = depth groups), so 1 / depth ranks of a sample per rank (`read_split`
  depth; `block`: 1 / (depth x height));
  cached bound: samples held in host memory by LBANN's data store (--use_data_store), fetched by
  the background I/O threads while the previous step computes: only what the copy at
  pipeline.cache_gbs takes beyond the step's compute is exposed;
  file bound: every step reads its share from storage at machine.io_gbs, not overlapped.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path

from hpcdl.common.layers import numel
from hpcdl.studies.spatial.perfmodel.gpu_table import CalibrationGap, Measured, datasheet
from hpcdl.studies.spatial.perfmodel.oracle import Machine, Strategy, predict
from hpcdl.studies.spatial.perfmodel.slabs import network_spec, splits
from hpcdl.studies.spatial.perfmodel.strategies import family, strategies

__all__ = ["bases", "breakdown", "compute_check", "network_spec", "paper_predictions", "published_speedups",
           "sensitivity", "splits"]

BYTES = 4


def _target_sheet(machine: dict) -> dict:
    return {
        "peak_tflops": machine["peak_tflops"],
        "memory_gbs": machine["memory_gbs"],
        "memory_gb": machine["memory_gb"],
        "host_link_gbs": machine.get("host_link_gbs"),
    }


def bases(block: dict, cal=None) -> dict[str, tuple[Machine, Measured | None, str]]:
    """name -> (machine, its Measured or None, the GPU its compute rests on), the headline first."""
    m = block["machine"]
    assumed = replace(Machine.from_description(m), io=(0.0, 0.0))
    if cal is None:
        return {"assumed": (assumed, None, f"{m['peak_tflops']:g} TFLOP/s x {m['efficiency']:g} (assumed)")}
    g = block["gpu_calibration"]
    src = datasheet(g["datasheets"], cal.gpu_model)
    fixed = g.get("fixed_cost", "measured")
    mapped = Measured(cal, src, _target_sheet(m), g["mapping"], fixed)
    itself = Measured(cal, src, None, fixed=fixed)
    return {
        "mapped": (replace(assumed, measured=mapped), mapped, f"{cal.gpu_model} mapped ({g['mapping']})"),
        "calibrated": (
            replace(assumed, measured=itself, memory_bytes=src["memory_gb"] * 1e9),
            itself,
            cal.gpu_model,
        ),
        "assumed": (assumed, None, f"{m['peak_tflops']:g} TFLOP/s x {m['efficiency']:g} (assumed)"),
    }


def io_bounds(spec: list[dict], depth: int, height: int, compute_s: float, block: dict) -> dict:
    """Seconds of input a rank waits for per step (batch 1 per rank): the cached-and-overlapped and the
    file-and-serial bound (module docstring)."""
    p = block["pipeline"]
    share = depth if p["read_split"] == "depth" else depth * height
    nbytes = numel(spec[0]["in"]) * BYTES / share
    cached = max(0.0, nbytes / (p["cache_gbs"] * 1e9) - compute_s)
    return {
        "io_read_bytes": nbytes,
        "io_cached_s": cached,
        "io_file_s": nbytes / (block["machine"]["io_gbs"] * 1e9),
    }


def _hybrid(spec, batch, split, machine, d0, h0, block) -> tuple[dict, dict]:
    """The paper's hybrid: the fastest depth x height split of `split` spatial ranks per sample, with the
    input's cached bound and, apart, with its file bound (the split decides what each rank reads)."""
    cands, gap = [], None
    for pd_, ph in splits(split):
        if pd_ <= d0 and ph <= h0:
            try:
                pr = predict(spec, batch, Strategy(batch, pd_, ph), machine) | {"depth": pd_, "height": ph}
            except CalibrationGap as exc:
                if not machine.measured.cal.partial:  # a complete table must hold every paper layout
                    raise
                gap = exc  # a split a partial calibration does not reach yet: the others compete
                continue
            pr |= io_bounds(spec, pd_, ph, pr["compute_s"] + pr["optimizer_s"], block)
            cands.append(pr)
    if not cands and gap is not None:
        raise gap
    return (
        min(cands, key=lambda r: r["total_s"] + r["io_cached_s"]),
        min(cands, key=lambda r: r["total_s"] + r["io_file_s"]),
    )


def _settings(block: dict):
    for name, setting in block["papers"].items():
        spec = network_spec(name, setting, block["extrapolate"])
        batch = setting["batch_size"]
        for gpus in setting["gpus"]:
            if gpus % batch:
                raise ValueError(
                    f"spatial.papers.{name}: {gpus} GPUs is not a multiple of the mini-batch {batch}"
                )
        yield name, setting, spec, batch


def _rows(block: dict, basis: str, machine: Machine, measured, gpu: str, free: bool, note="") -> list[dict]:
    rows = []
    for name, setting, spec, batch in _settings(block):
        _, d0, h0, _ = spec[0]["in"]
        first = first_file = None
        for gpus in setting["gpus"]:
            split = gpus // batch
            if measured is not None:
                measured.reset()
            paper, by_file = _hybrid(spec, batch, split, machine, d0, h0, block)
            counts = {"measured_items": 0, "interpolated_items": 0}
            every_split = 0
            if measured is not None:
                every_split = len(measured.interpolated)
                measured.reset()  # the items of the paper's own split alone
                predict(spec, batch, Strategy(batch, paper["depth"], paper["height"]), machine)
                counts = measured.counts()
            io = paper
            total = paper["total_s"] + paper["io_cached_s"]
            total_file = by_file["total_s"] + by_file["io_file_s"]
            first, first_file = first or total, first_file or total_file
            row = {
                "network": name,
                "grid": setting["grid"],
                "batch_size": batch,
                "gpus": gpus,
                "spatial_split": split,
                "data": batch,
                "depth": paper["depth"],
                "height": paper["height"],
                "time_per_iter_s": total,
                "compute_s": paper["compute_s"],
                "optimizer_s": paper["optimizer_s"],
                "halo_s": paper["halo_s"],
                "allreduce_s": paper["allreduce_s"],
                "gather_s": paper["gather_s"],
                "io_s": io["io_cached_s"],
                "io_file_s": by_file["io_file_s"],
                "io_read_mb": io["io_read_bytes"] / 1e6,
                "time_per_iter_io_file_s": total_file,
                "depth_io_file": by_file["depth"],
                "height_io_file": by_file["height"],
                "memory_gb": paper["memory_bytes"] / 1e9,
                "fits_in_memory": bool(paper["feasible"]),
                "samples_per_s": batch / total,
                "speedup_vs_first": first / total,
                "speedup_vs_first_io_file": first_file / total_file,
                "ideal_speedup_vs_first": gpus / setting["gpus"][0],
                "compute_basis": basis,
                "compute_gpu": gpu,
                **counts,
                "interpolated_items_all_splits": every_split,
                "fixed_cost": _fixed_label(measured),
                "halo_staging": _staging_label(block, measured),
                "basis": (
                    "model (oracle), not measured" + note
                    if measured is None
                    else f"model (oracle) on per-layer times measured on {gpu}"
                    + (f" ({measured.cal.status()}; the rest interpolated)" if measured.cal.partial else "")
                ),
            }
            if free:
                cands, skipped = [], 0
                for st in strategies(gpus, batch, spec):
                    try:
                        pr = predict(spec, batch, st, machine)
                    except CalibrationGap:  # a shape no paper layout produces (e.g. a whole sample per GPU)
                        skipped += 1
                        continue
                    cands.append((not pr["feasible"], pr["total_s"], st, pr))
                _, _, pick, pick_pr = min(cands, key=lambda x: (x[0], x[1]))
                row.update(
                    {
                        "chosen_strategy": f"{pick.name} ({pick.data}x{pick.depth}x{pick.height}"
                        f"{'' if pick.filter == 1 else f' f{pick.filter}'}"
                        f"{'' if pick.channel == 1 else f' c{pick.channel}'})",
                        "chosen_family": family(pick),
                        "chosen_time_per_iter_s": pick_pr["total_s"],
                        "chosen_fits_in_memory": bool(pick_pr["feasible"]),
                        "strategies_not_calibrated": skipped,
                    }
                )
            rows.append(row)
    return rows


def _fixed_label(measured) -> str:
    """How the row's compute prices each layer's fixed cost (gpu_table.Measured)."""
    if measured is None:
        return "assumed (machine.kernel_overhead_s)"
    if measured.fixed == "none":
        return "in every item (fixed_cost: none)"
    if measured.fixed_missing:
        return "in every item: not measured for " + ", ".join(sorted(measured.fixed_missing))
    return "measured (alone out, chained in)"


def _staging_label(block: dict, measured) -> str:
    """Whether the row's halos between nodes include the measured copies to and from the host."""
    if block["machine"].get("halo_staging", "direct") != "host":
        return "direct (no host copy)"
    if measured is None:
        return "host: not priced (no calibration)"
    if measured.face_missing:
        return f"host: face copies of {len(measured.face_missing)} layer(s) not measured yet, left out"
    return "host (measured face copies)"


def _usable(block: dict, cal, free: bool):
    """(basis, rows) per basis the calibration can serve, the headline first: a partial calibration that
    leaves a setting without any split it can time (CalibrationGap) yields no rows on its bases, and the
    assumed basis's rows say why."""
    why = ""
    for basis, (machine, measured, gpu) in bases(block, cal).items():
        try:
            yield basis, _rows(block, basis, machine, measured, gpu, free, note=why)
        except CalibrationGap as exc:
            if measured is None:
                raise
            why = f" (the GPU calibration is not used: {exc})"


def paper_predictions(block: dict, cal=None, every_basis: bool = False) -> list[dict]:
    """One row per setting on the headline basis (or, with every_basis, per setting and basis)."""
    out = []
    for _, rows in _usable(block, cal, free=True):
        out += rows
        if not every_basis:
            break
    return out


def _speedups(block: dict, cal, file_bound: bool = False) -> dict[str, float]:
    _, rows = next(_usable(block, cal, free=False))
    out = {}
    for name in block["papers"]:
        g = [r for r in rows if r["network"] == name]
        out[name] = g[-1]["speedup_vs_first_io_file" if file_bound else "speedup_vs_first"]
    return out


def sensitivity(block: dict, cal=None) -> list[dict]:
    """Predicted speedup from each network's smallest to largest GPU count (CosmoFlow 512 -> 2048, U-Net
    256 -> 512) as each entry of spatial.assumptions moves over its values, the others as configured;
    `pipeline.bound` switches between the cached and the file bound of the input."""
    rows = []
    for path, values in block["assumptions"].items():
        section, key = path.split(".", 1)
        for v in values:
            b = copy.deepcopy(block)
            file_bound = False
            if path == "pipeline.bound":
                file_bound = v == "file"
            else:
                b[section][key] = v
            for net, s in _speedups(b, cal, file_bound).items():
                setting = block["papers"][net]
                rows.append(
                    {
                        "assumption": path,
                        "value": str(v),
                        "configured": _configured(block, path) == v,
                        "network": net,
                        "gpus_from": setting["gpus"][0],
                        "gpus_to": setting["gpus"][-1],
                        "speedup": s,
                        "ideal_speedup": setting["gpus"][-1] / setting["gpus"][0],
                    }
                )
    return rows


def _configured(block: dict, path: str):
    if path == "pipeline.bound":
        return "cached"
    section, key = path.split(".", 1)
    return block[section][key]


def _split_of(step: dict) -> tuple[int, int]:
    """A step row's depth x height split: its d and h columns, else the `<d>x<h>` part of its id."""
    try:
        pd_, ph = int(step["d"]), int(step["h"])
        if pd_ > 0 and ph > 0:
            return pd_, ph
    except (KeyError, TypeError, ValueError):
        pass
    part = next(x for x in str(step["id"]).split("|") if re.fullmatch(r"\d+x\d+", x))
    return tuple(int(v) for v in part.split("x"))


def compute_check(cal, fixed: str = "measured") -> list[dict]:
    """Per whole-step row of a calibration (in sample: a paper layout's slab; held out: a split no setting
    has, its layers priced by interpolation): the measured one-GPU step against the oracle's compute sum
    for the same slab, every layer's forward + backward and the optimizer from the same table, on the
    calibrated GPU (no mapping, no communication), each layer's fixed cost as `fixed` says (gpu_table:
    measured, the alone cost out and the chained one in); `oracle_items_s` is the plain sum of the items
    as timed alone, beside it."""
    from hpcdl.common.layers import n_params
    from hpcdl.studies.spatial.perfmodel import slabs

    if cal is None:
        return []
    rows = []
    kinds = cal.rows["kind"].astype(str)
    for step in cal.rows[kinds.isin(["step", "heldout_step"])].to_dict("records"):
        net = step.get("network")
        spec = _spec_of(cal, net) if isinstance(net, str) else None
        if spec is None:
            continue
        pd_, ph = _split_of(step)
        layers = slabs.step_layer_items(spec, pd_, ph)
        n = sum(n_params(L) for L in spec)
        priced, plain = Measured(cal, {}, None, fixed=fixed), Measured(cal, {}, None, fixed="none")
        try:
            total = sum(priced.in_step(it) for it in layers) + priced.optimizer(n)
            items = sum(plain.in_step(it) for it in layers) + plain.optimizer(n)
        except CalibrationGap:  # a partial calibration without this step's layers yet: not checked
            continue
        t = float(step["median_s"])
        rows.append(
            {
                "network": net,
                "depth": pd_,
                "height": ph,
                "gpus": int(float(step.get("units", 0) or 0)),
                "sample": "held_out" if step["kind"] == "heldout_step" else "in_sample",
                "gpu": cal.gpu_model,
                "measured_step_s": t,
                "measured_step_p25_s": float(step.get("p25_s", t)),
                "measured_step_p75_s": float(step.get("p75_s", t)),
                "oracle_compute_s": total,
                "error": (total - t) / t,
                "oracle_items_s": items,
                "error_items": (items - t) / t,
                "fixed_cost": _fixed_label(priced),
                "layers": len(layers),
                **priced.counts(),
            }
        )
    return rows


CHECK_COLUMNS = ["network", "depth", "height", "gpus", "sample", "gpu", "measured_step_s",
                 "measured_step_p25_s", "measured_step_p75_s", "oracle_compute_s", "error", "oracle_items_s",
                 "error_items", "fixed_cost", "layers", "measured_items", "interpolated_items"]


# --- the published speedups beside the predictions (paper_breakdown.csv) --------------------------------

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
        usable = list(_usable(block, cal, free=False))
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


def _spec_of(cal, network: str):
    """The network spec a calibration measured (its provenance keeps the spatial block it ran)."""
    block = cal.meta.get("block")
    if not block or network not in block.get("papers", {}):
        return None
    return network_spec(network, block["papers"][network], block["extrapolate"])
