"""Semantic checks of the spatial block the JSON schema cannot express (no torch imports)."""

from __future__ import annotations

from hpcdl.platform import ConfigError
from hpcdl.studies.spatial import sweep


def _planes_after(n: int, block: dict) -> list[int]:
    """Size of a spatial axis entering each conv/pool layer (same arithmetic as hpcdl.common.layers)."""
    m = block["model"]
    k, s = m["kernel"], m["conv_stride"]
    p = (k - 1) // 2 if m["padding"] == "same" else 0
    sizes = []
    for _ in m["channels"]:
        sizes.append(n)
        n = (n + 2 * p - k) // s + 1
        if n < 1:
            return sizes + [n]
        if m["pool"] > 1 and n >= m["pool"]:
            sizes.append(n)
            n = (n - m["pool"]) // m["pool"] + 1
    return sizes


def check(cfg: dict) -> None:
    b = cfg["spatial"]
    if b["warmup"] >= b["iterations"]:
        raise ConfigError("spatial.warmup", b["warmup"], f"fewer than spatial.iterations ({b['iterations']})")
    for key in ("amplitude", "ns"):
        lo, hi = b["grf"][key]
        if not lo < hi:
            raise ConfigError(f"spatial.grf.{key}", [lo, hi], "[min, max] with min < max")
    runs = [(f"spatial.{k}.layouts", k, b[k]["grid"], lay) for k in ("strong", "weak", "hybrid")
            for lay in b[k]["layouts"]]
    runs.append(("spatial.train.layout", "train", b["train"]["grid"], b["train"]["layout"]))
    for key, kind, grid, (d, pd, ph) in runs:
        depth = grid * pd if kind == "weak" else grid
        height = grid * ph if kind == "weak" else grid
        batch = (b["train"]["batch_size"] if kind == "train"
                 else b["batch_size"] * (d if kind == "weak" else 1))
        if batch % d:
            raise ConfigError(key, [d, pd, ph], f"data groups dividing the global batch {batch}")
        for axis, n, parts in (("depth", depth, pd), ("height", height, ph)):
            if parts > n:
                raise ConfigError(key, [d, pd, ph],
                                  f"at most {n} {axis} ranks (more ranks than {axis} planes)")
            if not b["allow_uneven"] and n % parts:
                raise ConfigError(key, [d, pd, ph], f"{axis} ranks dividing {n} planes "
                                  "(spatial.allow_uneven is false)")
            if parts > 1:
                thin = [s for s in _planes_after(n, b) if s < parts]
                if thin:
                    raise ConfigError(key, [d, pd, ph], f"{axis} ranks <= {min(thin)}: a layer of the model "
                                      f"sees only {min(thin)} {axis} planes, thinner than one slab per rank")
    for lay in b["exactness"]["layouts"]:
        _, pd, ph = lay
        if pd > b["exactness"]["shape"][0] or ph > b["exactness"]["shape"][1]:
            raise ConfigError("spatial.exactness.layouts", lay,
                              "no more ranks than planes of spatial.exactness.shape")
    _check_held_out(b)
    check_assumptions(b)


def _check_held_out(b: dict) -> None:
    """spatial.held_out must be exactly the runs judged out of sample: configured training runs, a
    calibrated model left, and every run with a shape neither calibrated model has listed."""
    runs = sweep.training_runs(b)
    for r in b["held_out"]:
        if r not in runs:
            raise ConfigError("spatial.held_out", r, f"a configured training run id ({', '.join(runs)})")
    if not sweep.calibrated_kinds(b):
        raise ConfigError("spatial.held_out", b["held_out"], "runs leaving the strong or the weak model a "
                          "layer shape to calibrate on")
    for r, shape in sweep.unlisted_unseen(b).items():
        raise ConfigError("spatial.held_out", b["held_out"], f"every run whose layer shapes the calibration "
                          f"does not time; {r} has {shape}, timed by neither calibrated model: list it")


def check_assumptions(b: dict) -> None:
    """spatial.assumptions: each key a section.key the paper predictions read, each value of its kind."""
    for path, values in b["assumptions"].items():
        key = f"spatial.assumptions.{path}"
        if path == "pipeline.bound":
            if not set(values) <= {"cached", "file"}:
                raise ConfigError(key, values, "values among cached, file")
            continue
        section, _, name = path.partition(".")
        if section not in ("machine", "pipeline", "gpu_calibration") or name not in b[section]:
            raise ConfigError(key, values,
                              "a key of spatial.machine, spatial.pipeline or spatial.gpu_calibration")
        have = b[section][name]
        if any(isinstance(v, bool) != isinstance(have, bool) or isinstance(v, str) != isinstance(have, str)
               for v in values):
            raise ConfigError(key, values, f"values of the kind of spatial.{path} ({have!r})")
