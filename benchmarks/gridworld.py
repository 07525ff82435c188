"""Small image environments for benchmarks (imported by env id ``gridworld:Gridworld16-v0``, with this folder
on the path): an agent in a 16x16 grid walks to a goal, seen as a 16x16x3 uint8 frame (agent, goal, walls);
and a MinAtar-sized 10x10x4 variant. Reward 1 at the goal, -0.01 a step; 64 steps at most. ``CodeRoom-v0``
(:class:`CodeRoom`): a 5x5 room seen as a 7x7x3 grid of small integer codes in a ``Box(0, 255, uint8)``, the
layout MiniGrid's ImgObsWrapper gives."""

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


FLOOR, WALL, AGENT, GOAL = 0, 1, 2, 3  # CodeRoom's object codes (channel 0)
COLOURS = {FLOOR: 0, WALL: 5, AGENT: 0, GOAL: 1}  # channel 1, MiniGrid's colour indices (red 0, green 1, grey 5)


class CodeRoom(gym.Env):
    """A 5x5 free room inside walls, seen whole as a 7x7x3 uint8 grid of codes in a ``Box(0, 255)``: per cell
    (object, colour, state) as MiniGrid's image observations hold them (ImgObsWrapper): object 0 floor, 1 wall,
    2 agent, 3 goal; colour 0-5 (floor and agent 0, goal 1, wall 5); state 0. The declared bounds (0-255) are
    far wider than the values (0-5): dividing by 255 leaves every input below 0.02.

    Actions: 0 up, 1 down, 2 left, 3 right (a move into a wall stays put). The goal is fixed in the bottom-right
    corner of the room; the agent starts on one of the other 24 free cells, uniformly. Reaching the goal after t
    steps ends the episode with reward ``1 - 0.9 * t / 30`` (MiniGrid's reward with max_steps 30); any other step
    gives 0, and an episode is cut after 30 steps (registered with max_episode_steps=30).

    Optimum for this start distribution: a shortest path takes the Manhattan distance d to the goal, whose mean
    over the 24 starts is 100 / 24 = 4.17 steps, so the best expected return is 1 - 0.03 * 4.17 = 0.875 (0.97
    from a cell next to the goal, 0.76 from the opposite corner). A uniformly random policy scores ~0.19.

    From deployments/configs/cartpole_ppo.yaml with only env_id changed (population 4, 100k global steps, seeds
    0-4): best 0.36-0.46 when the codes were divided by 255 (elites ignored the grid); 0.85-0.90 at the first
    generation (8k steps) with the codes scaled by the tops a probe of the env shows (envs/spaces.observed_highs)."""

    size = 7
    max_steps = 30

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0, 255, (self.size, self.size, 3), np.uint8)
        self.action_space = spaces.Discrete(4)
        self.goal = np.array([self.size - 2, self.size - 2])
        base = np.zeros((self.size, self.size, 3), np.uint8)
        base[[0, -1], :, 0] = WALL
        base[:, [0, -1], 0] = WALL
        for code, colour in COLOURS.items():
            base[base[..., 0] == code, 1] = colour
        base[self.goal[0], self.goal[1], :2] = (GOAL, COLOURS[GOAL])
        self.base = base
        self.starts = [np.array([r, c]) for r in range(1, self.size - 1) for c in range(1, self.size - 1)
                       if (r, c) != tuple(self.goal)]

    def _obs(self) -> np.ndarray:
        frame = self.base.copy()
        frame[self.pos[0], self.pos[1], :2] = (AGENT, COLOURS[AGENT])
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.starts[int(self.np_random.integers(len(self.starts)))].copy()
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        nxt = self.pos + MOVES[int(action)]
        if self.base[nxt[0], nxt[1], 0] != WALL:
            self.pos = nxt
        self.t += 1
        done = bool((self.pos == self.goal).all())
        reward = 1.0 - 0.9 * self.t / self.max_steps if done else 0.0
        return self._obs(), reward, done, False, {}


if "CodeRoom-v0" not in gym.registry:
    gym.register("CodeRoom-v0", entry_point=CodeRoom, max_episode_steps=CodeRoom.max_steps)

for _id, _kw in (("Gridworld16-v0", {"size": 16, "channels": 3}), ("Gridworld10x4-v0", {"size": 10, "channels": 4})):
    if _id not in gym.registry:
        gym.register(_id, entry_point=Gridworld, kwargs=_kw, max_episode_steps=64)
