"""The GPU calibration's order and time budget (pure): which items first, and what each is expected to cost.

Every item of layouts.calibration_items is read by the paper predictions (paper_scale: each paper layout's
layers, halo copies and their host staging, edge corrections, optimizer and fixed costs, at every
depth x height split) or by the compute term's check (the whole steps, their slabs' layers, the
optimizer, the fixed costs). A partial table still serves them through gpu_table's interpolation (linear
in the local planes d x h between measured items of the same layer), so the order makes a partial table
useful as early as possible, and then completes the papers' settings one at a time:

  predictions   per layer (kind, key, batch, halo axis) its smallest and largest local size (the
                compute term's own items where they tie), the corrections, each network's optimizer and
                the fixed costs: with these every layout of the predictions has a time (the rest
                interpolated)
  compute_term  the other layer items of spatial.gpu_calibration.steps' slabs, each whole step right after
                the layers it is the first to sum (in the same call as them where the budget allows, so
                cuDNN's search of their convs is not run twice), then the held-out steps (whose layers
                the calibration leaves out)
  settings      the rest, setting by setting (layouts.setting_order: each network's first and last GPU
                counts, whose speedup the papers published, then the counts between): once a setting's
                items are in, its every layout is measured, nothing of it interpolated

A budget-stopped call resumes where it stopped (gpu.calibrate), so each GPU call adds the next items
of this order.

The estimate: each call at the item's roofline on the GPU's datasheet peaks (no better than 30 % of
FP32 peak for a 3D conv, a rough cuDNN figure) plus a fixed launch cost, a whole step as the sum of its
layers; and, per distinct conv shape (layer items' halo'd inputs, which the steps' convs share), cuDNN's
algorithm search in benchmark mode: it runs up to torch.backends.cudnn.benchmark_limit (10 by default)
engine configurations for each of the forward, the data gradient (not for the data's own conv) and the
weight gradient, each at SEARCH_SLOWDOWN x the chosen one's time plus SEARCH_SETUP_S to plan it and
find its workspace. Both constants are assumptions until a run's search_s column measures them: an
estimate, not a measurement. `remaining` rescales it by a measured table's own pace (its search_s and
times against this estimate of the same items, its sessions' wall time per item) to say how long the
items still missing take on that GPU, and in how many calls of a given budget (cuDNN's search cache
does not outlive a call, so a shape met in an earlier call is searched again).
"""

from __future__ import annotations

from hpcdl.studies.spatial.perfmodel import layouts, slabs

TIERS = ("predictions", "compute_term", "settings")
LAYERS = ("conv", "pool", "deconv", "dense")
SIZED = (*LAYERS, "halo", "face")  # kinds measured at many local sizes, interpolated between them
STEPS = ("step", "heldout_step")
CONFIGS_TRIED = 10  # torch.backends.cudnn.benchmark_limit's default
# ASSUMPTIONS, chosen so that the estimate of the whole paper calibration is not below the one run on
# record (H200, 1c2fc83: past 200 s unfinished); a run's search_s column is the measurement to refit them
SEARCH_SLOWDOWN = 6.0  # a tried engine configuration takes 6x the fastest one's time
SEARCH_SETUP_S = 5e-3  # building one engine configuration and allocating its workspace
CALL_OVERHEAD_S = 2e-4  # launches and host work of one call of an item
ITEM_OVERHEAD_S = 5e-3  # per item: making its tensors, the reference op, appending + fsyncing its row
# H100 SXM datasheet (FP32, HBM3; PCIe Gen5 128 GB/s both ways: 64 one way, for the face copies)
H100 = {"peak_tflops": 67.0, "memory_gbs": 3350.0, "host_link_gbs": 64.0}


def _group(it: dict) -> tuple:
    """Items gpu_table interpolates between (the same layer at other local sizes)."""
    if it["kind"] == "optimizer":
        return ("optimizer", it["id"])
    return (it["kind"], it["key"], it["batch"], it.get("axis", ""))


def check_ids(items: list[dict]) -> dict[str, int]:
    """The layer items paper_scale.compute_check sums for each whole (in-sample) step of the calibration:
    id -> the position of the first step (in the items' order) that sums it."""
    out: dict[str, int] = {}
    steps = [it for it in items if it["kind"] == "step"]
    for i, it in enumerate(steps):
        for x in slabs.step_layer_items(it["spec"], it["depth"], it["height"]):
            out.setdefault(x["id"], i)
    return out


