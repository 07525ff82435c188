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
from typing import ClassVar

import torch

from agilerl_core.algorithms.actor_critic import SAC, SACGroup
from agilerl_core.algorithms.dqn import DQN, DQNGroup
from agilerl_core.algorithms.group import StackedRows
from agilerl_core.algorithms.hyperparameters.cql import CQLHyperparameters, CQNHyperparameters
from agilerl_core.buffers.replay import Transition
from agilerl_core.envs.spaces import Obs

# the penalty weight is the hyperparameter CQL is most sensitive to: it evolves on a log scale


def discrete_penalty(q: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Per-sample CQL(H) penalty for discrete actions: logsumexp_a Q(s, a) - Q(s, a_data). q: [..., A]."""
    return torch.logsumexp(q, dim=-1) - q.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)


def sampled_logsumexp(q: torch.Tensor, log_density: torch.Tensor) -> torch.Tensor:
    """Importance-sampled logsumexp_a Q(s, a) over a continuous action space: q [..., N] at N sampled
    actions with proposal log densities log_density [..., N] -> log(mean_n exp(q - log_density)) [...]."""
    return torch.logsumexp(q - log_density, dim=-1) - math.log(q.shape[-1])


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


class CQLGroup(SACGroup):
    """CQL members learning together: each twin critic's loss carries the member's cql_alpha times the
    sampled CQL(H) penalty; members whose cql_alpha is 0 draw nothing for it (as alone)."""

    def __init__(self, agents) -> None:
        super().__init__(agents)
        self.cql_alpha = self.hp_tensor("cql_alpha")
        self.n_actions = self.agents[0].hp.cql_n_actions

    @torch.no_grad()
    def penalty_actions(self, batch: Transition, rows: StackedRows, who: list[bool]) -> tuple[Obs, list, torch.Tensor]:
        """(observations, each repeated n times [K * B * n], the actions [K, B * n, d] from each proposal, their
        log densities as [K, B, 3n]): uniform on [-1, 1]^d, the policy at s, the policy at s' (scored at s, as
        in the paper's code). Each member in `who` draws from its own generator in the order it would alone."""
        k, b, n, d = rows.k, rows.b, self.n_actions, self.dim
        draws = torch.zeros(3, k, b * n, d, device=self.device)
        for i, a in enumerate(self.agents):
            if who[i]:
                m = rows.counts[i] * n
                draws[0, i, :m] = (torch.rand((m, d), generator=a.torch_gen) * 2 - 1).to(self.device)
                draws[1, i, :m] = torch.randn((m, d), generator=a.torch_gen).to(self.device)
                draws[2, i, :m] = torch.randn((m, d), generator=a.torch_gen).to(self.device)
        obs = _repeat(batch.obs, n)
        pi_a, pi_logp = self.sample_action(obs, draws[1])
        next_a, next_logp = self.sample_action(_repeat(batch.next_obs, n), draws[2])
        log_u = torch.full((k, b * n), d * math.log(0.5), device=self.device)
        dens = torch.stack([log_u, pi_logp, next_logp]).view(3, k, b, n).permute(1, 2, 0, 3).reshape(k, b, 3 * n)
        return obs, [draws[0], pi_a, next_a], dens

    def penalty(self, name: str, batch: Transition, rows: StackedRows, sampled: tuple[Obs, list, torch.Tensor]
                ) -> torch.Tensor:
        """Critic `name`'s CQL(H) penalty for each member [K] (differentiable): the mean over its states of the
        sampled logsumexp minus Q at the dataset's actions."""
        k, b = rows.k, rows.b
        obs, actions, dens = sampled
        q = torch.cat([self.q(name, obs, a).view(k, b, -1) for a in actions], dim=2)  # [K, B, 3n]
        per_state = sampled_logsumexp(q, dens) - self.q(name, batch.obs, batch.action.view(k, b, self.dim))
        return (per_state * (rows.weight > 0)).sum(1) / torch.tensor(rows.counts, device=self.device).clamp(min=1)

    def critic_penalty(self, batch: Transition, rows: StackedRows):
        """Each critic's cql_alpha * penalty [K], on one set of sampled actions per learn step."""
        who = [on and a.hp.cql_alpha > 0 for a, on in zip(self.agents, rows.active.tolist(), strict=True)]
        if not any(who):
            return None
        sampled = self.penalty_actions(batch, rows, who)
        alpha = self.cql_alpha * torch.tensor(who, device=self.device)
        return lambda name: alpha * self.penalty(name, batch, rows, sampled)


class CQL(SAC):
    """CQL on SAC for continuous actions: each twin critic's loss carries the sampled CQL(H) penalty."""

    name: ClassVar[str] = "cql"
    hp_model = CQLHyperparameters
    group_class = CQLGroup

    def batch_key(self) -> tuple:
        return (*super().batch_key(), self.hp.cql_n_actions)
