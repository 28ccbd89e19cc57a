"""The per-GPU slab shapes the papers' layouts produce, as the GPU calibration measures them (pure).

At each of the papers' settings (spatial.papers: CosmoFlow 512^3 on 512/1024/2048 GPUs, mini-batch 64;
3D U-Net 256^3 on 256/512 GPUs, mini-batch 16) a data group holds one sample and its GPUs / mini-batch
spatial ranks split it depth x height, every power-of-two split the oracle searches
(splits). A layer of a rank then runs on ceil(d / pd) x ceil(h / ph)
of its output planes (the oracle's `_local`), batch 1 per GPU. This module lists, once each:

  layer       conv / pool / deconv / dense forward + backward at a local output shape
  halo        packing one side's halo planes of a layer's input into a send buffer and unpacking a
              received one into the halo'd input (per split axis)
  correction  the thin edge conv a depth-only split adds to a stride-1 'same' conv (overlap.py)
  optimizer   zero_grad + Adam step over one network's parameter tensors
  step        a whole one-GPU training step on a slab (the compute-term check), and its layers

Every item has an `id` the calibration table is keyed by.
"""

from __future__ import annotations

import math

from hpcdl.common.layers import build_spec, flops, layer_key, n_params, numel, unet3d_spec

BYTES = 4


def network_spec(name: str, setting: dict, cosmoflow: dict) -> list[dict]:
    """The layers of one of spatial.papers' networks (CosmoFlow: spatial.extrapolate's layers)."""
    g = setting["grid"]
    if name == "cosmoflow":
        return build_spec(
            (g, g, g),
            {"channels": cosmoflow["channels"], "kernel": cosmoflow["kernel"], "dense": cosmoflow["dense"]},
            in_channels=cosmoflow["in_channels"],
            outputs=cosmoflow["outputs"],
        )
    return unet3d_spec((setting["in_channels"], g, g, g), list(setting["levels"]), outputs=setting["outputs"])


