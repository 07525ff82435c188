"""Conservative Q-learning: Kumar, Zhou, Tucker & Levine, "Conservative Q-Learning for Offline
Reinforcement Learning", NeurIPS 2020, in its CQL(H) form.

Learning from a fixed dataset, a Q-function overestimates actions the data never tried, and the greedy
policy goes exactly there. CQL adds to each critic's TD loss a penalty that pushes Q down on all actions
(a soft maximum) and up on the dataset's actions::

    penalty = E_s[ logsumexp_a Q(s, a) ] - E_(s,a)~D[ Q(s, a) ]

* **CQN** (discrete actions): the logsumexp is exact over the action set, on a double DQN.
* **CQL** (continuous actions, on SAC): logsumexp over a continuous action space is estimated by
  importance sampling (the paper's appendix F) with ``cql_n_actions`` actions per state from each of
  the uniform distribution on [-1, 1]^d, the policy at s and the policy at s'::

      logsumexp_a Q(s, a) ~= log( 1/(3n) * sum_i exp(Q(s, a_i) - log mu(a_i)) )
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import torch

from agilerl_core.algorithms.cql_hp import CQLHyperparameters, CQNHyperparameters
from agilerl_core.algorithms.dqn import DQN, DQNGroup
from agilerl_core.algorithms.sac import SAC
from agilerl_core.buffers.replay import Transition
from agilerl_core.envs.spaces import Obs

# the penalty weight is the hyperparameter CQL is most sensitive to: it evolves on a log scale


def discrete_penalty(q: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Per-sample CQL(H) penalty for discrete actions: logsumexp_a Q(s, a) - Q(s, a_data). q: [..., A]."""
    return torch.logsumexp(q, dim=-1) - q.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)


def sampled_logsumexp(q: torch.Tensor, log_density: torch.Tensor) -> torch.Tensor:
    """Importance-sampled logsumexp_a Q(s, a) over a continuous action space: q [B, K] at K sampled
    actions with proposal log densities log_density [B, K] -> log(mean_k exp(q - log_density)) [B]."""
    return torch.logsumexp(q - log_density, dim=1) - math.log(q.shape[1])


class CQNGroup(DQNGroup):
    """CQN members learning together: each member's TD loss carries its own cql_alpha times the penalty."""

    def __init__(self, agents) -> None:
        super().__init__(agents)
        self.cql_alpha = self.hp_tensor("cql_alpha").unsqueeze(1)

    def penalty(self, q: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.cql_alpha * discrete_penalty(q, action)


class CQN(DQN):
    """Conservative Q-network: double DQN whose TD loss carries the CQL(H) penalty (discrete actions)."""

    name: ClassVar[str] = "cqn"
    hp_model = CQNHyperparameters
    group_class = CQNGroup


def _repeat(obs: Obs, n: int) -> Obs:
    return {k: v.repeat_interleave(n, dim=0) for k, v in obs.items()}


class CQL(SAC):
    """CQL on SAC for continuous actions: each twin critic's loss carries the sampled CQL(H) penalty."""

    name: ClassVar[str] = "cql"
    hp_model = CQLHyperparameters

    @torch.no_grad()
    def penalty_actions(self, batch: Transition) -> tuple[Obs, torch.Tensor, torch.Tensor]:
        """(observations repeated n times [B*n], actions [3, B*n, d], their proposal log densities [3, B*n]):
        uniform on [-1, 1]^d, the policy at s, the policy at s' (scored at s, as in the paper's code)."""
        n, d = self.hp.cql_n_actions, self.action_dim
        obs, next_obs = _repeat(batch.obs, n), _repeat(batch.next_obs, n)
        rows = batch.reward.shape[0] * n
        uniform = (torch.rand((rows, d), generator=self.torch_gen) * 2 - 1).to(batch.reward.device)
        pi_a, pi_logp = self.sample_action(obs)
        next_a, next_logp = self.sample_action(next_obs)
        log_u = torch.full((rows,), d * math.log(0.5), device=uniform.device)
        return obs, torch.stack([uniform, pi_a, next_a]), torch.stack([log_u, pi_logp, next_logp])

    def penalty(self, name: str, batch: Transition, sampled: tuple[Obs, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Critic `name`'s CQL(H) penalty on `batch` (differentiable): mean over states of the sampled
        logsumexp minus Q at the dataset's actions."""
        obs, actions, log_density = sampled
        b = batch.reward.shape[0]
        q = torch.cat([self.q(name, obs, a).view(b, -1) for a in actions], dim=1)  # [B, 3n]
        dens = log_density.view(3, b, -1).permute(1, 0, 2).reshape(b, -1)
        return (sampled_logsumexp(q, dens) - self.q(name, batch.obs, batch.action)).mean()

    def critic_penalty(self, batch: Transition) -> Callable[[str], torch.Tensor] | None:
        """cql_alpha * penalty for each critic, on one set of sampled actions per learn step."""
        if self.hp.cql_alpha <= 0:
            return None
        sampled = self.penalty_actions(batch)
        return lambda name: self.hp.cql_alpha * self.penalty(name, batch, sampled)
