"""TD3 and DDPG members learning as one population-batched group (:mod:`agilerl_core.algorithms.group`):
every critic's step, the target with its smoothing noise, and the delayed actor step through critic 1 are
one stacked pass each, with a hand-written backward (the actor's gradient goes through the critic's input
gradient and the tanh). Each member keeps its own learning rates, gamma, tau, batch size, policy_freq,
smoothing noise and exploration noise (drawn from its own generators)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from agilerl_core.algorithms.fused_mlp import stacked_backward, stacked_forward_cached
from agilerl_core.algorithms.group import ActorCriticGroup, StackedRows, actor_turns
from agilerl_core.buffers.replay import Transition
from agilerl_core.networks.stacked import stacked_forward


class TD3Group(ActorCriticGroup):
    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        self.noise, self.noise_clip = self.hp_tensor("target_noise"), self.hp_tensor("target_noise_clip")
        self.policy_freq = [a.hp.policy_freq for a in self.agents]
        self.delayed = self.agents[0].delayed_targets

    @torch.no_grad()
    def explore(self, obs: Sequence, masks: Sequence) -> list[np.ndarray]:
        x = self.stacked_obs(obs)
        greedy = torch.tanh(stacked_forward(self.actor.layers, x, self.activation)).cpu().numpy()
        return [a.explore_from(greedy[i], greedy.shape[1]) for i, a in enumerate(self.agents)]

    @torch.no_grad()
    def _target(self, batch: Transition, rows: StackedRows, xn: torch.Tensor) -> torch.Tensor:
        k, b = rows.k, rows.b
        next_a = torch.tanh(stacked_forward(self.target_layers["actor_target"], xn, self.activation))
        eps = self.member_noise(rows, [on and a.hp.target_noise > 0 for a, on in
                                       zip(self.agents, rows.active.tolist(), strict=True)], self.dim)
        clip = self.noise_clip.view(k, 1, 1)
        eps = (eps * self.noise.view(k, 1, 1)).clamp(-clip, clip)
        smoothed = (next_a + eps).clamp(-1.0, 1.0)
        next_a = torch.where(self.noise.view(k, 1, 1) > 0, smoothed, next_a)
        xa = torch.cat([xn, next_a], dim=2)
        q_next = torch.stack([stacked_forward(self.target_layers[f"{c}_target"], xa, self.activation).squeeze(2)
                              for c in self.critics]).min(0).values
        reward, discount = self.returns(batch, k)
        return reward + discount * (1.0 - batch.terminated.view(k, b)) * q_next

    @torch.no_grad()
    def learn(self, batch: Transition, rows: StackedRows) -> torch.Tensor:
        k, b = rows.k, rows.b
        x, xn = self.features(batch.obs, k), self.features(batch.next_obs, k)
        y = self._target(batch, rows, xn)
        active = None if rows.all_active else rows.active
        w = rows.weight
        xa = torch.cat([x, batch.action.view(k, b, self.dim)], dim=2)
        total = torch.zeros(k, device=self.device)
        for c in self.critics:
            adam = self.adams[c]
            q, inputs = stacked_forward_cached(adam.layers, xa, self.activation)
            diff = q.squeeze(2) - y
            total += (diff.square() * w).sum(1)
            adam.zero_grad()
            stacked_backward(adam.layers, inputs, (2.0 * diff * w).unsqueeze(2), self.activation,
                             grads=adam.grad_layers)
            self.step_adam(adam, active)
        turns = actor_turns(self.agents, rows.active, self.policy_freq)
        turn = torch.tensor(turns, device=self.device)
        if turn.any():
            self._actor_step(x, w * turn.unsqueeze(1), None if turn.all() else turn)
        moved = turn if self.delayed else rows.active
        self.update_targets(self.tau * moved.to(self.tau.dtype))
        return total

    def _actor_step(self, x: torch.Tensor, w: torch.Tensor, active: torch.Tensor | None) -> None:
        """The deterministic policy gradient, -mean Q_1(s, tanh(actor(s))), by hand: the critic's input
        gradient at the action columns, through the tanh, back through the actor."""
        pre, a_inputs = stacked_forward_cached(self.actor.layers, x, self.activation)
        mu = torch.tanh(pre)
        critic = self.adams[self.critics[0]]
        _, c_inputs = stacked_forward_cached(critic.layers, torch.cat([x, mu], dim=2), self.activation)
        g_in = stacked_backward(critic.layers, c_inputs, -w.unsqueeze(2), self.activation, input_grad=True)
        g_pre = g_in[:, :, -self.dim:] * (1.0 - mu * mu)
        self.actor.zero_grad()
        stacked_backward(self.actor.layers, a_inputs, g_pre, self.activation, grads=self.actor.grad_layers)
        self.step_adam(self.actor, active)
