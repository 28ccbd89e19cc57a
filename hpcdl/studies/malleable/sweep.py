"""The points of the three experiments, from a validated config (each point is one task).

The compared variants (oversub's keep / follow, cosched's policies) run inside one point per repeat,
one after the other, in an order rotated by the repeat: machine drift over the study lands on every
variant alike, and a variant is compared with the others of its own repeat (paired by repeat).
"""

from __future__ import annotations


def _common(cfg: dict) -> dict:
    b = cfg["malleable"]
    return {
        "cores": b["cores"],
        "batch_size": b["batch_size"],
        "model": dict(b["model"]),
        "data_dir": cfg["data"]["fashion_mnist_dir"],
        "seed": b["seed"],
        "timeout_s": b["point_timeout_s"],
    }


def response_points(cfg: dict) -> list[dict]:
    r = cfg["malleable"]["response"]
    return [
        {
            "experiment": "response",
            "method": m,
            "iterations": r["iterations"],
            "change_at": list(r["change_at"]),
            "low_threads": r["low_threads"],
            **_common(cfg),
        }
        for m in r["methods"]
    ]


def _rotated(variants: list, repeat: int) -> list:
    k = repeat % len(variants) if variants else 0
    return list(variants[k:]) + list(variants[:k])


def repeats_of(block: dict, experiment: str) -> int:
    """How many repeats `experiment` runs: its own `repeats` where the block sets one (oversub), else
    malleable.repeats."""
    own = block.get(experiment, {}).get("repeats")
    return int(own if own is not None else block["repeats"])


def _repeats(cfg: dict, experiment: str, key: str, compared: list, **fixed) -> list[dict]:
    """One point per repeat of an experiment that compares `compared` (under `key`) inside each point,
    in the repeat's rotated order."""
    return [{"experiment": experiment, "repeat": r, key: _rotated(compared, r), **fixed, **_common(cfg)}
            for r in range(repeats_of(cfg["malleable"], experiment))]


def oversub_points(cfg: dict) -> list[dict]:
    o = cfg["malleable"]["oversub"]
    return _repeats(cfg, "oversub", "modes", o["modes"], quotas=list(o["quotas"]),
                    phase_iterations=o["phase_iterations"])


def workload(cfg: dict) -> list[dict]:
    jobs = cfg["malleable"]["cosched"]["jobs"]
    return [
        {
            "name": str(i),
            "arrival_s": j["arrival_s"],
            "iterations": j["iterations"],
            "request_cores": j["request_cores"],
        }
        for i, j in enumerate(jobs)
    ]


def cosched_points(cfg: dict) -> list[dict]:
    return _repeats(cfg, "cosched", "policies", cfg["malleable"]["cosched"]["policies"], jobs=workload(cfg))


def variants(point: dict) -> list[str]:
    """The variants a point runs, in its order (one for a response point)."""
    return list(point.get("modes") or point.get("policies") or [point["method"]])


def labels(point: dict) -> list[dict]:
    """The columns that name each run of a point in every table."""
    return [{"experiment": point["experiment"], "variant": v, "repeat": int(point.get("repeat", 0))}
            for v in variants(point)]
