"""Evolve a DQN population on your own Gymnasium env class, then act with the elite.

    python examples/own_env.py --steps 30000
    python examples/load_champion.py runs/corridor-latest/elite --env examples.own_env:Corridor   # act again later

The env is a class in this file: `evolve(..., env=Corridor)` builds every copy from it in this process (no
registration, no module path). From the repository root, other code imports it as
``from examples.own_env import Corridor``. Prints one JSON line: the elite's fitness, the best fitness of each
generation, the return the elite gets in a fresh episode and where it was saved (``runs/corridor-s0-...``, a
directory per run; ``runs/corridor-latest`` points at the newest).
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np

import agilerl_core as ac


class Corridor(gym.Env):
    """A corridor of `size` cells: start at the left end, reach the right end (reward 1, minus 0.01 a step)."""

    def __init__(self, size: int = 6) -> None:
        self.size = size
        self.observation_space = gym.spaces.Box(0.0, 1.0, (size,), np.float32)
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.size, np.float32)
        obs[self.pos] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.pos, self.t = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.pos = int(np.clip(self.pos + (1 if int(action) == 1 else -1), 0, self.size - 1))
        self.t += 1
        done = self.pos == self.size - 1
        return self._obs(), 1.0 if done else -0.01, done, self.t >= 50, {}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30_000, help="env steps for the whole population")
    args = p.parse_args()

    result = ac.evolve({"name": "corridor", "algorithm": "dqn", "population_size": 4, "num_envs": 4,
                        "evo_steps": 1000, "max_env_steps": args.steps, "eval_episodes": 3,
                        "hyperparameters": {"learning_delay": 200, "eps_decay_steps": 2000},
                        "output_dir": "runs"},
                       env=Corridor, progress=False)

    env = Corridor()
    obs, _ = env.reset(seed=123)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(result.elite.predict(obs))
        total += reward
        done = terminated or truncated
    print(json.dumps({"elite_fitness": result.run.elite_fitness, "episode_return": round(total, 3),
                      "best_by_generation": [gen.best_fitness for gen in result.history],
                      "elite": str(result.run_dir / "elite"), "generations": len(result.history)}))


if __name__ == "__main__":
    main()
