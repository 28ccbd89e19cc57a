"""Placement policies on top of the estimator: a gymnasium environment, greedy and random baselines,
and a stable-baselines3 PPO agent.

Environment (`PlacementEnv`): the application's pages cut into ranges (layout.ranges).
  observation  per range: its sampled access density (events per page) in each of `bins` phases
               of the run (windows grouped in order), whether it is in fast memory; plus the free
               fast capacity and the episode's capacity, as fractions of the footprint
  action       Discrete(R + 1): move range i to the other tier, or R = stop
  reward       -(estimated runtime after - before) / (all-slow - all-fast runtime)
               - migration_cost * moved bytes / footprint (so a whole episode's runtime reward
               is at most 1 whatever the application's scale); a move that would exceed the
               capacity is refused and costs `invalid_penalty`
Each episode draws its capacity from the configured ones, so one trained agent serves them all.
The agent's placement at a capacity is the best (estimated) placement visited in its
deterministic rollout and a few sampled ones (`rollout`): a briefly trained policy's argmax alone
is often the stop action.
"""

from __future__ import annotations

import time
import zlib

import numpy as np

from hpcdl.studies.hetmem.estimator import DifferentialEstimator
from hpcdl.studies.hetmem.layout import Layout, Range


def range_features(est: DifferentialEstimator, ranges: list[Range], bins: int) -> np.ndarray:
    """(R, bins) sampled events per page of each range in each phase, scaled to max 1."""
    n_win = est.counts.shape[0]
    edges = np.linspace(0, n_win, bins + 1).astype(int)
    per_bin = np.stack(
        [
            est.counts[a:b].sum(axis=0) if b > a else np.zeros(est.counts.shape[1])
            for a, b in zip(edges[:-1], edges[1:], strict=True)
        ],
        axis=0,
    )  # (bins, P)
    feats = np.stack([per_bin[:, r.start : r.start + r.pages].sum(axis=1) / r.pages for r in ranges])
    top = feats.max()
    return feats / top if top > 0 else feats


def density(est: DifferentialEstimator, ranges: list[Range]) -> np.ndarray:
    """Sampled events per byte of each range over the whole run (the greedy order)."""
    total = est.counts.sum(axis=0)
    return np.array([total[r.start : r.start + r.pages].sum() / r.pages for r in ranges])


def greedy(
    layout: Layout, ranges: list[Range], est: DifferentialEstimator, capacity_pages: int
) -> np.ndarray:
    """Densest ranges first, each one that still fits."""
    chosen = np.zeros(len(ranges), dtype=bool)
    free = capacity_pages
    for i in np.argsort(-density(est, ranges), kind="stable"):
        if ranges[i].pages <= free:
            chosen[i], free = True, free - ranges[i].pages
    return chosen


def random_policy(ranges: list[Range], capacity_pages: int, rng: np.random.Generator) -> np.ndarray:
    """Ranges in random order, each one that still fits."""
    chosen = np.zeros(len(ranges), dtype=bool)
    free = capacity_pages
    for i in rng.permutation(len(ranges)):
        if ranges[i].pages <= free:
            chosen[i], free = True, free - ranges[i].pages
    return chosen


