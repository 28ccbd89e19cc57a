"""The GPU calibration's order and time budget (pure): which items first, and what each is expected to cost.

Every item of slabs.calibration_items is read by the paper predictions (papers.py: each paper layout's
layers, halo copies, edge corrections and optimizer, at every depth x height split) or by the compute
term's check (the whole steps, their slabs' layers, the optimizer). A partial table still serves them
through gpu_table's interpolation (linear in the local planes d x h between measured items of the same
layer), so the order makes a partial table useful as early as possible:

  predictions   per layer (kind, key, batch, halo axis) its smallest and largest local size (the
                compute term's own items where they tie), the corrections and each network's optimizer:
                with these every layout of the predictions has a time (the rest interpolated)
  compute_term  the other layer items of spatial.gpu_calibration.steps' slabs, then the whole steps
  sizes         one item per remaining local size of a layer (then nothing is interpolated across sizes)
  splits        the rest: other depth x height splits of a size already measured

The estimate: each call at the item's roofline on the GPU's datasheet peaks (no better than 30 % of
FP32 peak for a 3D conv, a rough cuDNN figure) plus a fixed launch cost, a whole step as the sum of its
layers; and, per distinct conv shape (layer items' halo'd inputs, the steps' own padded slabs), cuDNN's
algorithm search in benchmark mode: it runs up to torch.backends.cudnn.benchmark_limit (10 by default)
engine configurations for each of the forward, the data gradient (not for the data's own conv) and the
weight gradient, each at SEARCH_SLOWDOWN x the chosen one's time plus SEARCH_SETUP_S to plan it and
find its workspace. Both constants are assumptions until a run's search_s column measures them: an
estimate, not a measurement.
"""

from __future__ import annotations

from hpcdl.studies.spatial.perfmodel import slabs

TIERS = ("predictions", "compute_term", "sizes", "splits")
LAYERS = ("conv", "pool", "deconv", "dense")
CONFIGS_TRIED = 10  # torch.backends.cudnn.benchmark_limit's default
# ASSUMPTIONS, chosen so that the estimate of the whole paper calibration is not below the one run on
# record (H200, 1c2fc83: past 200 s unfinished); a run's search_s column is the measurement to refit them
SEARCH_SLOWDOWN = 6.0  # a tried engine configuration takes 6x the fastest one's time
SEARCH_SETUP_S = 5e-3  # building one engine configuration and allocating its workspace
CALL_OVERHEAD_S = 2e-4  # launches and host work of one call of an item
ITEM_OVERHEAD_S = 5e-3  # per item: making its tensors, the reference op, appending + fsyncing its row
H100 = {"peak_tflops": 67.0, "memory_gbs": 3350.0}  # H100 SXM datasheet (FP32, HBM3)


def _group(it: dict) -> tuple:
    """Items gpu_table interpolates between (the same layer at other local sizes)."""
    if it["kind"] == "optimizer":
        return ("optimizer", it["id"])
    return (it["kind"], it["key"], it["batch"], it.get("axis", ""))


def check_ids(items: list[dict]) -> set[str]:
    """The layer items papers.compute_check sums for each whole step of the calibration."""
    out = set()
    for it in items:
        if it["kind"] == "step":
            for x in slabs.layout_items(it["spec"], it["depth"], it["height"], 1, False):
                if x["kind"] in LAYERS:
                    out.add(x["id"])
    return out


def ordered(items: list[dict]) -> list[tuple[str, dict]]:
    """(tier, item) of every item, in the order the calibration measures them (module docstring)."""
    check = check_ids(items)
    groups: dict[tuple, list[dict]] = {}
    for it in items:
        if it["kind"] != "step":
            groups.setdefault(_group(it), []).append(it)
    tier: dict[str, str] = {}
    for members in groups.values():
        sizes: dict[int, dict] = {}
        for it in members:  # one representative per size: a compute-term item where there is one
            x = it.get("d", 1) * it.get("h", 1)
            if x not in sizes or (it["id"] in check and sizes[x]["id"] not in check):
                sizes[x] = it
        for x, rep in sizes.items():
            edge = x in (min(sizes), max(sizes))
            tier[rep["id"]] = "predictions" if edge else "sizes"
    for it in items:
        if it["id"] not in tier:
            tier[it["id"]] = "compute_term" if it["id"] in check or it["kind"] == "step" else "splits"
        elif tier[it["id"]] == "sizes" and it["id"] in check:
            tier[it["id"]] = "compute_term"
    rank = {t: i for i, t in enumerate(TIERS)}
    # steps after their layers within the compute-term tier; otherwise the items' own order
    pos = {it["id"]: i for i, it in enumerate(items)}
    key = lambda it: (rank[tier[it["id"]]], it["kind"] == "step", pos[it["id"]])  # noqa: E731
    return [(tier[it["id"]], it) for it in sorted(items, key=key)]


