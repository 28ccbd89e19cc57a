"""The CUDA path's placements of whole objects (hpcdl.studies.hetmem.gpu), pure: which placements
are measured, the share of a step's bytes in fast memory, the object-granularity differential
estimate, and the placements the CPU path's policies choose on it. Runs and is tested without a GPU.
"""

from __future__ import annotations

import numpy as np

from hpcdl.studies.hetmem.estimator import DifferentialEstimator
from hpcdl.studies.hetmem.layout import PAGE, Layout
from hpcdl.studies.hetmem.trace import Obj


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
