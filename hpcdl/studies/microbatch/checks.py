"""Checks on the `microbatch:` block that JSON schema cannot express (no heavy imports here)."""

from __future__ import annotations

from hpcdl.platform import ConfigError
from hpcdl.studies.microbatch.common.workloads import network


def check(cfg: dict) -> None:
    block = cfg.get("microbatch")
    if block is None:
        return
    cudnn = block.get("cudnn") or {}
    ours = list(cudnn.get("networks") or [])  # μ-cuDNN's experiment's own list (null: microbatch.networks)
    layers = block.get("deepbench_layers", "subset")
    for net in dict.fromkeys([*block["networks"], *ours]):
        try:
            network(net, block["image_size"], block["deepbench_scale"], layers)
        except ValueError as exc:
            raise ConfigError(
                "microbatch.image_size",
                block["image_size"],
                f"a size every configured network builds at ({exc})",
            ) from None
    if cudnn.get("engines") and block.get("device") == "cpu":
        # cuDNN's engines exist on CUDA only: a CPU run would silently ignore the setting
        raise ConfigError("microbatch.cudnn.engines", True,
                          "false with microbatch.device: cpu (cuDNN engines run on CUDA only)")
    runs = ours or list(block["networks"])
    if cudnn.get("deepbench_limits_mib") and "deepbench" not in runs:
        # a limit nothing is planned under would read as a setting the run had
        raise ConfigError("microbatch.cudnn.deepbench_limits_mib", cudnn["deepbench_limits_mib"],
                          f"null where μ-cuDNN's experiment runs no DeepBench (it runs {', '.join(runs)}: "
                          "microbatch.cudnn.networks, or microbatch.networks)")
