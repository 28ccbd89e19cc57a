"""What the offload task app's task bodies run (tasks/offload.py): one measured sweep point and one
capacity search, each from the plain dict `sweep.py` made for it."""

from __future__ import annotations

from hpcdl.studies.offload import tiers
from hpcdl.studies.offload.capacity import largest_depth
from hpcdl.studies.offload.train import RunSpec, train


def _spec(point: dict) -> RunSpec:
    """The point's RunSpec. Its `device` is the app's resolved offload.device: a point without one is
    refused, not run on a default."""
    if "device" not in point:
        raise ValueError("an offload point lacks 'device' (the resolved offload.device, which the task app "
                         "resolves once and sweep.py puts in every point)")
    return RunSpec(**point)


def measure_point(point: dict) -> dict:
    """A sweep point (sweep.sweep_points): its record, with both tiers' bandwidths measured after the
    run in the same process and slow-tier directory (tiers.measure), and its median step's timeline."""
    point = dict(point)
    probe = point.pop("tier_probe", None)
    rec, timeline = train(_spec(point))
    if probe is not None:
        rec.update(tiers.measure(rec["device"], point["slow_dir"], point["io_mode"], probe["bytes"],
                                 probe["rounds"]))
    return {"record": rec, "timeline": timeline}


def search_point(point: dict) -> dict:
    """A capacity point (sweep.capacity_points)."""
    return largest_depth(_spec(point["spec"]), point["max_depth"])
