"""The per-GPU slab shapes the papers' layouts produce, as the GPU calibration measures them (pure).

At each of the papers' settings (spatial.papers: CosmoFlow 512^3 on 512/1024/2048 GPUs, mini-batch 64;
3D U-Net 256^3 on 256/512 GPUs, mini-batch 16) a data group holds one sample and its GPUs / mini-batch
spatial ranks split it depth x height, every power-of-two split the oracle searches
(splits). A layer of a rank then runs on ceil(d / pd) x ceil(h / ph)
of its output planes (the oracle's `_local`), batch 1 per GPU. This module lists, once each:

  layer       conv / pool / deconv / dense forward + backward at a local output shape
  halo        packing one side's halo planes of a layer's input into a send buffer and unpacking a
              received one into the halo'd input (per split axis)
  face        the same side's packed planes copied to pinned host memory and a received buffer copied
              back (device to host, host to device: a halo staged through the host between nodes)
  correction  the thin edge conv a depth-only split adds to a stride-1 'same' conv (overlap.py)
  optimizer   zero_grad + Adam step over one network's parameter tensors
  fixed       the per-layer fixed cost of each layer kind (conv, pool, deconv, dense, and the optimizer
              per network): a minimal layer (8 channels, 4^3 voxels; the optimizer over as many
              one-element tensors as the network has) timed `alone`, exactly as a layer item is timed,
              and `chained`, CHAIN of them issued back to back in one timed call as a step issues its
              layers (per layer); the oracle takes the first out of every item and adds the second
              per layer (gpu_table.Measured)
  step        a whole one-GPU training step on a slab of a paper layout (the compute-term check,
              spatial.gpu_calibration.steps), every layer at the local shape the oracle charges
  heldout_step  the same at a split no paper setting has (spatial.gpu_calibration.held_out_steps),
              whose layer shapes the calibration leaves out: the oracle prices them by interpolation

Every item has an `id` the calibration table is keyed by. Which layouts the papers' settings and the
step checks make, and the whole list of items the calibration times, once each: perfmodel.layouts.
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


def face_id(key: str, axis: str, d: int, h: int, batch: int) -> str:
    return f"face|{key}|{axis}|d{d}|h{h}|b{batch}"


def fixed_id(kind: str, mode: str) -> str:
    """The fixed-cost item of a layer kind ("conv", ..., "optimizer:<network>"), `alone` or `chained`."""
    return f"fixed|{kind}|{mode}"


def step_id(network: str, gpus: int, pd: int, ph: int) -> str:
    return f"step|{network}|{gpus}|{pd}x{ph}|b1"


def held_out_step_id(network: str, pd: int, ph: int) -> str:
    return f"heldout_step|{network}|{pd}x{ph}|b1"


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


def face_items(L: dict, pd: int, ph: int, batch: int) -> list[dict]:
    """The halo_items' send buffer copied to pinned host memory and a received one copied back, per split
    axis: what a halo staged through the host adds to each exchange (fwd: device to host, bwd: host to
    device)."""
    out = []
    for it in halo_items(L, pd, ph, batch):
        one_side = it["bytes"] / 4  # halo_items counts pack + unpack of both sides
        out.append({**it, "id": face_id(it["key"], it["axis"], it["d"], it["h"], batch), "kind": "face",
                    "bytes": 2 * one_side})
    return out


CHAIN = 16  # minimal layers a `chained` fixed-cost item issues in one timed call
FIXED_KINDS = ("conv", "pool", "deconv", "dense")
_MIN_C, _MIN_N = 8, 4  # the minimal layer: 8 channels, 4 output planes per axis


def minimal_layer(kind: str) -> dict:
    """A layer of `kind` with negligible work that runs the kernels a real one of its kind runs (bias,
    LeakyReLU, the input gradient): its time is the kind's fixed cost."""
    c, n = _MIN_C, _MIN_N
    if kind == "conv":
        return {"kind": "conv", "name": "fixed", "cin": c, "cout": c, "kernel": 3, "stride": 1, "pad": 1,
                "in": (c, n, n, n), "out": (c, n, n, n)}
    if kind == "pool":
        return {"kind": "pool", "name": "fixed", "kernel": 2, "stride": 2, "pad": 0,
                "in": (c, 2 * n, 2 * n, 2 * n), "out": (c, n, n, n)}
    if kind == "deconv":
        return {"kind": "deconv", "name": "fixed", "cin": c, "cout": c, "kernel": 2, "stride": 2, "pad": 0,
                "in": (c, n // 2, n // 2, n // 2), "out": (c, n, n, n)}
    if kind == "dense":
        return {"kind": "dense", "name": "fixed", "fin": 64, "fout": 64, "act": True, "in": (64,),
                "out": (64,)}
    raise ValueError(f"no minimal layer of kind {kind!r}")


def fixed_items(block: dict) -> list[dict]:
    """The fixed-cost items: per layer kind and per network's optimizer, `alone` and `chained`."""
    out = []
    for kind in FIXED_KINDS:
        L = minimal_layer(kind)
        base = layer_item(L, 1, 1, 1)
        for mode in ("alone", "chained"):
            out.append({**base, "id": fixed_id(kind, mode), "kind": "fixed", "key": kind, "axis": mode,
                        "layer_kind": kind, "mode": mode, "units": CHAIN if mode == "chained" else 1})
    for name, setting in block["papers"].items():
        tensors = len(param_shapes(network_spec(name, setting, block["extrapolate"])))
        for mode in ("alone", "chained"):
            out.append({"id": fixed_id(f"optimizer:{name}", mode), "kind": "fixed",
                        "key": f"optimizer:{name}", "axis": mode, "network": name, "layer_kind": "optimizer",
                        "mode": mode,
                        "shapes": [(1,)] * tensors, "units": CHAIN if mode == "chained" else 1, "batch": 1,
                        "d": 0, "h": 0, "w": 0, "flops": 0.0, "bytes": 16 * BYTES * tensors})
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
        items += face_items(L, pd, ph, batch)
        if overlap and pd > 1 and ph == 1 and corrects(L) and local(L["out"][1], pd) < L["out"][1]:
            items.append(correction_item(L, batch))
    return items


def step_layer_items(spec: list[dict], pd: int, ph: int) -> list[dict]:
    """The layer items (conv, pool, deconv, dense) a whole one-GPU step on a pd x ph slab runs."""
    kinds = ("conv", "pool", "deconv", "dense")
    return [it for it in layout_items(spec, pd, ph, 1, False) if it["kind"] in kinds]
