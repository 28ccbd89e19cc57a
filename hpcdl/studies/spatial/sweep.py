"""The spatial study's sweep: every scaling run of the config (`expand`), the part of the
`spatial:` block each unit of work reads (its task's input and its stored result's key), and the
layer shapes the calibration leaves out for the held-out runs (`held_out_shapes`)."""

from __future__ import annotations

from hpcdl.common.layers import build_spec, layer_key

CALIBRATED_KINDS = ("strong", "weak")  # the models whose layers the calibration can time (whole volume)


def run_shape(kind: str, grid: int, layout: list[int]) -> tuple[int, int, int]:
    """Global grid of a run: fixed for strong/ceiling/hybrid/train; weak grows depth/height with its ranks."""
    _, pd, ph = layout
    if kind == "weak":
        return (grid * pd, grid * ph, grid)
    return (grid, grid, grid)


def expand(block: dict) -> list[dict]:
    """Every scaling run of the config, in a fixed order (ids are stable for tests and tables).

    With `repeats` > 1 the whole list is run again (round robin), so a burst of load from other
    processes hits one repeat of a run, not all of them. The train run is repeated too: it is a
    held-out run of the oracle claim, judged like the others on the interval of its repeats.
    `held_out_repeats` above `repeats` adds rounds of the held-out runs alone after the whole ones;
    `efficiency_repeats` likewise adds rounds of the multi-rank strong runs and their ceilings, the
    pairs the efficiency claim is judged on.
    """
    points = []
    for kind in ("strong", "weak", "hybrid"):
        for layout in block[kind]["layouts"]:
            d, pd, ph = layout
            points.append({"run": f"{kind}-d{d}x{pd}x{ph}", "kind": kind, "layout": list(layout),
                           "ranks": d * pd * ph, "shape": list(run_shape(kind, block[kind]["grid"], layout)),
                           "batch_size": block["batch_size"] * (d if kind == "weak" else 1),
                           "iterations": block["iterations"]})
    if block.get("ceiling", True):
        # the machine's own ceiling for each multi-rank strong layout: the same per-rank compute as
        # independent processes, all at once, with no communication. It is measured in its strong
        # run's launch, step by step (train_run(paired_ceiling=True)): the efficiency is their ratio,
        # and on the laptop VM a slow spell of the host lasting seconds moved one launch and not the
        # next (#59), so the pair shares the host's state of the moment. Its point names the launch
        # it is measured in (`paired_with`) and is not launched itself.
        paired = []
        for p in points:
            if p["kind"] == "strong" and p["ranks"] > 1 and p["layout"][0] == 1:
                strong = {**p, "paired_ceiling": p["run"].replace("strong", "ceiling")}
                paired += [strong, ceiling_point(strong)]
            else:
                paired.append(p)
        points = paired
    t = block["train"]
    d, pd, ph = t["layout"]
    points.append({"run": f"train-d{d}x{pd}x{ph}", "kind": "train", "layout": list(t["layout"]),
                   "ranks": d * pd * ph, "shape": list(run_shape("train", t["grid"], t["layout"])),
                   "batch_size": t["batch_size"], "iterations": t["iterations"]})
    held_out = set(block.get("held_out", []))
    held_out_rounds = block.get("held_out_repeats") or 0
    efficiency_rounds = block.get("efficiency_repeats") or 0

    def launched(p: dict, r: int) -> bool:
        return (r < block["repeats"] or (p["run"] in held_out and r < held_out_rounds)
                or (p["kind"] in ("strong", "ceiling") and p["ranks"] > 1 and r < efficiency_rounds))

    rounds = max(block["repeats"], held_out_rounds, efficiency_rounds)
    return [{**p, "repeat": r} for r in range(rounds) for p in points if launched(p, r)]


# What each unit of work reads from the `spatial:` block. Its task receives only that part, and
# the point store keys the unit's stored result by it (hpcdl.platform.kit.points): editing a sweep list,
# `repeats`, the extrapolation or the machine recomputes no stored result, and a unit that starts
# reading another key fails with a KeyError instead of reusing a stale result. A run reads `warmup`:
# a paired ceiling starts alternating with its strong run when the timed steps begin.
def run_block(block: dict) -> dict:
    return {k: block[k] for k in ("seed", "dtype", "n_samples", "grf", "model", "lr", "allow_uneven",
                                  "threads_per_rank", "run_timeout_s", "halo_timeout_s", "overlap",
                                  "bucket_kb", "warmup")}


