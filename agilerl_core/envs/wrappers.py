"""Gymnasium wrappers of our own, for spaces the algorithms do not take as they are (named in a config's
``env_wrappers`` like any other wrapper)."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np


class MultiDiscreteAsDiscrete(gym.ActionWrapper):
    """A MultiDiscrete action space as one Discrete space of every combination (``prod(nvec)`` actions), so the
    DQN family and PPO act in it. Action ``a`` is the combination at flat index ``a`` (row-major, the last branch
    varying fastest). Refused beyond `max_actions` combinations (a Q-head of that many outputs)."""

    def __init__(self, env: gym.Env, max_actions: int = 4096) -> None:
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, gym.spaces.MultiDiscrete) or space.nvec.ndim != 1:
            raise ValueError(f"MultiDiscreteAsDiscrete wraps a flat MultiDiscrete action space, not {space}")
        self.nvec = space.nvec.astype(np.int64)
        self.start = np.asarray(space.start, dtype=np.int64)
        count = math.prod(int(n) for n in self.nvec)
        if count > max_actions:
            raise ValueError(f"{space} has {count} combinations, more than max_actions={max_actions}")
        self.action_space = gym.spaces.Discrete(count)

    def action(self, action) -> np.ndarray:
        return np.asarray(np.unravel_index(int(action), tuple(self.nvec)), dtype=np.int64) + self.start


class KeepObservation(gym.ObservationWrapper):
    """Only some entries of a flat Box observation: a partially observed env made from a fully observed one
    (e.g. CartPole with its two velocities hidden, ``indices: [0, 2]``, which a recurrent policy can learn and a
    feed-forward one cannot: it must infer the velocities from what it saw)."""

    def __init__(self, env: gym.Env, indices: list[int]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"KeepObservation keeps entries of a flat Box observation, not {space}")
        self.indices = np.asarray(indices, dtype=np.int64)
        if self.indices.size == 0 or self.indices.min() < -space.shape[0] or self.indices.max() >= space.shape[0]:
            raise ValueError(f"indices {list(indices)} must be a non-empty list of entries of a {space.shape[0]}-wide "
                             f"observation")
        self.observation_space = gym.spaces.Box(space.low[self.indices], space.high[self.indices],
                                                dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation)[self.indices]
