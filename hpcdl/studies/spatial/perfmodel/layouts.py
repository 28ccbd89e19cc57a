"""The papers' layouts and every item the GPU calibration times, once each (pure).

A layout is a (network, GPUs, depth x height split) of spatial.papers, one sample per data group
(paper_layouts); the whole-step checks take some of them (spatial.gpu_calibration.steps) and the held-out
steps splits no setting has (held_out_layouts, check_held_out: the oracle must interpolate, never
extrapolate, their layers). calibration_items lists every distinct item of them (perfmodel.slabs builds
each), the optimizer per network and the fixed costs, each layout's items naming the first setting that
uses them (setting_order), as calibration.gpu_plan orders them.
"""

from __future__ import annotations

from hpcdl.common.layers import n_params
from hpcdl.studies.spatial.perfmodel.slabs import (
    BYTES,
    fixed_items,
    held_out_step_id,
    layout_items,
    network_spec,
    optimizer_id,
    param_shapes,
    splits,
    step_id,
    step_layer_items,
)


def paper_layouts(block: dict) -> list[dict]:
    """Every (network, GPUs, depth x height split) of spatial.papers, one sample per data group."""
    out = []
    for name, setting in block["papers"].items():
        spec = network_spec(name, setting, block["extrapolate"])
        batch = setting["batch_size"]
        _, d0, h0, _ = spec[0]["in"]
        for gpus in setting["gpus"]:
            if gpus % batch:
                raise ValueError(
                    f"spatial.papers.{name}: {gpus} GPUs is not a multiple of the mini-batch {batch}"
                )
            for pd, ph in splits(gpus // batch):
                if pd <= d0 and ph <= h0:
                    out.append(
                        {
                            "network": name,
                            "gpus": gpus,
                            "batch": batch,
                            "depth": pd,
                            "height": ph,
                            "spec": spec,
                        }
                    )
    return out


def step_layouts(block: dict) -> list[dict]:
    """The slabs of the whole-step check (spatial.gpu_calibration.steps: [network, gpus, depth, height]),
    each a layout of spatial.papers. The step runs every layer at the local shape the oracle charges
    (ceil of the global planes per rank; calibration.gpu_ops), so any layout can be checked, the papers'
    largest splits included, where one plain pass would thin a layer to nothing."""
    layouts = {
        (lay["network"], lay["gpus"], lay["depth"], lay["height"]): lay for lay in paper_layouts(block)
    }
    out = []
    for i, (net, gpus, pd, ph) in enumerate(block["gpu_calibration"]["steps"]):
        lay = layouts.get((net, gpus, pd, ph))
        if lay is None:
            raise ValueError(
                f"spatial.gpu_calibration.steps[{i}]: {[net, gpus, pd, ph]} is not a layout of "
                "spatial.papers (network, GPUs, depth x height = GPUs / mini-batch)"
            )
        out.append(lay)
    return out


def held_out_layouts(block: dict) -> list[dict]:
    """The slabs of the held-out steps (spatial.gpu_calibration.held_out_steps: [network, depth, height]):
    a depth x height split of one sample that no setting of spatial.papers has, so the calibration times
    none of its layouts and the oracle prices its layers from the papers' neighbouring sizes."""
    ours = {(lay["network"], lay["depth"], lay["height"]) for lay in paper_layouts(block)}
    out = []
    for i, (net, pd, ph) in enumerate(block["gpu_calibration"].get("held_out_steps", [])):
        key = f"spatial.gpu_calibration.held_out_steps[{i}]"
        if net not in block["papers"]:
            raise ValueError(f"{key}: {net!r} is not a network of spatial.papers")
        if (net, pd, ph) in ours:
            raise ValueError(f"{key}: {[net, pd, ph]} is a layout of spatial.papers, which the calibration "
                             "times: not held out")
        setting = block["papers"][net]
        spec = network_spec(net, setting, block["extrapolate"])
        _, d0, h0, _ = spec[0]["in"]
        if pd > d0 or ph > h0:
            raise ValueError(f"{key}: more ranks than planes ({d0} x {h0})")
        out.append({"network": net, "gpus": 0, "batch": setting["batch_size"], "depth": pd, "height": ph,
                    "spec": spec})
    return out


def _group(it: dict) -> tuple:
    return (it["kind"], it["key"], it["batch"], it.get("axis", ""))


def check_held_out(held: list[dict], items: list[dict]) -> None:
    """Every layer of a held-out step is an item the calibration times or lies between two of its sizes
    (the oracle interpolates, never extrapolates), and at least one is not timed (else nothing is held
    out)."""
    ids = {it["id"] for it in items}
    sizes: dict[tuple, list[int]] = {}
    for it in items:
        sizes.setdefault(_group(it), []).append(it.get("d", 1) * it.get("h", 1))
    for i, lay in enumerate(held):
        key = f"spatial.gpu_calibration.held_out_steps[{i}]"
        layers = step_layer_items(lay["spec"], lay["depth"], lay["height"])
        for x in layers:
            have = sizes.get(_group(x), [])
            if x["id"] not in ids and not (have and min(have) <= x["d"] * x["h"] <= max(have)):
                span = f"{min(have)}..{max(have)}" if have else "none"
                raise ValueError(
                    f"{key}: {[lay['network'], lay['depth'], lay['height']]}: layer {x['id']} has "
                    f"{x['d'] * x['h']} local planes, outside the sizes the calibration times for it "
                    f"({span}): the oracle would extrapolate; choose a split between the papers' spatial "
                    "splits")
        if all(x["id"] in ids for x in layers):
            raise ValueError(f"{key}: every layer of {[lay['network'], lay['depth'], lay['height']]} is "
                             "timed by the calibration: nothing is held out")


def _step_item(lay: dict, held_out: bool) -> dict:
    net, pd, ph = lay["network"], lay["depth"], lay["height"]
    return {
        "id": held_out_step_id(net, pd, ph) if held_out else step_id(net, lay["gpus"], pd, ph),
        "kind": "heldout_step" if held_out else "step",
        "key": net,
        "network": net,
        "gpus": lay["gpus"],
        "units": lay["gpus"],
        "depth": pd,
        "height": ph,
        "batch": 1,
        "spec": lay["spec"],
        "flops": 0.0,
        "bytes": 0.0,
    }


SETTING_PREFIX = "setting "


def setting_order(block: dict) -> list[tuple[str, int]]:
    """The papers' settings in the order the calibration completes them: each network's first and last
    GPU counts (the published speedups compare them), network by network, then the counts between."""
    ends, middle = [], []
    for name, setting in block["papers"].items():
        gpus = list(setting["gpus"])
        ends += [(name, g) for g in dict.fromkeys([gpus[0], gpus[-1]])]
        middle += [(name, g) for g in gpus[1:-1]]
    return ends + middle


def calibration_items(block: dict) -> list[dict]:
    """Every distinct item of every paper layout and of the step checks, once; the optimizer per network;
    the fixed costs. Each item of a layout names the first setting (setting_order) whose layouts use it
    (`setting`, `setting_rank`): calibration.gpu_plan completes the settings one at a time."""
    overlap = bool(block["machine"].get("overlap", False))
    rank = {s: i for i, s in enumerate(setting_order(block))}
    seen: dict[str, dict] = {}
    for lay in sorted(paper_layouts(block), key=lambda x: rank[(x["network"], x["gpus"])]):
        where = {"setting": f"{lay['network']} {lay['gpus']}",
                 "setting_rank": rank[(lay["network"], lay["gpus"])]}
        for it in layout_items(lay["spec"], lay["depth"], lay["height"], 1, overlap):
            seen.setdefault(it["id"], {**it, "network": lay["network"], **where})
    for name, setting in block["papers"].items():
        spec = network_spec(name, setting, block["extrapolate"])
        n = sum(n_params(L) for L in spec)
        seen.setdefault(
            optimizer_id(name, n),
            {
                "id": optimizer_id(name, n),
                "kind": "optimizer",
                "key": name,
                "network": name,
                "shapes": param_shapes(spec),
                "units": n,
                "batch": 1,
                "flops": 0.0,
                "bytes": 16 * BYTES * n,
            },
        )
    for it in fixed_items(block):
        seen.setdefault(it["id"], it)
    for lay in step_layouts(block):
        it = _step_item(lay, False)
        seen.setdefault(it["id"], it)
    held = held_out_layouts(block)
    check_held_out(held, list(seen.values()))
    for lay in held:
        it = _step_item(lay, True)
        seen.setdefault(it["id"], it)
    return list(seen.values())
