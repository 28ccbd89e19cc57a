"""Semantic checks of the `malleable:` block that the JSON schema cannot express (no heavy imports)."""

from __future__ import annotations

from hpcdl.platform import ConfigError


def check(cfg: dict) -> None:
    b = cfg["malleable"]
    r = b["response"]
    k1, k2 = r["change_at"]
    if not 0 < k1 < k2 < r["iterations"]:
        raise ConfigError("malleable.response.change_at", r["change_at"],
                          f"two iterations 0 < k1 < k2 < response.iterations = {r['iterations']}")
    if r["low_threads"] >= b["cores"]:
        raise ConfigError("malleable.response.low_threads", r["low_threads"],
                          f"fewer threads than malleable.cores = {b['cores']} "
                          "(the change goes down, then back)")
    for q in b["oversub"]["quotas"]:
        if q > b["cores"]:
            raise ConfigError("malleable.oversub.quotas", q, f"quotas <= malleable.cores = {b['cores']}")
    for i, j in enumerate(b["cosched"]["jobs"]):
        if j["request_cores"] > b["cores"]:
            raise ConfigError(f"malleable.cosched.jobs[{i}].request_cores", j["request_cores"],
                              f"at most malleable.cores = {b['cores']}")
