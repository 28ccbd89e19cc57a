"""Checks on the `checkpoint:` block that JSON schema cannot express (no heavy imports here)."""

from __future__ import annotations

from hpcdl.platform import ConfigError, check_inside


def check(cfg: dict) -> None:
    block = cfg.get("checkpoint")
    if block is None:
        return
    tolerance = block.get("claims", {}).get("ceiling_tolerance")
    if tolerance is not None:
        raise ConfigError("checkpoint.claims.ceiling_tolerance", tolerance,
                          "no value: the key was removed (#59). The ceiling is fio's now, and a save above "
                          "it by more than the ceiling's own measured spread (fio before vs after the saves) "
                          "marks it defective; delete the key")
    sizes = block["sizes"]
    if sizes["min_params"] > sizes["max_params"]:
        raise ConfigError("checkpoint.sizes.min_params", sizes["min_params"],
                          f"an integer <= checkpoint.sizes.max_params ({sizes['max_params']})")
    if sizes["points"] > 1 and sizes["min_params"] == sizes["max_params"]:
        raise ConfigError("checkpoint.sizes.points", sizes["points"],
                          "1 when min_params == max_params (a geometric sweep needs a range)")
    check_inside("checkpoint.scratch_dir", block["scratch_dir"], cfg["results_dir"])
    resume = block["resume"]
    if resume["stop_at"] >= resume["steps_total"]:
        raise ConfigError("checkpoint.resume.stop_at", resume["stop_at"],
                          f"a step < checkpoint.resume.steps_total ({resume['steps_total']})")
    for key in ("resume", "overhead"):
        model = block[key]["model"]
        if model["batch_size"] > model["n_samples"]:
            raise ConfigError(f"checkpoint.{key}.model.batch_size", model["batch_size"],
                              f"at most checkpoint.{key}.model.n_samples ({model['n_samples']})")
    overhead = block["overhead"]
    too_long = [k for k in overhead["intervals"] if k > overhead["steps"]]
    if too_long:
        raise ConfigError("checkpoint.overhead.intervals", too_long,
                          f"intervals <= checkpoint.overhead.steps ({overhead['steps']}), "
                          "or no checkpoint would be taken")
    if block["dcp_ranks"] and "dcp" not in block["formats"]:
        raise ConfigError("checkpoint.dcp_ranks", block["dcp_ranks"],
                          "[] unless 'dcp' is in checkpoint.formats")