def splits(n: int) -> list[tuple[int, int]]:
    """Every (depth, height) split of n spatial ranks into powers of two."""
    out, d = [], 1
    while d <= n:
        if n % d == 0:
            out.append((d, n // d))
        d *= 2
    return out


def local(n: int, parts: int) -> int:
    return math.ceil(n / parts) if parts > 1 else n


def layer_id(kind: str, key: str, d: int, h: int, batch: int) -> str:
    return f"{kind}|{key}|d{d}|h{h}|b{batch}"


def halo_id(key: str, axis: str, d: int, h: int, batch: int) -> str:
    return f"halo|{key}|{axis}|d{d}|h{h}|b{batch}"


def correction_id(key: str, batch: int) -> str:
    return f"correction|{key}|b{batch}"


def optimizer_id(network: str, params: int) -> str:
    return f"optimizer|{network}|n{params}"


def halo_planes(L: dict) -> int:
    if L["kind"] == "conv":
        return (L["kernel"] - 1) // 2
    if L["kind"] == "pool":
        return max(L["kernel"] - L["stride"], 0)
    return 0


def corrects(L: dict) -> bool:
    """A stride-1 'same' conv: a depth-only split hides its halo by an edge correction (overlap.py)."""
    return L["kind"] == "conv" and L["stride"] == 1 and L["pad"] > 0 and 2 * L["pad"] == L["kernel"] - 1


def layer_item(L: dict, pd: int, ph: int, batch: int) -> dict | None:
    """The local forward + backward of layer L on a rank of a pd x ph split (None: no compute)."""
    kind = L["kind"]
    if kind in ("conv", "pool", "deconv"):
        c, d, h, w = L["out"]
        dl, hl = local(d, pd), local(h, ph)
        units = flops(L) * batch * dl / d * hl / h
        # minimum traffic of forward + backward: read input, write output; backward reads both and the
        # output's gradient, writes the input's (and the weights' gradient): about 3x the forward's
        cin, di, hi, wi = L["in"]
        frac = dl / d * hl / h
        moved = 3 * (numel(L["in"]) + numel(L["out"])) * frac * batch * BYTES + 3 * n_params(L) * BYTES
        return {
            "id": layer_id(kind, layer_key(L), dl, hl, batch),
            "kind": kind,
            "key": layer_key(L),
            "layer": L,
            "d": dl,
            "h": hl,
            "w": w,
            "batch": batch,
            "split_d": dl < d,
            "split_h": hl < h,
            "flops": 3 * units if kind != "pool" else units,
            "bytes": moved,
        }
    if kind == "dense":
        moved = 3 * (L["fin"] + L["fout"]) * batch * BYTES + 3 * n_params(L) * BYTES
        return {
            "id": layer_id(kind, layer_key(L), 1, 1, batch),
            "kind": kind,
            "key": layer_key(L),
            "layer": L,
            "d": 1,
            "h": 1,
            "w": 1,
            "batch": batch,
            "split_d": False,
            "split_h": False,
            "flops": 3 * flops(L) * batch,
            "bytes": moved,
        }
    return None


def halo_items(L: dict, pd: int, ph: int, batch: int) -> list[dict]:
    """One side's pack + unpack of L's input halo planes on every split axis (none for a halo-free layer)."""
    n = halo_planes(L)
    if L["kind"] not in ("conv", "pool") or n == 0:
        return []
    c, d, h, w = L["in"]
    dl, hl = local(d, pd), local(h, ph)
    out = []
    for axis, parts in (("d", pd), ("h", ph)):
        if parts > 1:
            # the height exchange runs on the depth-extended block (model.window fills the corners)
            plane = c * (hl if axis == "d" else dl + 2 * n * (pd > 1)) * w
            out.append(
                {
                    "id": halo_id(layer_key(L), axis, dl, hl, batch),
                    "kind": "halo",
                    "key": layer_key(L),
                    "layer": L,
                    "axis": axis,
                    "planes": n,
                    "d": dl,
                    "h": hl,
                    "w": w,
                    "batch": batch,
                    "flops": 0.0,
                    "bytes": 2 * 2 * n * plane * batch * BYTES,
                }
            )
    return out


def correction_item(L: dict, batch: int) -> dict:
    c, d, h, w = L["out"]
    fl = 2.0 * L["cin"] * L["cout"] * L["pad"] * L["kernel"] ** 2 * L["pad"] * h * w * batch
    moved = 3 * (L["cin"] + L["cout"]) * L["pad"] * h * w * batch * BYTES
    return {
        "id": correction_id(layer_key(L), batch),
        "kind": "correction",
        "key": layer_key(L),
        "layer": L,
        "d": L["pad"],
        "h": h,
        "w": w,
        "batch": batch,
        "flops": 3 * fl,
        "bytes": moved,
    }


def param_shapes(spec: list[dict]) -> list[tuple[int, ...]]:
    shapes = []
    for L in spec:
        if L["kind"] == "conv":
            k = L["kernel"]
            shapes += [(L["cout"], L["cin"], k, k, k), (L["cout"],)]
        elif L["kind"] == "deconv":
            k = L["kernel"]
            shapes += [(L["cin"], L["cout"], k, k, k), (L["cout"],)]
        elif L["kind"] == "dense":
            shapes += [(L["fout"], L["fin"]), (L["fout"],)]
    return shapes


def layout_items(spec: list[dict], pd: int, ph: int, batch: int, overlap: bool) -> list[dict]:
    """Everything a rank of a pd x ph split computes apart from communication."""
    items = []
    for L in spec:
        it = layer_item(L, pd, ph, batch)
        if it:
            items.append(it)
        items += halo_items(L, pd, ph, batch)
        if overlap and pd > 1 and ph == 1 and corrects(L) and local(L["out"][1], pd) < L["out"][1]:
            items.append(correction_item(L, batch))
    return items


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


def consistent(spec: list[dict], pd: int, ph: int) -> bool:
    """Whether one network pass on the local slab produces every layer's local shape the oracle charges
    (ceil of the global planes per rank): only then is a whole one-GPU step on that slab the sum of the
    layers the oracle adds up. A layer's local input is the previous layer's local output (both are the
    ceil of the same global size), so each op must map its local input onto its local output."""
    for L in spec:
        if L["kind"] not in ("conv", "pool", "deconv"):
            continue
        li = (local(L["in"][1], pd), local(L["in"][2], ph))
        lo = (local(L["out"][1], pd), local(L["out"][2], ph))
        s = L["stride"]
        got = {"conv": li, "pool": (li[0] // s, li[1] // s), "deconv": (li[0] * s, li[1] * s)}[L["kind"]]
        if got != lo:
            return False
    return True


def step_layouts(block: dict) -> list[dict]:
    """The slabs of the whole-step check (spatial.gpu_calibration.steps: [network, gpus, depth, height])."""
    layouts = {
        (lay["network"], lay["gpus"], lay["depth"], lay["height"]): lay for lay in paper_layouts(block)
    }
    out = []
    for i, (net, gpus, pd, ph) in enumerate(block["gpu_calibration"]["steps"]):
        key = f"spatial.gpu_calibration.steps[{i}]"
        lay = layouts.get((net, gpus, pd, ph))
        if lay is None:
            raise ValueError(
                f"{key}: {[net, gpus, pd, ph]} is not a layout of spatial.papers (network, GPUs, "
                "depth x height = GPUs / mini-batch)"
            )
        if not consistent(lay["spec"], pd, ph):
            raise ValueError(
                f"{key}: on a {pd} x {ph} split some layer's local shape is not the previous "
                "layer's (a plane count below the split): no single-GPU step runs those shapes"
            )
        out.append(lay)
    return out


def calibration_items(block: dict) -> list[dict]:
    """Every distinct item of every paper layout and of the step checks, once; the optimizer per network."""
    overlap = bool(block["machine"].get("overlap", False))
    seen: dict[str, dict] = {}
    for lay in paper_layouts(block):
        for it in layout_items(lay["spec"], lay["depth"], lay["height"], 1, overlap):
            seen.setdefault(it["id"], {**it, "network": lay["network"]})
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
    for lay in step_layouts(block):
        sid = f"step|{lay['network']}|{lay['depth']}x{lay['height']}|b1"
        seen.setdefault(
            sid,
            {
                "id": sid,
                "kind": "step",
                "key": lay["network"],
                "network": lay["network"],
                "gpus": lay["gpus"],
                "depth": lay["depth"],
                "height": lay["height"],
                "batch": 1,
                "spec": lay["spec"],
                "flops": 0.0,
                "bytes": 0.0,
            },
        )
    return list(seen.values())


def estimate_seconds(
    items: list[dict], tflops: float, gbs: float, repeats: int, overhead_s: float = 2e-4
) -> float:
    """A budget of the calibration's device time: each item's roofline time (at the GPU's datasheet peak
    FLOP/s and bandwidth, no better than 30 % of peak for 3D convs, a rough cuDNN figure) plus a fixed
    cost per call, over (repeats + 1 warm-up) calls, and a whole step as the sum of its layers."""
    per = {}
    for it in items:
        if it["kind"] == "step":
            continue
        per[it["id"]] = max(it["flops"] / (0.3 * tflops * 1e12), it["bytes"] / (gbs * 1e9)) + overhead_s
    steps = 0.0
    for it in items:
        if it["kind"] == "step":
            steps += sum(
                per.get(x["id"], 0.0) for x in layout_items(it["spec"], it["depth"], it["height"], 1, False)
            )
    return (sum(per.values()) + steps) * (repeats + 1)
