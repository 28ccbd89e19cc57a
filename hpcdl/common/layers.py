"""3D CNN layers as plain data (shapes, FLOPs, parameters), the one home of layer-shape arithmetic.

The spatial study's torch model (hpcdl.studies.spatial.model) and the performance oracle
(hpcdl.studies.spatial.perfmodel) both read these specs, so they see the same shapes; this module
imports neither."""

from __future__ import annotations


def padding_for(kernel: int, padding: str | int) -> int:
    """'same' (odd kernel, stride 1 keeps the size), 'valid' (0) or an explicit int."""
    if padding == "same":
        if kernel % 2 == 0:
            raise ValueError(f"'same' padding needs an odd kernel, got {kernel}")
        return (kernel - 1) // 2
    if padding == "valid":
        return 0
    if isinstance(padding, int) and 0 <= padding < kernel:
        return padding
    raise ValueError(f"padding must be 'same', 'valid' or an int in [0, kernel), got {padding!r}")


def conv_out(n: int, kernel: int, stride: int, pad: int) -> int:
    return (n + 2 * pad - kernel) // stride + 1


def cosmoflow_spec(in_shape: tuple[int, int, int, int], channels: list[int], kernel: int = 3,
                   conv_stride: int = 1, padding: str = "same", pool: int = 2,
                   dense: list[int] | None = None, outputs: int = 2) -> list[dict]:
    """Layers of conv(kernel)+LeakyReLU [+ maxpool(pool)] blocks, flatten, dense head.

    `in_shape` is (channels, depth, height, width) of one sample. Pooling is skipped once a
    spatial size would fall below the pool size, so small inputs still build.
    """
    c, d, h, w = (int(v) for v in in_shape)
    pad = padding_for(kernel, padding)
    layers: list[dict] = []
    for i, cout in enumerate(channels):
        shape_in = (c, d, h, w)
        d, h, w = (conv_out(n, kernel, conv_stride, pad) for n in (d, h, w))
        if min(d, h, w) < 1:
            raise ValueError(f"conv layer {i}: input {shape_in[1:]} too small for kernel {kernel}")
        layers.append({"kind": "conv", "name": f"conv{i}", "cin": c, "cout": cout, "kernel": kernel,
                       "stride": conv_stride, "pad": pad, "in": shape_in, "out": (cout, d, h, w)})
        c = cout
        if pool > 1 and min(d, h, w) >= pool:
            shape_in = (c, d, h, w)
            d, h, w = (conv_out(n, pool, pool, 0) for n in (d, h, w))
            layers.append({"kind": "pool", "name": f"pool{i}", "kernel": pool, "stride": pool, "pad": 0,
                           "in": shape_in, "out": (c, d, h, w)})
    fin = c * d * h * w
    layers.append({"kind": "gather", "name": "gather", "in": (c, d, h, w), "out": (fin,)})
    for j, fout in enumerate([*(dense or []), outputs]):
        last = j == len(dense or [])
        layers.append({"kind": "dense", "name": f"dense{j}", "fin": fin, "fout": fout, "act": not last,
                       "in": (fin,), "out": (fout,)})
        fin = fout
    return layers


