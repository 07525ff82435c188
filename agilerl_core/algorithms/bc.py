"""Behaviour cloning: the policy imitates the dataset's actions by supervised learning, the baseline every
offline RL method is measured against (it matches the data's behaviour, not better, not worse).

Discrete actions: cross-entropy of the policy's logits against the dataset's action. Continuous
actions: mean squared error of the deterministic policy tanh(f(s)) against the dataset's action in
the agent's [-1, 1] scale. Learning is written once for a population (:class:`BCGroup`); a member alone is
a group of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.group import ReplayGroup, StackedRows, clipped_step, gradients
from agilerl_core.algorithms.hyperparameters.bc import BCHyperparameters
from agilerl_core.buffers.replay import Transition


def imitation_loss(out: torch.Tensor, action: torch.Tensor, discrete: bool) -> torch.Tensor:
    """Each row's loss [...]: cross-entropy of logits `out` [..., A] against the taken action, or the mean
    squared error of tanh(out) against the action [..., A]."""
    if discrete:
        return -torch.log_softmax(out, dim=-1).gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    return (torch.tanh(out) - action).square().mean(-1)


class BCGroup(ReplayGroup):
    """K behaviour-cloning members: one stacked policy, each member on its own minibatches and learning rate."""

    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        self.adam = self.adams["policy"]
        self.policy = self.stacked([a.layouts["policy"] for a in self.agents], self.adam.flat, self.adam.padded,
                                     trainable=True)
        self.discrete = self.agents[0].action_spec.discrete
        self.max_grad_norm = self.agents[0].hp.max_grad_norm

    def explore_group(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        """Behaviour cloning has no exploration policy: the greedy actions."""
        return self.greedy(obs, mask)

    @torch.no_grad()
    def greedy(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None, starts: torch.Tensor | None = None
               ) -> torch.Tensor:
        out = self.policy(obs)
        if not self.discrete:
            return torch.tanh(out)
        if mask is not None:
            mask = mask.view(out.shape)
            out = out.masked_fill(~(mask | ~mask.any(dim=2, keepdim=True)), float("-inf"))
        return out.argmax(dim=2)

    def learn(self, batch: Transition, rows: StackedRows) -> torch.Tensor:
        k = rows.k
        out = self.policy(batch.obs)
        action = batch.action.view(k, -1, *batch.action.shape[1:])
        losses = (imitation_loss(out, action, self.discrete) * rows.weight).sum(1)
        (self.adam.grad,) = gradients(losses.sum(), self.policy.leaves)
        due = self.metrics.due()
        norm = clipped_step(self.adam, self.max_grad_norm, None if rows.all_active else rows.active, due)
        for a, on in zip(self.agents, rows.who, strict=True):
            a.learn_steps += int(on)
        if due:
            values = {"grad_norm": norm}
            if self.discrete:  # how often the policy's choice is the dataset's action
                values["accuracy"] = ((out.detach().argmax(2) == action) * rows.weight).sum(1)
            self.metrics.add(None if rows.all_active else rows.active, **values)
        return losses.detach()


class BC(RLAlgorithm):
    """Behaviour cloning for Discrete and Box actions."""

    name: ClassVar[str] = "bc"
    hp_model = BCHyperparameters
    online_networks = ("policy",)
    target_networks: ClassVar[dict[str, str]] = {}
    action_kinds: ClassVar[tuple[str, ...]] = ("discrete", "box")

    group_class = BCGroup

    def batch_key(self) -> tuple:
        """Members with equal keys learn as one group (same network structure up to hidden widths)."""
        return self._group_key(self.hp.max_grad_norm, self.obs_norm is not None)
