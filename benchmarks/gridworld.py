"""Small image environments for benchmarks (imported by env id ``gridworld:Gridworld16-v0``, with this folder
on the path): an agent in a 16x16 grid walks to a goal, seen as a 16x16x3 uint8 frame (agent, goal, walls);
and a MinAtar-sized 10x10x4 variant. Reward 1 at the goal, -0.01 a step; 64 steps at most."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])


class Gridworld(gym.Env):
    def __init__(self, size: int = 16, channels: int = 3) -> None:
        self.size, self.channels = size, channels
        self.observation_space = spaces.Box(0, 255, (size, size, channels), np.uint8)
        self.action_space = spaces.Discrete(4)
        self.walls = np.zeros((size, size), bool)
        self.walls[size // 2, 1: size - 1] = True
        self.walls[size // 2, size // 3] = False

    def _obs(self) -> np.ndarray:
        frame = np.zeros((self.size, self.size, self.channels), np.uint8)
        frame[self.pos[0], self.pos[1], 0] = 255
        frame[self.goal[0], self.goal[1], 1] = 255
        frame[..., 2] = self.walls * 255
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        free = np.argwhere(~self.walls)
        self.pos = free[self.np_random.integers(len(free))]
        self.goal = free[self.np_random.integers(len(free))]
        return self._obs(), {}

    def step(self, action):
        nxt = np.clip(self.pos + MOVES[int(action)], 0, self.size - 1)
        if not self.walls[nxt[0], nxt[1]]:
            self.pos = nxt
        done = bool((self.pos == self.goal).all())
        return self._obs(), 1.0 if done else -0.01, done, False, {}


for _id, _kw in (("Gridworld16-v0", {"size": 16, "channels": 3}), ("Gridworld10x4-v0", {"size": 10, "channels": 4})):
    if _id not in gym.registry:
        gym.register(_id, entry_point=Gridworld, kwargs=_kw, max_episode_steps=64)