def unet3d_spec(in_shape: tuple[int, int, int, int], levels: list[int], outputs: int = 3,
                kernel: int = 3, pool: int = 2) -> list[dict]:
    """3D U-Net (Cicek et al. 2016, as used by Oyama et al.): an encoder of `len(levels)` levels of
    two conv(kernel)+ReLU, the first to levels[i] / 2 channels and the second to levels[i],
    max-pool between levels; a decoder of
    transposed convs (kernel = stride = pool, channels kept), concatenation with the encoder's map
    of the same size (skip connection) and two convs to levels[i]. Here 'same' padding keeps
    every level a power-of-two size (the paper's 'valid' convs crop 4 planes per level); a 1x1x1
    conv to `outputs` classes per voxel ends it. Batch normalisation is left out (elementwise)."""
    c, d, h, w = (int(v) for v in in_shape)
    pad = padding_for(kernel, "same")
    layers: list[dict] = []

    def conv(name, cin, cout, k=kernel, p=pad):
        layers.append({"kind": "conv", "name": name, "cin": cin, "cout": cout, "kernel": k, "stride": 1,
                       "pad": p, "in": (cin, d, h, w), "out": (cout, d, h, w)})
        return cout

    skips = []
    for i, top in enumerate(levels):
        c = conv(f"enc{i}a", c, top // 2)
        c = conv(f"enc{i}b", c, top)
        if i < len(levels) - 1:
            skips.append((c, d, h, w))
            shape_in = (c, d, h, w)
            d, h, w = (conv_out(n, pool, pool, 0) for n in (d, h, w))
            if min(d, h, w) < 1:
                raise ValueError(f"3D U-Net: input {in_shape[1:]} too small for {len(levels)} levels")
            layers.append({"kind": "pool", "name": f"pool{i}", "kernel": pool, "stride": pool, "pad": 0,
                           "in": shape_in, "out": (c, d, h, w)})
    for i in range(len(levels) - 2, -1, -1):
        shape_in = (c, d, h, w)
        d, h, w = d * pool, h * pool, w * pool
        layers.append({"kind": "deconv", "name": f"up{i}", "cin": c, "cout": c, "kernel": pool,
                       "stride": pool,
                       "pad": 0, "in": shape_in, "out": (c, d, h, w)})
        sc = skips[i][0]
        layers.append({"kind": "concat", "name": f"cat{i}", "in": (c, d, h, w), "out": (c + sc, d, h, w)})
        c = conv(f"dec{i}a", c + sc, levels[i])
        c = conv(f"dec{i}b", c, levels[i])
    conv("out", c, outputs, k=1, p=0)
    return layers


def build_spec(shape: tuple[int, int, int], model: dict, in_channels: int = 1,
               outputs: int = 2) -> list[dict]:
    """Spec of the study's model (config block `spatial.model`) on a (depth, height, width) grid."""
    return cosmoflow_spec((in_channels, *shape), list(model["channels"]), kernel=model.get("kernel", 3),
                          conv_stride=model.get("conv_stride", 1), padding=model.get("padding", "same"),
                          pool=model.get("pool", 2), dense=list(model.get("dense", [64])), outputs=outputs)


def flops(layer: dict) -> float:
    """Forward multiply-adds x 2 of one layer for one sample (backward is modelled as 2x forward)."""
    if layer["kind"] == "conv":
        cout, d, h, w = layer["out"]
        return 2.0 * layer["cin"] * cout * layer["kernel"] ** 3 * d * h * w
    if layer["kind"] == "deconv":  # every input voxel scatters a kernel^3 block to every out-channel
        cin, d, h, w = layer["in"]
        return 2.0 * cin * layer["cout"] * layer["kernel"] ** 3 * d * h * w
    if layer["kind"] == "pool":
        c, d, h, w = layer["out"]
        return float(c * d * h * w * layer["kernel"] ** 3)
    if layer["kind"] == "dense":
        return 2.0 * layer["fin"] * layer["fout"]
    return 0.0


def layer_key(layer: dict) -> str:
    """Identifies a layer's kernel shape up to its depth, so slabs of it share one timing fit."""
    if layer["kind"] in ("conv", "pool", "deconv"):
        c, _, h, w = layer["in"]
        cout = layer.get("cout", c)
        return f"{layer['kind']}:{c}>{cout}:k{layer['kernel']}s{layer['stride']}:{h}x{w}"
    if layer["kind"] == "dense":
        return f"dense:{layer['fin']}>{layer['fout']}"
    return layer["kind"]


def family_of_key(key: str) -> str:
    """A conv/pool layer_key less its in-plane size: the layers whose channels, kernel and stride
    (and so whose work per voxel) are the same at any grid. Other keys are their own family."""
    kind, _, rest = key.partition(":")
    return key.rsplit(":", 1)[0] if kind in ("conv", "pool", "deconv") and rest.count(":") == 2 else key


def layer_family(layer: dict) -> str:
    return family_of_key(layer_key(layer))


def n_params(layer: dict) -> int:
    if layer["kind"] in ("conv", "deconv"):
        return layer["cin"] * layer["cout"] * layer["kernel"] ** 3 + layer["cout"]
    if layer["kind"] == "dense":
        return layer["fin"] * layer["fout"] + layer["fout"]
    return 0


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for v in shape:
        n *= int(v)
    return n
