"""Checks on the `microbatch:` block that JSON schema cannot express (no heavy imports here)."""

from __future__ import annotations

from hpcdl.platform import ConfigError
from hpcdl.studies.microbatch.workloads import network


def check(cfg: dict) -> None:
    block = cfg.get("microbatch")
    if block is None:
        return
    for net in block["networks"]:
        try:
            network(net, block["image_size"], block["deepbench_scale"])
        except ValueError as exc:
            raise ConfigError(
                "microbatch.image_size",
                block["image_size"],
                f"a size every configured network builds at ({exc})",
            ) from None
    if block.get("cudnn", {}).get("engines") and block.get("device") == "cpu":
        # cuDNN's engines exist on CUDA only: a CPU run would silently ignore the setting
        raise ConfigError("microbatch.cudnn.engines", True,
                          "false with microbatch.device: cpu (cuDNN engines run on CUDA only)")