def ceiling_point(strong: dict) -> dict:
    """The ceiling point a strong point measures in its launch (its `paired_ceiling`), same repeat."""
    ceiling = {k: v for k, v in strong.items() if k != "paired_ceiling"}
    return {**ceiling, "run": strong["paired_ceiling"], "kind": "ceiling", "paired_with": strong["run"]}


def launches(points: list[dict]) -> list[dict]:
    """The points that are launched: a ceiling is measured inside its strong run's launch."""
    return [p for p in points if "paired_with" not in p]


def calibration_block(block: dict) -> dict:
    return {**{k: block[k] for k in ("seed", "n_samples", "grf", "model", "batch_size", "calibration",
                                     "threads_per_rank", "run_timeout_s")},
            "strong": {"grid": block["strong"]["grid"]}, "weak": {"grid": block["weak"]["grid"]},
            "calibrated_kinds": calibrated_kinds(block)}


def exactness_block(block: dict) -> dict:
    return {**{k: block[k] for k in ("model", "run_timeout_s", "halo_timeout_s")},
            "exactness": {"shape": block["exactness"]["shape"]}}


def placement(block: dict, device: str) -> dict:
    """Where every unit runs, added to each unit's block (so to its stored result's key): the study's
    resolved device (hpcdl.platform.kit.device.study_device) and, on CUDA, whether ranks may share a GPU.
    A result measured on one device is never reused for another."""
    return {"device": device, **({"gpu_sharing": bool(block.get("gpu_sharing", False))}
                                 if device == "cuda" else {})}


# Out of sample (spatial.held_out): the oracle is judged on runs whose layer shapes its calibration
# never timed. A layer's shape is its layer_key (channels, kernel, height x width; depth is the
# fitted size), so a held-out run is unseen exactly when none of its keys is calibrated.
def training_runs(block: dict) -> dict[str, dict]:
    """Every training run of the config (not the ceiling runs: no prediction), by id, first repeat."""
    return {p["run"]: p for p in expand(block) if p["kind"] != "ceiling" and p["repeat"] == 0}


def layer_shapes(point: dict, block: dict, kinds=("conv", "pool", "dense")) -> set[str]:
    return {layer_key(L) for L in build_spec(tuple(point["shape"]), block["model"]) if L["kind"] in kinds}


def held_out_shapes(block: dict) -> set[str]:
    """Layer shapes the calibration leaves out: every conv/pool shape of a held-out run (an in-sample
    run with the same shape predicts that layer from its family's fit or its kind's line, as a
    held-out run does), and the dense shapes no in-sample run has (the head's last layer is the
    same at every grid: it stays)."""
    runs, held = training_runs(block), set(block["held_out"])
    grid = set().union(*(layer_shapes(p, block, ("conv", "pool")) for r, p in runs.items() if r in held))
    dense = set().union(*(layer_shapes(p, block, ("dense",)) for r, p in runs.items() if r in held))
    seen = set().union(*(layer_shapes(p, block, ("dense",)) for r, p in runs.items() if r not in held))
    return grid | (dense - seen)


def _model_shapes(block: dict, kind: str) -> set[str]:
    spec = build_spec(run_shape(kind, block[kind]["grid"], [1, 1, 1]), block["model"])
    return {layer_key(L) for L in spec if L["kind"] in ("conv", "pool")}


def calibrated_kinds(block: dict) -> list[str]:
    """The models the calibration times: strong and weak, less one whose every conv/pool shape is
    held out (timing it would only be thrown away at the fit)."""
    held = held_out_shapes(block)
    return [k for k in CALIBRATED_KINDS if not _model_shapes(block, k) <= held]


def unlisted_unseen(block: dict) -> dict[str, str]:
    """In-sample run -> a conv/pool shape of it that neither calibrated model has (nor a held-out run):
    out of sample in fact but not listed in spatial.held_out (checks.py refuses the config)."""
    left_out = held_out_shapes(block)
    timed = set().union(*(_model_shapes(block, k) for k in calibrated_kinds(block)))
    held = set(block["held_out"])
    return {r: sorted(unseen)[0] for r, p in training_runs(block).items()
            if r not in held and (unseen := layer_shapes(p, block, ("conv", "pool")) - timed - left_out)}
