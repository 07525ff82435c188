"""Exploration noise processes of one deterministic-policy actor-critic member (DDPG, TD3) acting on its own
(:meth:`ContinuousActorCritic.explore_action`), drawn from its own generator. Training draws the group's noise
at once on the device from keyed streams (:class:`~agilerl_core.algorithms.actor_critic.group.ActorCriticGroup`)."""

from __future__ import annotations

import numpy as np


class GaussianNoise:
    """Independent N(0, scale^2) noise per step."""

    def __init__(self, num_envs: int, dim: int) -> None:
        self.shape = (num_envs, dim)

    def reset(self, done: np.ndarray | None = None) -> None:
        """Memoryless: nothing to reset."""

    def sample(self, rng: np.random.Generator, scale: float, theta: float, dt: float) -> np.ndarray:
        return rng.normal(0.0, scale, self.shape).astype(np.float32)


class OUNoise:
    """Ornstein-Uhlenbeck noise (Uhlenbeck & Ornstein 1930), one process per sub-env, mean 0::

        x <- x - theta * x * dt + scale * sqrt(dt) * N(0, 1)

    reset to 0 for each sub-env whose episode ended (and at every fresh rollout)."""

    def __init__(self, num_envs: int, dim: int) -> None:
        self.x = np.zeros((num_envs, dim), dtype=np.float32)
        self.shape = self.x.shape

    def reset(self, done: np.ndarray | None = None) -> None:
        if done is None:
            self.x[:] = 0.0
        else:
            self.x[np.asarray(done, dtype=bool)] = 0.0

    def sample(self, rng: np.random.Generator, scale: float, theta: float, dt: float) -> np.ndarray:
        self.x += (-theta * self.x * dt + scale * np.sqrt(dt) * rng.standard_normal(self.x.shape)).astype(np.float32)
        return self.x.copy()
