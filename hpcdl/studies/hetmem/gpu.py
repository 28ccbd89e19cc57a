"""The study's CUDA path (tasks/hetmem.py runs it when hetmem.device resolves to cuda): real two-tier
placements on the task's GPU, against which the differential estimate is checked on HARDWARE.

Tiers: the fast tier is the GPU's own memory (HBM); the slow tier is pinned host memory mapped into
the GPU's address space (zero-copy: with unified addressing the device pointer of a pinned buffer is
its host pointer), so a kernel reading a "slow" object really goes over the host link. Objects are
exposed to torch through `__cuda_array_interface__` (`place`); temporaries torch allocates inside a
step stay in device memory. `check_zero_copy` proves the aliasing before anything is measured.

Each mini-app (STREAM triad, 3-D stencil, CG, GUPS, an MLP training step; `APPS`) is the CPU kernels'
algorithm written in torch, with named objects. Its placements (`placements`): all-fast, all-slow,
each object alone in fast memory, and distinct random object subsets. Each placement is placed afresh
and timed (median of `gpu.repeats` steps after a warm-up). The estimate is the differential one at
object granularity with a single window, T = s*T_fast + (1-s)*T_slow, s the share of the bytes a step
moves that belong to fast objects, counted from the kernel's operations: no PEBS-like sampler exists
for GPU kernels here, so nothing is sampled (rows say sample_every 1: every byte counted).

What of the CPU path runs here, and why:
  * valgrind traces and the simulated reference do not: their reason to exist is that a CPU node
    has one memory tier; a GPU has two real ones, so the measured times are the reference.
    (The CPU kernels' traces are also no trace of what the GPU runs.)
  * the placement agent does: greedy, random and PPO over the object-granularity estimator (one
    range per object, one window) cost seconds of CPU per app, and each policy's placement is then
    MEASURED on the GPU, so the placement claim is judged on hardware too.
Depends on torch, numpy and the study's layout/estimator/agent modules; torch is imported inside the
functions, so the pure parts (placements, shares, policies) run and are tested without a GPU.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from hpcdl.studies.hetmem.agent import derived_seed
from hpcdl.studies.hetmem.estimator import DifferentialEstimator
from hpcdl.studies.hetmem.layout import PAGE, Layout
from hpcdl.studies.hetmem.trace import Obj

HARDWARE = "hardware: GPU HBM vs mapped pinned host"  # the reference of every row of this path
SAMPLE_EVERY = 1  # shares are counted from the kernels' operations, not sampled


# ------------------------------------------------------------------------------- pure placement logic
def placements(names: list[str], random_placements: int, rng: np.random.Generator):
    """(label, kind, fast objects): all-fast, all-slow, each object alone, then up to
    `random_placements` random subsets (each object fast with probability 1/2) that are none of the
    placements before them; an app with few objects has fewer distinct subsets to draw."""
    out = [("all_fast", "bound", frozenset(names)), ("all_slow", "bound", frozenset())]
    out += [(f"object:{n}", "object", frozenset({n})) for n in names]
    seen = {fast for _, _, fast in out}
    left = 2 ** len(names) - len(seen)
    for _ in range(min(random_placements, left)):
        while True:
            pick = frozenset(n for n in names if rng.random() < 0.5)
            if pick not in seen:
                break
        seen.add(pick)
        out.append((f"random#{len(out) - 2 - len(names)}", "random_objects", pick))
    return out


def byte_share(moved: dict[str, float], fast) -> float:
    """s: the share of the bytes one step moves that belong to the objects in `fast`."""
    unknown = set(fast) - set(moved)
    if unknown:
        raise ValueError(f"fast objects {sorted(unknown)} are not objects of the app ({', '.join(moved)})")
    total = sum(moved.values())
    return sum(moved[n] for n in fast) / total


def estimate(moved: dict[str, float], fast, t_fast: float, t_slow: float) -> float:
    """The object-granularity differential estimate s*T_fast + (1-s)*T_slow of one placement."""
    s = byte_share(moved, fast)
    return s * t_fast + (1.0 - s) * t_slow


def describe(fast) -> str:
    return " ".join(sorted(fast)) or "(none)"


def object_layout(sizes: dict[str, int]) -> Layout:
    """The app's objects as one Layout (consecutive synthetic bases, in the app's order)."""
    objs, base = [], 0
    for name, size in sizes.items():
        objs.append(Obj(name, base, int(size)))
        base += -(-int(size) // PAGE) * PAGE
    return Layout(objs)


def object_estimator(layout: Layout, moved: dict[str, float], t_fast: float, t_slow: float):
    """The differential estimator of the CPU path fed with one window and per-page counts that spread
    each object's moved bytes over its pages: on whole-object masks its estimate is `estimate`'s,
    so the agent and greedy of the CPU path run on it unchanged."""
    counts = np.zeros((1, layout.n_pages))
    for k, name in enumerate(layout.names):
        sl = layout.object_pages(name)
        counts[0, sl] = moved[name] / layout.pages_of[k]
    return DifferentialEstimator(counts, np.array([t_fast]), np.array([t_slow]))


def policy_choices(sizes: dict[str, int], moved: dict[str, float], t_fast: float, t_slow: float,
                   ag: dict, seed: int, app: str):
    """[(capacity, policy, fast objects)] of greedy, random and PPO at every capacity of `ag` (the
    block's agent settings), placements of whole objects, chosen on the estimator; and PPO's train s."""
    from hpcdl.studies.hetmem import agent

    layout = object_layout(sizes)
    ranges = layout.ranges(int(layout.pages_of.max()))  # one range per object
    est = object_estimator(layout, moved, t_fast, t_slow)
    chosen, train_s = agent.choose_placements(layout, ranges, est, ag, seed, app)
    out = [(cap, policy, frozenset(r.obj for r, on in zip(ranges, picks, strict=True) if on))
           for cap, choices in chosen for policy, picks in choices.items()]
    return out, train_s


# ------------------------------------------------------------------------------------- the two tiers
class _Mapped:
    """A pinned host tensor exposed to CUDA as a device array (zero-copy)."""

    _TYPESTR = {"torch.float32": "<f4", "torch.float64": "<f8", "torch.int64": "<i8", "torch.int32": "<i4"}

    def __init__(self, host):
        self._host = host  # keeps the pinned buffer alive as long as the view
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape),
            "typestr": self._TYPESTR[str(host.dtype)],
            "data": (host.data_ptr(), False),
            "version": 3,
            "strides": None,
        }


def place(values, fast: bool, dev):
    """`values` (a CPU tensor) in device memory, or in pinned host memory viewed from the GPU."""
    import torch

    if fast:
        return values.to(dev)
    host = values.contiguous().pin_memory()
    view = torch.as_tensor(_Mapped(host), device=dev)
    view._hetmem_host = host  # noqa: SLF001 - the view must not outlive its pinned buffer
    return view


def check_zero_copy(dev) -> bool:
    """The slow tier really is host memory: a GPU write through the view is seen by the host, with
    no copy, and the view's address is the pinned buffer's."""
    import torch

    v = place(torch.zeros(1024), False, dev)
    v.add_(3.0)
    torch.cuda.synchronize(dev)
    host = v._hetmem_host  # noqa: SLF001
    return bool(v.is_cuda and v.data_ptr() == host.data_ptr() and (host == 3.0).all())


# ------------------------------------------------------------------------------------------- apps
# Each app: build(scale) -> (objects {name: CPU tensor}, step(objs) running the kernel once, bytes
# each object moves per step counted from the step's operations: the estimator's access shares).
def _stream(scale):
    import torch

    n = max(1024, int(2**24 * scale))
    objs = {
        "a": torch.zeros(n, dtype=torch.float64),
        "b": torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1)),
        "c": torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(2)),
    }

    def step(o):  # a = b + 3c: one read of b and c, one write of a
        torch.add(o["b"], o["c"], alpha=3.0, out=o["a"])

    return objs, step, {k: 8 * n for k in objs}


def _stencil(scale):
    import torch

    n = max(16, int(192 * scale ** (1 / 3)))
    objs = {"u": torch.rand(n, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(1)),
            "v": torch.zeros(n, n, n, dtype=torch.float64)}

    def sweep(u, v):
        c = slice(1, -1)
        v[c, c, c] = 0.4 * u[c, c, c] + 0.1 * (
            u[:-2, c, c] + u[2:, c, c] + u[c, :-2, c] + u[c, 2:, c] + u[c, c, :-2] + u[c, c, 2:]
        )

    def step(o):  # two sweeps: u -> v -> u, so both grids play both roles
        sweep(o["u"], o["v"])
        sweep(o["v"], o["u"])

    # per sweep the source is read by 7 slices and the target written once: 8 grid passes per grid
    return objs, step, {"u": 8 * n**3 * 8, "v": 8 * n**3 * 8}


def _cg(scale):
    import torch

    m = max(32, int(1024 * scale**0.5))
    n = m * m
    g = torch.arange(n)
    gy, gx = g // m, g % m
    rows, cols = [g], [g]
    for ok, nb in ((gx > 0, g - 1), (gx < m - 1, g + 1), (gy > 0, g - m), (gy < m - 1, g + m)):
        rows.append(g[ok])
        cols.append(nb[ok])
    rows, cols = torch.cat(rows), torch.cat(cols)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))  # irregular gathers, as on the CPU
    rows, cols = perm[rows], perm[cols]
    vals = torch.where(rows == cols, 4.0, -1.0).to(torch.float64)
    order = torch.argsort(rows * n + cols)
    rows, cols, vals = rows[order], cols[order], vals[order]
    rowptr = torch.zeros(n + 1, dtype=torch.int64)
    rowptr[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
    objs = {
        "rowptr": rowptr,
        "colidx": cols.to(torch.int64),
        "values": vals,
        "x": torch.zeros(n, dtype=torch.float64),
        "r": torch.ones(n, dtype=torch.float64),
        "p": torch.ones(n, dtype=torch.float64),
        "q": torch.zeros(n, dtype=torch.float64),
    }

    def step(o):  # one CG iteration on A x = 1 from x = 0
        a = torch.sparse_csr_tensor(o["rowptr"], o["colidx"], o["values"], size=(n, n),
                                    check_invariants=False)
        o["q"].copy_(torch.mv(a, o["p"]))
        rr = torch.dot(o["r"], o["r"])
        alpha = rr / torch.dot(o["p"], o["q"])
        o["x"].add_(alpha * o["p"])
        o["r"].sub_(alpha * o["q"])
        beta = torch.dot(o["r"], o["r"]) / rr
        o["p"].mul_(beta).add_(o["r"])

    nnz = len(cols)
    moved = {
        "rowptr": 8 * n,
        "colidx": 8 * nnz,
        "values": 8 * nnz,
        "p": 8 * nnz + 8 * n * 5,  # gathered once per nonzero, then dot, axpy and the update
        "q": 8 * n * 3,
        "x": 16 * n,
        "r": 8 * n * 6,
    }
    return objs, step, moved


def _gups(scale):
    import torch

    log2 = max(16, int(np.log2(2**26 * scale)))
    n, updates = 2**log2, 2 ** (log2 - 2)
    g = torch.Generator().manual_seed(0)
    objs = {
        "table": torch.arange(n, dtype=torch.int64),
        "ran": torch.randint(0, 2**62, (updates,), generator=g, dtype=torch.int64),
    }

    def step(o):  # table[ran & (n-1)] ^= ran
        idx = o["ran"] & (n - 1)
        o["table"].index_put_((idx,), o["table"][idx] ^ o["ran"])

    return objs, step, {"table": 16 * updates, "ran": 16 * updates}


def _mlp(scale):
    import torch

    b, i, h, k = 256, 1024, max(64, int(4096 * scale**0.5)), 256
    g = torch.Generator().manual_seed(0)
    objs = {
        "inputs": torch.rand(b, i, generator=g),
        "targets": torch.rand(b, k, generator=g),
        "w1": torch.randn(i, h, generator=g) * 0.01,
        "w2": torch.randn(h, k, generator=g) * 0.01,
        "hidden": torch.zeros(b, h),
        "grad_hidden": torch.zeros(b, h),
        "grad_w1": torch.zeros(i, h),
        "grad_w2": torch.zeros(h, k),
        "outputs": torch.zeros(b, k),
    }

    def step(o):  # forward, squared-error gradient, backward, SGD update, all into named objects
        torch.matmul(o["inputs"], o["w1"], out=o["hidden"])
        o["hidden"].clamp_(min=0)
        torch.matmul(o["hidden"], o["w2"], out=o["outputs"])
        o["outputs"].sub_(o["targets"])
        torch.matmul(o["hidden"].T, o["outputs"], out=o["grad_w2"])
        torch.matmul(o["outputs"], o["w2"].T, out=o["grad_hidden"])
        o["grad_hidden"].mul_(o["hidden"] > 0)
        torch.matmul(o["inputs"].T, o["grad_hidden"], out=o["grad_w1"])
        o["w1"].sub_(0.01 * o["grad_w1"])
        o["w2"].sub_(0.01 * o["grad_w2"])

    # operations that read or write each object in one step (each moves the whole object once)
    uses = {"inputs": 2, "targets": 1, "w1": 3, "w2": 4, "hidden": 6, "grad_hidden": 4, "grad_w1": 2,
            "grad_w2": 2, "outputs": 5}
    return objs, step, {name: uses[name] * v.numel() * 4 for name, v in objs.items()}


APPS = {"stream": _stream, "stencil": _stencil, "cg": _cg, "gups": _gups, "mlp": _mlp}


# ---------------------------------------------------------------------------------------- measuring
def _measure(base: dict, step, fast, dev, repeats: int) -> tuple[float, float]:
    """(median seconds of one step, seconds to place the objects) of one placement, placed afresh
    from the same initial values, after one warm-up step (kernel selection, first touch)."""
    import torch

    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    objs = {n: place(v.clone(), n in fast, dev) for n, v in base.items()}
    torch.cuda.synchronize(dev)
    place_s = time.perf_counter() - t0
    step(objs)
    torch.cuda.synchronize(dev)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(objs)
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    del objs
    torch.cuda.empty_cache()
    return float(np.median(times)), place_s


def _time_estimate(moved, fast_sets, t_fast, t_slow, repeat: int = 200) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        for fast in fast_sets:
            estimate(moved, fast, t_fast, t_slow)
    return (time.perf_counter() - t0) / (repeat * len(fast_sets))


def bounds(measured: dict, names) -> tuple[float, float]:
    """(T_fast, T_slow): the measured step times of the all-fast and all-slow placements."""
    return measured[frozenset(names)][0], measured[frozenset()][0]


def validation_rows(app: str, plan, measured: dict, moved: dict, sizes: dict, one_est_s: float) -> list[dict]:
    """One row per validation placement: its estimate beside its measured time (`measured`: fast
    objects -> (median step s, place s)), in the CPU path's columns where they mean the same."""
    t_fast, t_slow = bounds(measured, sizes)
    footprint = sum(sizes.values())
    rows = []
    for label, kind, fast in plan:
        step_s, place_s = measured[fast]
        est = estimate(moved, fast, t_fast, t_slow)
        rows.append({
            "app": app,
            "placement": label,
            "kind": kind,
            "sample_every": SAMPLE_EVERY,
            "fast_fraction": sum(sizes[n] for n in fast) / footprint,
            "reference": HARDWARE,
            "est_runtime_s": est,
            "ref_runtime_s": step_s,
            "error": (est - step_s) / step_s,
            "estimate_s": one_est_s,
            "reference_s": place_s + step_s,  # one hardware run of the placement: place, run once
            "fast_byte_share": byte_share(moved, fast),
            "fast_objects": describe(fast),
            "place_s": place_s,
        })
    return rows


def policy_rows(app: str, choices, measured: dict, moved: dict, sizes: dict, train_s: float) -> list[dict]:
    """One row per (capacity, policy): the chosen objects' estimate and MEASURED time."""
    t_fast, t_slow = bounds(measured, sizes)
    footprint = sum(sizes.values())
    return [{
        "app": app,
        "capacity": cap,
        "policy": policy,
        "fast_fraction": sum(sizes[n] for n in fast) / footprint,
        "placement": describe(fast),
        "reference": HARDWARE,
        "est_runtime_s": estimate(moved, fast, t_fast, t_slow),
        "ref_runtime_s": measured[fast][0],
        "all_fast_runtime_s": t_fast,
        "all_slow_runtime_s": t_slow,
        "train_s": train_s if policy == "ppo" else 0.0,
    } for cap, policy, fast in choices]


def trace_row(app: str, g: dict, sizes: dict, moved: dict, plan, measured: dict, gpu_name: str) -> dict:
    """The app's traces.csv row on the GPU: sizes, the bounds, and the cost of one hardware run."""
    t_fast, t_slow = bounds(measured, sizes)
    runs = [measured[f] for _, _, f in plan]
    return {
        "app": app,
        "scale": g["scale"],
        "repeats": g["repeats"],
        "objects": len(sizes),
        "object_names": " ".join(sizes),
        "footprint_bytes": sum(sizes.values()),
        "moved_bytes_per_step": sum(moved.values()),
        "placements_measured": len(measured),
        "reference": HARDWARE,
        "all_fast_runtime_s": t_fast,
        "all_slow_runtime_s": t_slow,
        # one real run of a placement: place its objects in their tiers and run the step once
        "native_run_s": float(np.median([p + s for s, p in runs])),
        "native_compute_s": float(np.median([s for s, _ in runs])),
        "zero_copy_verified": True,
        "gpu": gpu_name,
    }


def run_app(app: str, block: dict, seed: int) -> dict:
    """One app on the task's GPU: every validation placement and every policy's placement measured,
    each beside its estimate. Returns {"trace", "validation", "policies"} rows as the CPU path does."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"hetmem {app}: the CUDA path needs a GPU and torch sees none")
    dev = torch.device("cuda", torch.cuda.current_device())
    if not check_zero_copy(dev):
        raise RuntimeError("pinned host memory is not visible to the GPU through its host pointer "
                           "(no unified addressing): no slow tier to place objects in")
    g = block["gpu"]
    log = lambda msg: print(f"[hetmem] {app} (cuda): {msg}", file=sys.stderr, flush=True)  # noqa: E731
    base, step, moved = APPS[app](g["scale"])
    sizes = {n: v.numel() * v.element_size() for n, v in base.items()}
    measured: dict[frozenset, tuple[float, float]] = {}

    def measure(fast: frozenset) -> None:
        if fast not in measured:
            measured[fast] = _measure(base, step, fast, dev, g["repeats"])

    rng = np.random.default_rng(derived_seed(seed, app, "val"))
    plan = placements(list(base), g["random_placements"], rng)
    for _, _, fast in plan:
        measure(fast)
    t_fast, t_slow = bounds(measured, sizes)
    log(f"{len(plan)} placements measured; all-fast {t_fast * 1e3:.3f} ms, all-slow {t_slow * 1e3:.3f} ms")
    one_est_s = _time_estimate(moved, [f for _, _, f in plan], t_fast, t_slow)
    validation = validation_rows(app, plan, measured, moved, sizes, one_est_s)

    choices, train_s = policy_choices(sizes, moved, t_fast, t_slow, block["agent"], seed, app)
    log(f"PPO trained {block['agent']['timesteps']} steps in {train_s:.1f} s")
    for _, _, fast in choices:
        measure(fast)
    policies = policy_rows(app, choices, measured, moved, sizes, train_s)
    info = trace_row(app, g, sizes, moved, plan, measured, torch.cuda.get_device_name(dev))
    return {"trace": info, "validation": validation, "policies": policies}
