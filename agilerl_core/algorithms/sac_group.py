"""SAC members learning as one population-batched group (:mod:`agilerl_core.algorithms.group`): the soft
target, both critics' steps, the reparameterised actor step and the temperature step for the whole group,
each a stacked pass; the members' losses are summed so one autograd backward gives each member its own
gradients. Each member keeps its own learning rates, gamma, tau, batch size, policy_freq, temperature and
its target entropy, and draws its own noise from its own generator."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from agilerl_core.algorithms.group import ActorCriticGroup, StackedRows, stacked_blocks
from agilerl_core.algorithms.optim import adam_update_
from agilerl_core.buffers.replay import Transition
from agilerl_core.networks.stacked import Layers, stacked_forward

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def squashed_log_prob(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log pi(tanh(u)) for u ~ N(mean, exp(log_std)): the Gaussian log density minus the tanh Jacobian,
    log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) (numerically stable), summed over dims."""
    gauss = -0.5 * ((u - mean) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    jac = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
    return (gauss - jac).sum(dim=-1)



class SACGroup(ActorCriticGroup):
    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        self.target_entropy = torch.tensor([a.target_entropy for a in self.agents], device=self.device)
        self.log_alpha = torch.stack([a.log_alpha for a in self.agents])

    def _distribution(self, layers: Layers, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = stacked_forward(layers, x, self.activation)
        return out[..., : self.dim], out[..., self.dim:].clamp(LOG_STD_MIN, LOG_STD_MAX)

    def _q(self, name: str, x: torch.Tensor, a: torch.Tensor, layers: Layers | None = None) -> torch.Tensor:
        layers = self.adams[name].layers if layers is None else layers
        return stacked_forward(layers, torch.cat([x, a], dim=2), self.activation).squeeze(2)

    @torch.no_grad()
    def explore(self, obs: Sequence, masks: Sequence) -> list[np.ndarray]:
        mean, log_std = self._distribution(self.actor.layers, self.stacked_obs(obs))
        out = []
        for i, a in enumerate(self.agents):
            n = mean.shape[1]
            if a.in_warmup():
                out.append(a.random_actions(n))
                continue
            noise = torch.randn(mean[i].shape, generator=a.torch_gen).to(self.device)
            out.append(torch.tanh(mean[i] + log_std[i].exp() * noise).cpu().numpy())
        return out

    def _step(self, name: str, leaf: torch.Tensor, active: torch.Tensor | None) -> None:
        """The gradient autograd left on `leaf` into network `name`'s stacked Adam, then its step."""
        self.adams[name].grad.copy_(leaf.grad)
        self.step_adam(self.adams[name], active)

    def learn(self, batch: Transition, rows: StackedRows) -> torch.Tensor:
        k, b = rows.k, rows.b
        x, xn = self.features(batch.obs, k), self.features(batch.next_obs, k)
        act = rows.active.tolist()
        w = rows.weight
        with torch.no_grad():
            alpha = self.log_alpha.exp().unsqueeze(1)
            mean, log_std = self._distribution(self.actor.layers, xn)
            u = mean + log_std.exp() * self.member_noise(rows, act, self.dim)
            next_a, next_logp = torch.tanh(u), squashed_log_prob(u, mean, log_std)
            q_next = torch.min(*(self._q(c, xn, next_a, self.target_layers[f"{c}_target"]) for c in self.critics))
            soft = q_next - alpha * next_logp
            reward, discount = self.returns(batch, k)
            y = reward + discount * (1.0 - batch.terminated.view(k, b)) * soft
        active = None if rows.all_active else rows.active
        xa = batch.action.view(k, b, self.dim)
        total = torch.zeros(k, device=self.device)
        for c in self.critics:
            leaf = self.adams[c].flat.detach().requires_grad_(True)
            with torch.enable_grad():
                q = self._q(c, x, xa, stacked_blocks(leaf, k, self.adams[c].padded))
                losses = ((q - y).square() * w).sum(1)
                losses.sum().backward()
            self._step(c, leaf, active)
            total += losses.detach()
        turns = []
        for a, on in zip(self.agents, act, strict=True):
            a.learn_steps += int(on)
            turns.append(bool(on) and a.learn_steps % a.hp.policy_freq == 0)
        if any(turns):
            self._actor_step(x, rows, turns, alpha)
        self.update_targets(self.tau * rows.active.to(self.tau.dtype))
        return total

    def _actor_step(self, x: torch.Tensor, rows: StackedRows, turns: list[bool], alpha: torch.Tensor) -> None:
        """E[alpha log pi - min Q] through the reparameterised sample (critics as they are after their step),
        then each member's temperature step from the same log-probs."""
        k = rows.k
        turn = torch.tensor(turns, device=self.device)
        w = rows.weight * turn.unsqueeze(1)
        noise = self.member_noise(rows, turns, self.dim)
        leaf = self.actor.flat.detach().requires_grad_(True)
        with torch.enable_grad():
            mean, log_std = self._distribution(stacked_blocks(leaf, k, self.actor.padded), x)
            u = mean + log_std.exp() * noise
            a, logp = torch.tanh(u), squashed_log_prob(u, mean, log_std)
            q = torch.min(*(self._q(c, x, a) for c in self.critics))
            ((alpha * logp - q) * w).sum().backward()
        self._step("actor", leaf, None if all(turns) else turn)
        logp = logp.detach()
        for i, ag in enumerate(self.agents):
            if turns[i] and ag.hp.auto_entropy:  # alpha_loss's gradient: -mean(log pi + target entropy)
                n = int((rows.weight[i] > 0).sum())
                grad = -(logp[i, :n] + self.target_entropy[i]).mean()
                adam_update_(self.log_alpha[i], grad, ag.alpha_adam, ag.hp.lr_alpha)

    def write_back(self) -> None:
        super().write_back()
        for i, a in enumerate(self.agents):
            a.log_alpha = self.log_alpha[i].clone()