def ordered(items: list[dict]) -> list[tuple[str, dict]]:
    """(tier, item) of every item, in the order the calibration measures them (module docstring)."""
    check = check_ids(items)
    groups: dict[tuple, list[dict]] = {}
    for it in items:
        if it["kind"] in SIZED:
            groups.setdefault(_group(it), []).append(it)
    tier: dict[str, str] = {}
    for members in groups.values():
        sizes: dict[int, dict] = {}
        for it in members:  # one representative per size: a compute-term item where there is one
            x = it.get("d", 1) * it.get("h", 1)
            if x not in sizes or (it["id"] in check and sizes[x]["id"] not in check):
                sizes[x] = it
        for x in (min(sizes), max(sizes)):
            tier[sizes[x]["id"]] = "predictions"
    for it in items:
        if it["id"] in tier:
            continue
        if it["kind"] not in SIZED and it["kind"] not in STEPS:  # corrections, optimizers, fixed costs
            tier[it["id"]] = "predictions"
        elif it["kind"] in STEPS or it["id"] in check:
            tier[it["id"]] = "compute_term"
        else:
            tier[it["id"]] = "settings"
    rank = {t: i for i, t in enumerate(TIERS)}
    pos = {it["id"]: i for i, it in enumerate(items)}
    step_pos = {it["id"]: i for i, it in enumerate(x for x in items if x["kind"] == "step")}

    def key(it: dict) -> tuple:
        t = tier[it["id"]]
        if t == "settings":
            return rank[t], it.get("setting_rank", 0), 0, pos[it["id"]]
        if t == "compute_term":
            # each step right after the layers it is the first to sum (a budget that stops between them
            # would have a later call search those layers' convs again), the held-out steps last
            if it["kind"] == "heldout_step":
                return rank[t], len(step_pos), 2, pos[it["id"]]
            if it["kind"] == "step":
                return rank[t], step_pos[it["id"]], 1, pos[it["id"]]
            return rank[t], check[it["id"]], 0, pos[it["id"]]
        return rank[t], 0, 0, pos[it["id"]]

    return [(tier[it["id"]], it) for it in sorted(items, key=key)]


def label(tier: str, it: dict) -> str:
    """The part of the order an item belongs to: its tier, and in the settings tier its setting."""
    return f"{layouts.SETTING_PREFIX}{it['setting']}" if tier == "settings" and it.get("setting") else tier


def call_seconds(it: dict, sheet: dict = H100) -> float:
    """One call of a (non-step) item at its roofline time plus the launch cost."""
    kind = it["kind"]
    if kind == "fixed":
        return CALL_OVERHEAD_S * (it.get("units", 1) or 1)
    if kind == "face":
        return it["bytes"] / (sheet.get("host_link_gbs", sheet["memory_gbs"]) * 1e9) + CALL_OVERHEAD_S
    flop_s = 0.3 * sheet["peak_tflops"] * 1e12
    return max(it["flops"] / flop_s, it["bytes"] / (sheet["memory_gbs"] * 1e9)) + CALL_OVERHEAD_S


def _step_layers(it: dict) -> list[dict]:
    return slabs.step_layer_items(it["spec"], it["depth"], it["height"])


def _conv_key(x: dict) -> tuple[tuple, int]:
    """A conv layer item's cuDNN shape (its halo'd window) and the passes searched (the data's own conv
    has no data gradient)."""
    passes = 2 if x["layer"]["name"] in ("conv0", "enc0a") else 3
    return (x["kind"], x["key"], x["d"], x["h"], x["split_d"], x["split_h"]), passes


def search_keys(it: dict) -> list[tuple[tuple, float, int]]:
    """(shape key, seconds of one call, passes searched) of every cuDNN conv the item's first call runs."""
    kind = it["kind"]
    if kind in STEPS:  # a step's convs run on the windows its layer items have: the same shapes
        out = []
        for x in _step_layers(it):
            if x["kind"] == "conv":
                shape, passes = _conv_key(x)
                out.append((shape, call_seconds(x), passes))
            elif x["kind"] == "deconv":
                out.append((("deconv", x["key"], x["d"], x["h"]), call_seconds(x), 3))
        return out
    if kind == "conv":
        shape, passes = _conv_key(it)
        return [(shape, call_seconds(it), passes)]
    if kind == "deconv":
        return [((kind, it["key"], it["d"], it["h"]), call_seconds(it), 3)]
    if kind == "correction":
        return [((kind, it["key"], it["h"], it["w"]), call_seconds(it), 3)]
    if kind == "fixed" and it["layer_kind"] in ("conv", "deconv"):
        return [(("fixed", it["layer_kind"]), CALL_OVERHEAD_S, 3)]
    return []


def search_seconds(call_s: float, passes: int) -> float:
    """cuDNN's benchmark-mode search of one conv shape (module docstring: an estimate)."""
    return passes * CONFIGS_TRIED * (SEARCH_SETUP_S + SEARCH_SLOWDOWN * call_s / passes)


class Estimator:
    """Expected seconds of items measured in order (timed calls + first call + search of new shapes)."""

    def __init__(self, repeats: int, sheet: dict = H100, cudnn: bool = True):
        self.repeats, self.sheet, self.searched, self.cudnn = repeats, sheet, set(), cudnn

    def timed(self, it: dict) -> float:
        """Seconds of the item's repeats and its first call, cuDNN's search left out."""
        if it["kind"] in STEPS:
            call = sum(call_seconds(x, self.sheet) for x in _step_layers(it))
        else:
            call = call_seconds(it, self.sheet)
        return (self.repeats + 1) * call + ITEM_OVERHEAD_S

    def __call__(self, it: dict) -> tuple[float, float]:
        """(timed + first-call seconds, search seconds) of the item; marks its conv shapes as searched."""
        search = 0.0
        for shape, one, passes in search_keys(it):
            if shape not in self.searched:
                self.searched.add(shape)
                search += search_seconds(one, passes) if self.cudnn else 0.0  # no search off CUDA
        return self.timed(it), search


