"""SAC: Haarnoja et al., "Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905 (2018).

Twin Q(s, a) critics with Polyak-averaged targets, a squashed Gaussian actor (a = tanh(u),
u ~ N(mu(s), sigma(s))), and automatic entropy tuning: the temperature alpha = exp(log_alpha) is
learned so that the policy's entropy tracks ``target_entropy`` (default -dim(A)).

    critic target  y = r + discount * (1 - terminated) * (min_i Q_i'(s', a') - alpha * log pi(a'|s'))
    actor loss       = E[alpha * log pi(a|s) - min_i Q_i(s, a)],     a ~ pi(.|s) (reparameterised)
    alpha loss       = -E[log_alpha * (log pi(a|s) + target_entropy)]
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch

from agilerl_core.algorithms.actor_critic import ContinuousActorCritic
from agilerl_core.algorithms.optim import adam_update_
from agilerl_core.algorithms.sac_group import LOG_STD_MAX, LOG_STD_MIN, SACGroup, squashed_log_prob
from agilerl_core.algorithms.sac_hp import SACHyperparameters
from agilerl_core.buffers.replay import Transition, n_step_return
from agilerl_core.envs.spaces import Obs


def alpha_loss(log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """Temperature loss: its gradient raises alpha when the entropy (-log_prob) is below the target."""
    return -(log_alpha * (log_prob.detach() + target_entropy)).mean()


class SAC(ContinuousActorCritic):
    """Soft actor-critic with twin critics and a learned temperature."""

    name: ClassVar[str] = "sac"
    hp_model = SACHyperparameters
    online_networks = ("actor", "critic_1", "critic_2")
    target_networks: ClassVar[dict[str, str]] = {"critic_1_target": "critic_1", "critic_2_target": "critic_2"}
    delayed_targets: ClassVar[bool] = False  # the critics' targets move after every critic step

    def __init__(self, obs_spec, action, arch, hp, seed, device="cpu") -> None:
        super().__init__(obs_spec, action, arch, hp, seed, device)
        # the temperature and its Adam moments (one scalar: plain tensors, saved as extra state)
        self.log_alpha = torch.tensor(math.log(self.hp.init_alpha), device=self.device)
        self.alpha_adam = torch.zeros(3, device=self.device)  # m, v, step

    def actor_outputs(self) -> int:
        return 2 * self.action_dim  # mean and log std

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.exp())

    @property
    def target_entropy(self) -> float:
        t = self.hp.target_entropy
        return -float(self.action_dim) if t is None else float(t)

    # ---- the policy -----------------------------------------------------------------------------------
    def distribution(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.networks["actor"](obs)
        mean, log_std = out[:, : self.action_dim], out[:, self.action_dim:]
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample_action(self, obs: Obs, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, log pi(a|s)) with a = tanh(mean + std * noise), reparameterised (noise: standard normal)."""
        mean, log_std = self.distribution(obs)
        if noise is None:
            noise = torch.randn(mean.shape, generator=self.torch_gen).to(mean.device)
        u = mean + log_std.exp() * noise
        return torch.tanh(u), squashed_log_prob(u, mean, log_std)

    @torch.no_grad()
    def greedy_action(self, obs: Obs, action_mask: np.ndarray | None = None) -> np.ndarray:
        return torch.tanh(self.distribution(obs)[0]).cpu().numpy()

    @torch.no_grad()
    def explore_action(self, obs: Obs, action_mask: np.ndarray | None = None) -> np.ndarray:
        if self.in_warmup():
            return self.random_actions(next(iter(obs.values())).shape[0])
        return self.sample_action(obs)[0].cpu().numpy()

    # ---- loss maths -----------------------------------------------------------------------------------
    @torch.no_grad()
    def target(self, batch: Transition, noise: torch.Tensor | None = None) -> torch.Tensor:
        next_a, next_logp = self.sample_action(batch.next_obs, noise)
        q_next = torch.min(self.q("critic_1_target", batch.next_obs, next_a),
                           self.q("critic_2_target", batch.next_obs, next_a))
        soft = q_next - self.alpha * next_logp
        reward, discount = n_step_return(batch, self.hp.gamma)
        return reward + discount * (1.0 - batch.terminated) * soft

    def actor_loss(self, batch: Transition, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(E[alpha log pi - min Q], log pi of the sampled actions)."""
        a, logp = self.sample_action(batch.obs, noise)
        q = torch.min(self.q("critic_1", batch.obs, a), self.q("critic_2", batch.obs, a))
        return (self.alpha * logp - q).mean(), logp

    def update_alpha(self, log_prob: torch.Tensor) -> float:
        """One Adam step (lr_alpha, betas 0.9/0.999) on log_alpha; returns the loss."""
        log_alpha = self.log_alpha.clone().requires_grad_(True)
        loss = alpha_loss(log_alpha, log_prob, self.target_entropy)
        (grad,) = torch.autograd.grad(loss, log_alpha)
        adam_update_(self.log_alpha, grad, self.alpha_adam, self.hp.lr_alpha)
        return float(loss.detach())

    def actor_objective(self, batch: Transition) -> torch.Tensor:
        loss, logp = self.actor_loss(batch)
        if self.hp.auto_entropy:  # alpha only enters the actor loss as a number already read
            self.update_alpha(logp)
        return loss

    # ---- population-batched learning ------------------------------------------------------------------
    def batch_key(self) -> tuple | None:
        if type(self).critic_penalty is not ContinuousActorCritic.critic_penalty:
            return None  # a penalised critic (CQL) has no batched path
        if self.obs_norm is not None or not all(self.networks[n].plain_mlp for n in self.online_networks):
            return None
        return self._group_key(self.hp.max_grad_norm)

    def batch_refusal(self) -> str:
        return (f"{self.name}: only plain-MLP SAC batches (no critic penalty as in CQL, no obs normalisation, "
                f"no encoders)")

    @staticmethod
    def group(agents: list[SAC]):
        return SACGroup(agents)

    # ---- state ----------------------------------------------------------------------------------------
    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return {"log_alpha": self.log_alpha, "alpha_adam": self.alpha_adam}

    def load_extra_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if "log_alpha" in tensors:
            self.log_alpha = tensors["log_alpha"].to(self.device).clone()
            self.alpha_adam = tensors["alpha_adam"].to(self.device).clone()
