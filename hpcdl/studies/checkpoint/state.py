"""Nested training state <-> a flat dict of tensors every format can hold.

Training state mixes tensors with ints, floats, tuples, int-keyed dicts (optimizer
state), NumPy arrays and Python RNG tuples. Tensor-only formats (safetensors, HDF5,
npz, DCP) cannot hold that as is, so `flatten` lifts every tensor/array leaf to a
path key and encodes the remaining skeleton as tagged JSON stored in one uint8
tensor. `unflatten` inverts it exactly (key types, tuples, array dtypes preserved),
which is what makes a bit-identical resume possible from every format.
Tensors are copied to host memory unless `keep_device` (a checkpointer that copies GPU state to
host memory itself, timed, as saver.py does).
"""

from __future__ import annotations

import json

import numpy as np
import torch

SKELETON_KEY = "__skeleton__"


def flatten(state, keep_device: bool = False) -> dict[str, torch.Tensor]:
    """Flat {path: tensor} with the non-tensor skeleton under SKELETON_KEY; tensors in host memory,
    or left on their device with `keep_device`."""
    tensors: dict[str, torch.Tensor] = {}

    def enc(obj, path: str):
        if path in tensors:
            raise ValueError(f"two state entries map to the same key {path!r}")
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            tensors[path] = (t if keep_device else t.cpu()).contiguous()
            return {"t": path}
        if isinstance(obj, np.ndarray):
            tensors[path] = torch.from_numpy(np.ascontiguousarray(obj).astype(np.int64)
                                             if obj.dtype == np.uint32 else np.ascontiguousarray(obj))
            return {"a": path, "dtype": obj.dtype.str}
        if isinstance(obj, dict):
            return {"d": [[_key(k), enc(v, _join(path, k))] for k, v in obj.items()]}
        if isinstance(obj, (list, tuple)):
            items = [enc(v, _join(path, i)) for i, v in enumerate(obj)]
            return {"tuple" if isinstance(obj, tuple) else "list": items}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return {"v": obj}
        if isinstance(obj, np.generic):
            return {"v": obj.item()}
        raise TypeError(f"cannot checkpoint a {type(obj).__name__} at {path or '/'}")

    skeleton = enc(state, "")
    data = json.dumps(skeleton).encode()
    tensors[SKELETON_KEY] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return tensors


def unflatten(flat: dict[str, torch.Tensor]):
    """The nested state `flatten` was given (tensors are the loaded ones, not copies)."""
    if SKELETON_KEY not in flat:
        raise KeyError(f"state has no {SKELETON_KEY!r} entry: "
                       "not written by hpcdl.studies.checkpoint.state.flatten")
    skeleton = json.loads(bytes(flat[SKELETON_KEY].numpy()).decode())

    def dec(node):
        if "t" in node:
            return flat[node["t"]]
        if "a" in node:
            return flat[node["a"]].numpy().astype(np.dtype(node["dtype"]))
        if "d" in node:
            return {_unkey(k): dec(v) for k, v in node["d"]}
        if "tuple" in node:
            return tuple(dec(v) for v in node["tuple"])
        if "list" in node:
            return [dec(v) for v in node["list"]]
        return node["v"]

    return dec(skeleton)


def _join(path: str, k) -> str:
    return f"{path}/{k}" if path else str(k)


def _key(k):
    if isinstance(k, bool) or not isinstance(k, (int, str)):
        raise TypeError(f"state dict keys must be int or str, got {k!r}")
    return [type(k).__name__, k]


def _unkey(k):
    kind, value = k
    return int(value) if kind == "int" else value


def tensor_bytes(flat: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in flat.values())
