"""DQN members learning as one population-batched group (:mod:`agilerl_core.algorithms.group`): the plain-MLP
DQN of :meth:`DQN._fused_loss_and_grad`, K members at once. Double Q, MSE or Huber loss, action masks, soft
or hard target updates and n-step returns are covered; each member keeps its own learning rate, gamma,
tau, batch size and exploration schedule."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from agilerl_core.algorithms.dqn import _mask_invalid
from agilerl_core.algorithms.fused_mlp import stacked_backward, stacked_forward_cached
from agilerl_core.algorithms.group import ReplayGroup, StackedRows, clipped_step
from agilerl_core.buffers.replay import Transition
from agilerl_core.networks.stacked import stacked_forward


class DQNGroup(ReplayGroup):
    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        first = self.agents[0]
        self.q = self.adams["q"]
        self.gamma = self.hp_tensor("gamma")
        self.tau = self.hp_tensor("tau")
        self.hard_every = first.hp.hard_update_every
        self.double, self.huber = first.hp.double, first.hp.loss == "huber"
        self.max_grad_norm = first.hp.max_grad_norm

    @torch.no_grad()
    def explore(self, obs: Sequence, masks: Sequence) -> list[np.ndarray]:
        x = self.stacked_obs(obs)
        q = stacked_forward(self.q.layers, x, self.activation)
        return [a.epsilon_greedy(q[i], a.epsilon(), masks[i]) for i, a in enumerate(self.agents)]

    @torch.no_grad()
    def learn(self, batch: Transition, rows: StackedRows) -> torch.Tensor:
        k, b = rows.k, rows.b
        x, x_next = self.features(batch.obs, k), self.features(batch.next_obs, k)
        if self.double:
            out, inputs = stacked_forward_cached(self.q.layers, torch.cat([x, x_next], dim=1), self.activation)
            q, next_online = out[:, :b], out[:, b:]
            inputs = [t[:, :b] for t in inputs]
        else:
            (q, inputs), next_online = stacked_forward_cached(self.q.layers, x, self.activation), None
        next_target = stacked_forward(self.target_layers["q_target"], x_next, self.activation)
        mask = None if batch.next_action_mask is None else batch.next_action_mask.view(k * b, -1)
        chooser = next_target if next_online is None else next_online
        best = _mask_invalid(chooser.reshape(k * b, -1), mask).argmax(dim=1).view(k, b, 1)
        next_q = next_target.gather(2, best).squeeze(2)
        reward, discount = self.returns(batch, k)
        target = reward + discount * (1.0 - batch.terminated.view(k, b)) * next_q
        action = batch.action.view(k, b, 1)
        diff = q.gather(2, action).squeeze(2) - target
        w = rows.weight
        if self.huber:
            absd = diff.abs()
            losses = (torch.where(absd < 1.0, 0.5 * diff * diff, absd - 0.5) * w).sum(1)
            dq = diff.clamp(-1.0, 1.0).mul_(w)
        else:
            losses = (diff.square() * w).sum(1)
            dq = diff.mul(2.0).mul_(w)
        self.q.zero_grad()
        stacked_backward(self.q.layers, inputs, torch.zeros_like(q).scatter_(2, action, dq.unsqueeze(2)),
                         self.activation, grads=self.q.grad_layers)
        clipped_step(self.q, self.max_grad_norm, None if rows.all_active else rows.active)
        for a, on in zip(self.agents, rows.active.tolist(), strict=True):
            a.learn_steps += int(on)
        on = rows.active.to(self.tau.dtype)
        if self.hard_every is None:
            self.update_targets(self.tau * on)
        else:
            due = torch.tensor([a.learn_steps % self.hard_every == 0 for a in self.agents], device=self.device)
            self.update_targets(due.to(on.dtype) * on)
        return losses