def plan(items: list[dict], repeats: int, budget_s: float | None = None) -> dict:
    """Items per tier (and per setting of the settings tier) with the estimated seconds (timed, search,
    cumulative) on an H100 SXM."""
    est = Estimator(repeats)
    tiers: dict[str, dict] = {}
    total = within = 0.0
    fits = 0
    for tier, it in ordered(items):
        timed, search = est(it)
        total += timed + search
        if budget_s is not None and total <= budget_s:
            fits, within = fits + 1, total
        for name in dict.fromkeys([tier, label(tier, it)]):
            t = tiers.setdefault(name, {"items": 0, "timed_s": 0.0, "search_s": 0.0})
            t["items"] += 1
            t["timed_s"] += timed
            t["search_s"] += search
            t["cumulative_s"] = total
    for t in tiers.values():
        for k in ("timed_s", "search_s", "cumulative_s"):
            t[k] = round(t[k], 1)
    out = {
        "order": [t for t in tiers if t in TIERS],
        "settings": [t for t in tiers if t not in TIERS],
        "tiers": tiers,
        "conv_shapes_searched": len(est.searched),
        "estimated_search_s": round(sum(tiers[t]["search_s"] for t in TIERS if t in tiers), 1),
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


def pace(items: list[dict], rows: list[dict], repeats: int, sessions: list[dict] | None = None) -> dict:
    """How a measured table ran against this module's estimate of the same items, session by session
    (cuDNN's search cache lives one session): measured / estimated search seconds, measured / estimated
    timed seconds, and the seconds per item neither accounts for (tensors, the reference op, the row
    written and fsynced, the run's start), from the sessions' wall time where the provenance has it."""
    by_id = {r["id"]: r for r in rows}
    est: dict[int, Estimator] = {}
    search = [0.0, 0.0]
    timed = [0.0, 0.0]
    for _, it in ordered(items):
        r = by_id.get(it["id"])
        if r is None:
            continue
        e = est.setdefault(int(r.get("session", 0) or 0), Estimator(repeats))
        t, s = e(it)
        search[0] += float(r.get("search_s", 0.0) or 0.0)
        search[1] += s
        timed[0] += repeats * float(r["median_s"])
        timed[1] += t - ITEM_OVERHEAD_S
    # the sessions' wall time less every row's own search and repeats (rows of items no longer listed too:
    # the sessions spent it), per row
    wall = sum(float(s.get("wall_s", 0.0) or 0.0) for s in (sessions or []) if s.get("measured"))
    counted = sum(int(s.get("measured", 0) or 0) for s in (sessions or []) if s.get("wall_s"))
    spent = sum(float(r.get("search_s", 0.0) or 0.0) + repeats * float(r["median_s"]) for r in rows)
    per_item = max(0.0, (wall - spent) / counted) if counted else ITEM_OVERHEAD_S
    return {"items": len([i for i in items if i["id"] in by_id]),
            "search_ratio": search[0] / search[1] if search[1] else 1.0,
            "timed_ratio": timed[0] / timed[1] if timed[1] else 1.0,
            "per_item_s": per_item, "measured_search_s": search[0], "measured_timed_s": timed[0],
            "sessions_wall_s": wall}


def remaining(items: list[dict], rows: list[dict], repeats: int, sessions: list[dict] | None,
              call_budget_s: float, start_s: float = 10.0) -> dict:
    """The items a table still lacks, in order, at the table's own pace (`pace`): their seconds, and how
    many calls of `call_budget_s` (each losing `start_s` to the interpreter, CUDA and cuDNN's start and
    the warm-up, and cuDNN's search cache of the last call) measure them."""
    p = pace(items, rows, repeats, sessions)
    have = {r["id"] for r in rows}
    calls, used, est = 0, call_budget_s, None
    total = 0.0
    left = [(t, it) for t, it in ordered(items) if it["id"] not in have]
    per_label: dict[str, float] = {}
    for tier, it in left:
        if est is None:
            est = Estimator(repeats)
        timed, search = est(it)
        cost = (timed - ITEM_OVERHEAD_S) * p["timed_ratio"] + search * p["search_ratio"] + p["per_item_s"]
        if used + cost > call_budget_s - start_s:  # the next call, with a cold search cache
            calls, used, est = calls + 1, 0.0, Estimator(repeats)
            timed, search = est(it)
            cost = (timed - ITEM_OVERHEAD_S) * p["timed_ratio"] + search * p["search_ratio"] + p["per_item_s"]
        used += cost
        total += cost
        name = label(tier, it)
        per_label[name] = per_label.get(name, 0.0) + cost
    return {"items_left": len(left), "items_measured": len(have & {it["id"] for it in items}),
            "estimated_s": round(total, 1), "calls": calls, "call_budget_s": call_budget_s,
            "per_part_s": {k: round(v, 1) for k, v in per_label.items()},
            "pace": {k: round(v, 3) if isinstance(v, float) else v for k, v in p.items()}}