def _env_class():
    import gymnasium as gym
    from gymnasium import spaces

    class PlacementEnv(gym.Env):
        metadata = {"render_modes": []}

        def __init__(
            self,
            layout: Layout,
            ranges: list[Range],
            est: DifferentialEstimator,
            capacities: list[float],
            bins: int,
            migration_cost: float,
            invalid_penalty: float,
            max_steps: int,
        ):
            self.layout, self.ranges, self.est = layout, ranges, est
            self.capacities = list(capacities)
            self.pages = np.array([r.pages for r in ranges])
            self.features = range_features(est, ranges, bins)
            self.migration_cost, self.invalid_penalty = migration_cost, invalid_penalty
            self.max_steps = max_steps
            self.span = max(float(est.t_slow.sum() - est.t_fast.sum()), 1e-30)
            r = len(ranges)
            self.observation_space = spaces.Box(0.0, 1.0, shape=(r * (bins + 1) + 2,), dtype=np.float32)
            self.action_space = spaces.Discrete(r + 1)
            self.capacity = self.capacities[-1]
            self.fixed_capacity: float | None = None

        def _runtime(self) -> float:
            return self.est.estimate_one(self.layout.ranges_mask(self.ranges, self.chosen))

        def _obs(self) -> np.ndarray:
            used = self.pages[self.chosen].sum() / self.layout.n_pages
            return np.concatenate(
                [
                    self.features.ravel(),
                    self.chosen.astype(float),
                    [max(0.0, self.capacity - used), self.capacity],
                ]
            ).astype(np.float32)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.capacity = (
                self.fixed_capacity
                if self.fixed_capacity is not None
                else float(self.np_random.choice(self.capacities))
            )
            self.cap_pages = int(self.capacity * self.layout.n_pages)
            self.chosen = np.zeros(len(self.ranges), dtype=bool)
            self.runtime = self._runtime()
            self.steps = 0
            return self._obs(), {}

        def step(self, action):
            self.steps += 1
            action = int(action)
            truncated = self.steps >= self.max_steps
            if action == len(self.ranges):
                return self._obs(), 0.0, True, truncated, {}
            after = self.chosen.copy()
            after[action] = not after[action]
            if self.pages[after].sum() > self.cap_pages:
                return self._obs(), -self.invalid_penalty, False, truncated, {}
            self.chosen = after
            new = self._runtime()
            moved = self.pages[action] / self.layout.n_pages
            reward = -(new - self.runtime) / self.span - self.migration_cost * moved
            self.runtime = new
            return self._obs(), float(reward), False, truncated, {}

    return PlacementEnv


def make_env(*args, **kwargs):
    return _env_class()(*args, **kwargs)


def train_ppo(env, timesteps: int, seed: int):
    """PPO (stable-baselines3) on the placement env; small rollouts so seconds of training learn."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger

    torch.set_num_threads(1)  # the same arithmetic under every task backend
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=128,
        batch_size=64,
        n_epochs=4,
        learning_rate=1e-3,
        gamma=0.99,
        seed=seed,
        device="cpu",
        verbose=0,
        policy_kwargs={"net_arch": [64, 64]},
    )
    # a logger with no outputs: SB3's default makes an empty SB3-<date> folder in /tmp every time
    model.set_logger(Logger(folder=None, output_formats=[]))
    model.learn(total_timesteps=timesteps)
    return model


def rollout(model, env, capacity: float, episodes: int, seed: int) -> np.ndarray:
    """The trained agent's placement at one capacity: the placement with the lowest estimated runtime
    visited in one deterministic and `episodes` sampled rollouts of the policy (each visited
    placement is one cheap estimate, so searching the policy's neighbourhood costs milliseconds)."""
    env.fixed_capacity = capacity
    best, best_rt = None, np.inf
    for k in range(episodes + 1):
        obs, _ = env.reset(seed=seed + k)
        if env.runtime < best_rt:
            best, best_rt = env.chosen.copy(), env.runtime
        done = False
        while not done:
            action, _ = model.predict(obs, deterministic=(k == 0))
            obs, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            if env.runtime < best_rt:
                best, best_rt = env.chosen.copy(), env.runtime
    env.fixed_capacity = None
    return best


def derived_seed(base: int, *parts) -> int:
    """A seed of its own for each named random part of a run (an app's PPO, its random policy, ...)."""
    return (base * 1_000_003 + zlib.crc32("/".join(map(str, parts)).encode())) % 2**32


def choose_placements(layout: Layout, ranges: list[Range], est: DifferentialEstimator, ag: dict,
                      seed: int, app: str) -> tuple[list[tuple[float, dict[str, np.ndarray]]], float]:
    """Greedy, random and PPO (trained once, on the estimator) at every capacity of `ag` (the block's
    agent settings): ([(capacity, {policy: ranges chosen for fast memory})], PPO's training seconds)."""
    env = make_env(layout, ranges, est, ag["capacities"], ag["bins"], ag["migration_cost"],
                   ag["invalid_penalty"], ag["max_steps"])
    t0 = time.perf_counter()
    model = train_ppo(env, ag["timesteps"], derived_seed(seed, app, "ppo"))
    train_s = time.perf_counter() - t0
    rng = np.random.default_rng(derived_seed(seed, app, "random-policy"))
    out = []
    for cap in ag["capacities"]:
        cap_pages = int(cap * layout.n_pages)
        out.append((cap, {
            "greedy": greedy(layout, ranges, est, cap_pages),
            "random": random_policy(ranges, cap_pages, rng),
            "ppo": rollout(model, env, cap, ag["rollouts"], derived_seed(seed, app, "rollout")),
        }))
    return out, train_s
