"""A classification table as a contextual bandit (one arm per class, reward 1 for the right arm, else 0), as
AgileRL turns tabular data into bandits (the table's split and scaling: :class:`agilerl_core.data.tables.BanditSplit`).

:class:`TabularBandit` is a Gymnasium env: each step shows one context (a row's features), takes the pulled arm,
pays its reward and shows the next context, drawn uniformly from its rows by the env's own seeded generator. It
never ends (a bandit has no episodes); the best arm always pays 1, so a pull's regret is 1 - reward.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

BEST_REWARD = 1.0  # what the right arm pays: the regret of a pull is BEST_REWARD - its reward


class TabularBandit(gym.Env):
    """Contexts are rows of `contexts` [N, D] (float32), arm `labels[i]` pays 1 for row i and every other arm 0.
    Each step draws the next row uniformly with the env's generator (seeded by ``reset(seed=...)``)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, contexts: np.ndarray, labels: np.ndarray, arms: int) -> None:
        self.contexts = np.asarray(contexts, dtype=np.float32)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=self.contexts.shape[1:], dtype=np.float32)
        self.action_space = gym.spaces.Discrete(int(arms))
        self._row = 0

    def _draw(self) -> np.ndarray:
        self._row = int(self.np_random.integers(len(self.labels)))
        return self.contexts[self._row]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return self._draw(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == self.labels[self._row])
        return self._draw(), reward, False, False, {}
