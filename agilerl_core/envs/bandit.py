"""A classification table as a contextual bandit (one arm per class, reward 1 for the right arm, else 0), as
AgileRL turns tabular data into bandits, and the split and scaling every member of a run shares.

:class:`TabularBandit` is a Gymnasium env: each step shows one context (a row's features), takes the pulled arm,
pays its reward and shows the next context, drawn uniformly from its rows by the env's own seeded generator. It
never ends (a bandit has no episodes); the best arm always pays 1, so a pull's regret is 1 - reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from agilerl_core.data.tables import Table
from agilerl_core.errors import DatasetError

BEST_REWARD = 1.0  # what the right arm pays: the regret of a pull is BEST_REWARD - its reward


@dataclass(frozen=True)
class BanditSplit:
    """A table split into training and held-out rows (a seeded permutation), features standardised with the
    training rows' mean and std (`scale`: what a deployed policy applies to raw features too)."""

    train_x: np.ndarray
    train_y: np.ndarray
    held_x: np.ndarray
    held_y: np.ndarray
    arms: int
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def of(cls, table: Table, held_out: float, seed: int, standardize: bool = True) -> BanditSplit:
        n = len(table.labels)
        held = round(n * held_out)
        if held < 1 or held >= n:
            raise DatasetError(f"data.held_out: {held_out} of {n} rows leaves {held} held-out and {n - held} training "
                               f"rows; both need at least one")
        order = np.random.default_rng(seed).permutation(n)
        train, out = order[held:], order[:held]
        x = table.features
        mean = x[train].mean(0) if standardize else np.zeros(x.shape[1], np.float32)
        std = x[train].std(0) if standardize else np.ones(x.shape[1], np.float32)
        std = np.where(std > 1e-8, std, 1.0).astype(np.float32)  # a constant column stays 0

        def scaled(rows: np.ndarray) -> np.ndarray:
            return ((x[rows] - mean) / std).astype(np.float32)

        return cls(scaled(train), table.labels[train], scaled(out), table.labels[out], table.arms,
                   mean.astype(np.float32), std)

    def describe(self) -> dict[str, Any]:
        """The split's sizes and scaling as checkpoint JSON (data: what predict's inputs must be scaled by)."""
        return {"arms": self.arms, "train_rows": len(self.train_y), "held_out_rows": len(self.held_y),
                "feature_mean": [float(v) for v in self.mean], "feature_std": [float(v) for v in self.std]}


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
