"""The checkpoint-cost study: what saving and restoring deep-learning training state costs.

    formats      torch.save / safetensors / DCP / HDF5 / npz writers and readers
    state        nested training state <-> flat tensors any format can hold
    integrity    temp dir + fsync + rename commit, sha256 manifest, verification
    saver        synchronous saves, CheckFreq-style async saves (DCP async_save), verified loads
    measure      one (format, mode, size) sweep point incl. the storage ceiling and peak RSS
    distributed  DCP save/load from N torch.distributed ranks (sharded DTensors)
    training     training-state checkpoints: bit-identical resume, overhead vs interval, Young/Daly
    plan         the sweep points of a validated config
    analysis     tables, figures and claims; checks: config checks beyond the schema
"""


def task_units(cfg: dict) -> int | str:
    """Cores each timed task reserves (@constraint computing_units): the configured setting."""
    value = cfg["checkpoint"]["computing_units"]
    return int(value) if str(value).isdigit() else value
