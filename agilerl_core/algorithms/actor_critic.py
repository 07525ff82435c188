"""What the continuous-action off-policy algorithms (DDPG, TD3, SAC) share: Q(s, a) critics trained
towards a bootstrapped target, exploration noise processes, and random warm-up actions.

Actions are in the agent's scale, [-1, 1]^dim; :class:`agilerl_core.envs.spaces.ActionSpec` maps them
to the env's bounds.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.buffers.replay import Transition


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

    def reset(self, done: np.ndarray | None = None) -> None:
        if done is None:
            self.x[:] = 0.0
        else:
            self.x[np.asarray(done, dtype=bool)] = 0.0

    def sample(self, rng: np.random.Generator, scale: float, theta: float, dt: float) -> np.ndarray:
        self.x += (-theta * self.x * dt + scale * np.sqrt(dt) * rng.standard_normal(self.x.shape)).astype(np.float32)
        return self.x.copy()


class ContinuousActorCritic(RLAlgorithm):
    """Base of DDPG/TD3 and SAC: an actor, one or two Q(s, a) critics, their targets."""

    action_kinds: ClassVar[tuple[str, ...]] = ("box",)
    optimizer_lrs: ClassVar[dict[str, str]] = {"actor": "lr_actor", "critic_1": "lr_critic", "critic_2": "lr_critic"}
    noise_networks: ClassVar[tuple[str, ...]] = ("actor",)
    delayed_targets: ClassVar[bool] = True  # targets move only with the actor (TD3); False: every step

    @abstractmethod
    def actor_objective(self, batch: Transition) -> torch.Tensor:
        """The actor's loss on `batch` (differentiable), with any side step that goes with it."""

    def learn(self, batch: Transition) -> torch.Tensor:
        """One step of every critic; every `policy_freq`-th call also an actor step; soft target updates
        with the actor (delayed_targets) or after every critic step. Returns the summed critic loss."""
        loss = self.update_critics(batch, self.target(batch))
        self.learn_steps += 1
        actor_turn = self.learn_steps % self.hp.policy_freq == 0
        if actor_turn:
            self.optimizers["actor"].zero_grad()
            self.actor_objective(batch).backward()
            self._step("actor")
        if actor_turn or not self.delayed_targets:
            self.update_targets(self.hp.tau)
        return loss

    def network_io(self, name: str) -> tuple[int, int]:
        if name.startswith("critic"):
            return self.action_dim, 1
        return 0, self.actor_outputs()

    def actor_outputs(self) -> int:
        return self.action_dim

    @property
    def critics(self) -> list[str]:
        return [n for n in self.online_networks if n.startswith("critic")]

    def q(self, name: str, obs, action: torch.Tensor) -> torch.Tensor:
        return self.networks[name](obs, action).squeeze(1)

    def random_actions(self, n: int) -> np.ndarray:
        return self.np_rng.uniform(-1.0, 1.0, (n, self.action_dim)).astype(np.float32)

    def in_warmup(self) -> bool:
        return self.env_steps < getattr(self.hp, "random_steps", 0)

    def critic_penalty(self, batch: Transition) -> Callable[[str], torch.Tensor] | None:
        """A term added to each critic's loss on `batch` (critic name -> differentiable scalar), built
        once per learn step; None (the default): plain TD regression."""
        return None

    def update_critics(self, batch: Transition, target: torch.Tensor) -> torch.Tensor:
        """One Adam step of every critic towards `target` (MSE, plus any critic_penalty); returns the
        summed loss."""
        penalty = self.critic_penalty(batch)
        total = torch.zeros(())
        for name in self.critics:
            opt = self.optimizers[name]
            opt.zero_grad()
            loss = F.mse_loss(self.q(name, batch.obs, batch.action), target)
            if penalty is not None:
                loss = loss + penalty(name)
            loss.backward()
            self._step(name)
            total = total + loss.detach()
        return total

    def _step(self, name: str) -> None:
        opt = self.optimizers[name]
        if self.hp.max_grad_norm is not None:
            opt.clip_grad_norm(self.hp.max_grad_norm)
        opt.step()