def call_seconds(it: dict, sheet: dict = H100) -> float:
    """One call of a (non-step) item at its roofline time plus the launch cost."""
    flop_s = 0.3 * sheet["peak_tflops"] * 1e12
    return max(it["flops"] / flop_s, it["bytes"] / (sheet["memory_gbs"] * 1e9)) + CALL_OVERHEAD_S


def _step_layers(it: dict) -> list[dict]:
    return slabs.layout_items(it["spec"], it["depth"], it["height"], 1, False)


def search_keys(it: dict) -> list[tuple[tuple, float, int]]:
    """(shape key, seconds of one call, passes searched) of every cuDNN conv the item's first call runs."""
    kind = it["kind"]
    if kind == "step":
        out = []
        for x in _step_layers(it):
            if x["kind"] == "conv":  # a step's conv pads its whole local slab: a shape no layer item has
                passes = 2 if x["layer"]["name"] in ("conv0", "enc0a") else 3
                out.append((("step conv", x["key"], x["d"], x["h"]), call_seconds(x), passes))
            elif x["kind"] == "deconv":
                out.append((("deconv", x["key"], x["d"], x["h"]), call_seconds(x), 3))
        return out
    if kind == "conv":  # the data's own conv has no data gradient
        passes = 2 if it["layer"]["name"] in ("conv0", "enc0a") else 3
        return [((kind, it["key"], it["d"], it["h"], it["split_d"], it["split_h"]), call_seconds(it), passes)]
    if kind == "deconv":
        return [((kind, it["key"], it["d"], it["h"]), call_seconds(it), 3)]
    if kind == "correction":
        return [((kind, it["key"], it["h"], it["w"]), call_seconds(it), 3)]
    return []


def search_seconds(call_s: float, passes: int) -> float:
    """cuDNN's benchmark-mode search of one conv shape (module docstring: an estimate)."""
    return passes * CONFIGS_TRIED * (SEARCH_SETUP_S + SEARCH_SLOWDOWN * call_s / passes)


class Estimator:
    """Expected seconds of items measured in order (timed calls + first call + search of new shapes)."""

    def __init__(self, repeats: int, sheet: dict = H100, cudnn: bool = True):
        self.repeats, self.sheet, self.searched, self.cudnn = repeats, sheet, set(), cudnn

    def __call__(self, it: dict) -> tuple[float, float]:
        """(timed + first-call seconds, search seconds) of the item; marks its conv shapes as searched."""
        if it["kind"] == "step":
            call = sum(call_seconds(x, self.sheet) for x in _step_layers(it) if x["kind"] in LAYERS)
        else:
            call = call_seconds(it, self.sheet)
        search = 0.0
        for shape, one, passes in search_keys(it):
            if shape not in self.searched:
                self.searched.add(shape)
                search += search_seconds(one, passes) if self.cudnn else 0.0  # no search off CUDA
        return (self.repeats + 1) * call + ITEM_OVERHEAD_S, search


def plan(items: list[dict], repeats: int, budget_s: float | None = None) -> dict:
    """Items per tier with the estimated seconds (timed, search, cumulative) on an H100 SXM."""
    est = Estimator(repeats)
    tiers: dict[str, dict] = {}
    total = within = 0.0
    fits = 0
    for tier, it in ordered(items):
        timed, search = est(it)
        total += timed + search
        if budget_s is not None and total <= budget_s:
            fits, within = fits + 1, total
        t = tiers.setdefault(tier, {"items": 0, "timed_s": 0.0, "search_s": 0.0})
        t["items"] += 1
        t["timed_s"] += timed
        t["search_s"] += search
        t["cumulative_s"] = total
    for t in tiers.values():
        for k in ("timed_s", "search_s", "cumulative_s"):
            t[k] = round(t[k], 1)
    out = {
        "order": list(tiers),
        "tiers": tiers,
        "conv_shapes_searched": len(est.searched),
        "estimated_search_s": round(sum(t["search_s"] for t in tiers.values()), 1),
        "estimated_total_s": round(total, 1),
        "estimate": "an estimate on an H100 SXM's datasheet peaks with cuDNN's search modelled "
        f"({CONFIGS_TRIED} configurations x {SEARCH_SLOWDOWN:g} x the best + {SEARCH_SETUP_S * 1e3:g} ms "
        "each, per pass and conv shape): not measured",
    }
    if budget_s is not None:
        out["budget_s"] = budget_s
        out["items_within_budget_estimate"] = fits
        out["estimated_s_of_those"] = round(within, 1)
    return out
