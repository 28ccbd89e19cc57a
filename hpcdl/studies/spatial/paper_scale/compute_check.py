"""The oracle's compute term checked on the GPU it was calibrated on (tables/compute_check.csv): each
whole one-GPU step a calibration measured against the oracle's sum of the same slab's layers and optimizer
from the same table (no mapping, no communication).
"""

from __future__ import annotations

import re

from hpcdl.common.layers import n_params
from hpcdl.studies.spatial.paper_scale.predictions import fixed_label
from hpcdl.studies.spatial.perfmodel import slabs
from hpcdl.studies.spatial.perfmodel.gpu_table import CalibrationGap, Measured
from hpcdl.studies.spatial.perfmodel.slabs import network_spec


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
                "fixed_cost": fixed_label(priced),
                "layers": len(layers),
                **priced.counts(),
            }
        )
    return rows


CHECK_COLUMNS = ["network", "depth", "height", "gpus", "sample", "gpu", "measured_step_s",
                 "measured_step_p25_s", "measured_step_p75_s", "oracle_compute_s", "error", "oracle_items_s",
                 "error_items", "fixed_cost", "layers", "measured_items", "interpolated_items"]


def _spec_of(cal, network: str):
    """The network spec a calibration measured (its provenance keeps the spatial block it ran)."""
    block = cal.meta.get("block")
    if not block or network not in block.get("papers", {}):
        return None
    return network_spec(network, block["papers"][network], block["extrapolate"])
