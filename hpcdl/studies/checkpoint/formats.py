"""The five on-disk formats, each as write(flat, directory) / read(directory) -> flat.

`flat` is a dict of contiguous CPU tensors (see `state.flatten`). Writers only put
bytes into a staging directory; fsync, manifest and rename are `integrity`'s job, so
every format gets the same durability and the timings compare like with like.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class Format:
    name: str
    write: Callable[[dict, Path], None]
    read: Callable[[Path], dict]


def _torch_write(flat: dict, d: Path) -> None:
    with open(d / "state.pt", "wb") as f:
        torch.save(flat, f)


def _torch_read(d: Path) -> dict:
    # weights_only: a checkpoint is data, never code to execute.
    return torch.load(d / "state.pt", map_location="cpu", weights_only=True)


def _safetensors_write(flat: dict, d: Path) -> None:
    from safetensors.torch import save_file

    save_file(flat, str(d / "state.safetensors"))


def _safetensors_read(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(d / "state.safetensors"), device="cpu")


def _hdf5_write(flat: dict, d: Path) -> None:
    import h5py

    with h5py.File(d / "state.h5", "w") as f:
        for key, t in flat.items():
            f.create_dataset(key, data=t.numpy())


def _hdf5_read(d: Path) -> dict:
    import h5py

    out = {}
    with h5py.File(d / "state.h5", "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = torch.from_numpy(np.asarray(obj[()]))
        f.visititems(visit)
    return out


def _npz_write(flat: dict, d: Path) -> None:
    with open(d / "state.npz", "wb") as f:
        np.savez(f, **{k: t.numpy() for k, t in flat.items()})


def _npz_read(d: Path) -> dict:
    with np.load(d / "state.npz", allow_pickle=False) as z:
        return {k: torch.from_numpy(z[k]) for k in z.files}


def dcp_no_dist() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized())


_DCP_SINGLE_PROCESS = ".*torch.distributed is disabled.*"


@contextmanager
def quiet_dcp():
    """DCP warns on every call that it runs without a process group; here that is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DCP_SINGLE_PROCESS)
        yield


def ignore_dcp_single_process_warning() -> None:
    """Silence that warning process-wide, for DCP saves run on a background thread: catch_warnings
    swaps the global filter list, which is not thread-safe, so a thread cannot scope it."""
    warnings.filterwarnings("ignore", message=_DCP_SINGLE_PROCESS)


def dcp_write_alone(flat: dict, d: Path) -> None:
    """DCP's public writer into directory `d`, by this process alone: no collective on any process
    group, so it may run on a background thread while training uses the default group. It does not
    touch the warning filters (see ignore_dcp_single_process_warning)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(flat, storage_writer=dcp.FileSystemWriter(str(d)), no_dist=True)


def _dcp_write(flat: dict, d: Path) -> None:
    import torch.distributed.checkpoint as dcp

    with quiet_dcp():
        dcp.save(flat, storage_writer=dcp.FileSystemWriter(str(d)), no_dist=dcp_no_dist())


def dcp_empty_like_checkpoint(d: Path) -> dict:
    """Freshly allocated tensors shaped like everything stored in a DCP directory."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(str(d)).read_metadata()
    out = {}
    for key, m in meta.state_dict_metadata.items():
        if not isinstance(m, TensorStorageMetadata):
            raise ValueError(f"DCP checkpoint {d} holds a non-tensor entry {key!r}; "
                             "expected a flat tensor dict")
        out[key] = torch.empty(m.size, dtype=m.properties.dtype)
    return out


def _dcp_read(d: Path) -> dict:
    import torch.distributed.checkpoint as dcp

    out = dcp_empty_like_checkpoint(d)
    with quiet_dcp():
        dcp.load(out, storage_reader=dcp.FileSystemReader(str(d)), no_dist=dcp_no_dist())
    return out


FORMATS: dict[str, Format] = {
    "torch": Format("torch", _torch_write, _torch_read),
    "safetensors": Format("safetensors", _safetensors_write, _safetensors_read),
    "dcp": Format("dcp", _dcp_write, _dcp_read),
    "hdf5": Format("hdf5", _hdf5_write, _hdf5_read),
    "npz": Format("npz", _npz_write, _npz_read),
}


def get(name: str) -> Format:
    if name not in FORMATS:
        raise ValueError(f"unknown checkpoint format {name!r}; allowed: {', '.join(FORMATS)}")
    return FORMATS[name]

