"""The oracle's predictions at exactly the papers' settings (tables/paper_predictions.csv): CosmoFlow and
3D U-Net, hybrid data x spatial on the cluster of `spatial.machine`, and their sensitivity to its
assumptions.

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
from dataclasses import replace

from hpcdl.common.layers import numel
from hpcdl.studies.spatial.perfmodel.gpu_table import CalibrationGap, Measured, datasheet
from hpcdl.studies.spatial.perfmodel.machine import Machine
from hpcdl.studies.spatial.perfmodel.oracle import Strategy, predict
from hpcdl.studies.spatial.perfmodel.slabs import network_spec, splits
from hpcdl.studies.spatial.perfmodel.strategies import family, strategies

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


def _paper_split(spec, batch, split, machine, measured, d0, h0, block) -> tuple[dict, dict, dict]:
    """The paper's hybrid at `split` spatial ranks (cached and file bound, _hybrid) and the calibration items
    its own split read: measured and interpolated, and the items interpolated over every split compared."""
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
    return paper, by_file, {**counts, "interpolated_items_all_splits": every_split}


def _times(name: str, setting: dict, gpus: int, paper: dict, by_file: dict) -> dict:
    """A setting's row up to its speedups: the paper's split, its terms, input, memory and throughput."""
    batch = setting["batch_size"]
    total = paper["total_s"] + paper["io_cached_s"]
    total_file = by_file["total_s"] + by_file["io_file_s"]
    return {
        "network": name,
        "grid": setting["grid"],
        "batch_size": batch,
        "gpus": gpus,
        "spatial_split": gpus // batch,
        "data": batch,
        "depth": paper["depth"],
        "height": paper["height"],
        "time_per_iter_s": total,
        "compute_s": paper["compute_s"],
        "optimizer_s": paper["optimizer_s"],
        "halo_s": paper["halo_s"],
        "allreduce_s": paper["allreduce_s"],
        "gather_s": paper["gather_s"],
        "io_s": paper["io_cached_s"],
        "io_file_s": by_file["io_file_s"],
        "io_read_mb": paper["io_read_bytes"] / 1e6,
        "time_per_iter_io_file_s": total_file,
        "depth_io_file": by_file["depth"],
        "height_io_file": by_file["height"],
        "memory_gb": paper["memory_bytes"] / 1e9,
        "fits_in_memory": bool(paper["feasible"]),
        "samples_per_s": batch / total,
    }


def _basis_columns(block: dict, basis: str, measured, gpu: str, counts: dict, note: str) -> dict:
    """What a row's compute rests on: the basis, the GPU, the items it read, its fixed costs and staging."""
    return {
        "compute_basis": basis,
        "compute_gpu": gpu,
        **counts,
        "fixed_cost": fixed_label(measured),
        "halo_staging": _staging_label(block, measured),
        "basis": (
            "model (oracle), not measured" + note
            if measured is None
            else f"model (oracle) on per-layer times measured on {gpu}"
            + (f" ({measured.cal.status()}; the rest interpolated)" if measured.cal.partial else "")
        ),
    }


def _free_pick(gpus: int, batch: int, spec: list[dict], machine: Machine) -> dict:
    """The oracle's own pick among every strategy it models at `gpus` (the fastest that fits)."""
    cands, skipped = [], 0
    for st in strategies(gpus, batch, spec):
        try:
            pr = predict(spec, batch, st, machine)
        except CalibrationGap:  # a shape no paper layout produces (e.g. a whole sample per GPU)
            skipped += 1
            continue
        cands.append((not pr["feasible"], pr["total_s"], st, pr))
    _, _, pick, pick_pr = min(cands, key=lambda x: (x[0], x[1]))
    return {
        "chosen_strategy": f"{pick.name} ({pick.data}x{pick.depth}x{pick.height}"
        f"{'' if pick.filter == 1 else f' f{pick.filter}'}"
        f"{'' if pick.channel == 1 else f' c{pick.channel}'})",
        "chosen_family": family(pick),
        "chosen_time_per_iter_s": pick_pr["total_s"],
        "chosen_fits_in_memory": bool(pick_pr["feasible"]),
        "strategies_not_calibrated": skipped,
    }


def _rows(block: dict, basis: str, machine: Machine, measured, gpu: str, free: bool, note="") -> list[dict]:
    rows = []
    for name, setting, spec, batch in _settings(block):
        _, d0, h0, _ = spec[0]["in"]
        first = first_file = None
        for gpus in setting["gpus"]:
            split = gpus // batch
            paper, by_file, counts = _paper_split(spec, batch, split, machine, measured, d0, h0, block)
            row = _times(name, setting, gpus, paper, by_file)
            total, total_file = row["time_per_iter_s"], row["time_per_iter_io_file_s"]
            first, first_file = first or total, first_file or total_file
            row.update({
                "speedup_vs_first": first / total,
                "speedup_vs_first_io_file": first_file / total_file,
                "ideal_speedup_vs_first": gpus / setting["gpus"][0],
                **_basis_columns(block, basis, measured, gpu, counts, note),
            })
            if free:
                row.update(_free_pick(gpus, batch, spec, machine))
            rows.append(row)
    return rows


def fixed_label(measured) -> str:
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


def usable_bases(block: dict, cal, free: bool):
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
    for _, rows in usable_bases(block, cal, free=True):
        out += rows
        if not every_basis:
            break
    return out


def _speedups(block: dict, cal, file_bound: bool = False) -> dict[str, float]:
    _, rows = next(usable_bases(block, cal, free=False))
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


