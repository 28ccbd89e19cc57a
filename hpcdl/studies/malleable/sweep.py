"""The points of the three experiments, from a validated config (each point is one task)."""

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


def oversub_points(cfg: dict) -> list[dict]:
    o = cfg["malleable"]["oversub"]
    return [
        {
            "experiment": "oversub",
            "mode": m,
            "quotas": list(o["quotas"]),
            "phase_iterations": o["phase_iterations"],
            **_common(cfg),
        }
        for m in o["modes"]
    ]


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
    c = cfg["malleable"]["cosched"]
    return [
        {"experiment": "cosched", "policy": p, "jobs": workload(cfg), **_common(cfg)} for p in c["policies"]
    ]


def label(point: dict) -> dict:
    """The columns that name a point in every table."""
    variant = point.get("method") or point.get("mode") or point.get("policy")
    return {"experiment": point["experiment"], "variant": variant}
