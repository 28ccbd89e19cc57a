"""Checks on the `hetmem:` block that JSON schema cannot express (no heavy imports here)."""

from __future__ import annotations

from hpcdl.platform import ConfigError

GUPS_MAX_LOG2 = 40


def check(cfg: dict) -> None:
    block = cfg.get("hetmem")
    if block is None:
        return
    names = [a["name"] for a in block["apps"]]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError("hetmem.apps", dup, "each kernel at most once (a trace is per kernel)")
    for i, app in enumerate(block["apps"]):
        if app["name"] == "gups" and app["size"] > GUPS_MAX_LOG2:
            raise ConfigError(f"hetmem.apps[{i}].size", app["size"], f"log2 table entries <= {GUPS_MAX_LOG2}")
    for i, lv in enumerate(block["caches"]):
        sets, rem = divmod(lv["size_kib"] * 1024, block["line_bytes"] * lv["ways"])
        if sets < 1 or rem or sets & (sets - 1):
            raise ConfigError(
                f"hetmem.caches[{i}].size_kib",
                lv["size_kib"],
                f"a size whose sets (size / (line_bytes * ways)) are a power of two; "
                f"{lv['size_kib']} KiB / ({block['line_bytes']} B * {lv['ways']}) is not",
            )
