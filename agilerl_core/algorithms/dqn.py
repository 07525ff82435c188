"""DQN: Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015.

Options: double Q-learning (van Hasselt et al., AAAI 2016), soft (Polyak) or hard target updates,
MSE or Huber loss, a linear epsilon-greedy schedule, and action masks from ``info["action_mask"]``
(invalid actions are never explored, chosen greedily, or bootstrapped from).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.fused_mlp import backward_into, forward_cached
from agilerl_core.buffers.replay import Transition
from agilerl_core.config import DQNHyperparameters
from agilerl_core.envs.spaces import Obs
from agilerl_core.hpo.space import HyperparameterSpec


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    """Epsilon after `step` env steps: linear from `start` to `end` over `decay_steps`, then flat."""
    frac = min(max(step, 0) / decay_steps, 1.0)
    return start + frac * (end - start)


def _mask_invalid(q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return q
    mask = mask | ~mask.any(dim=1, keepdim=True)  # a state with no valid action: treat all as valid
    return q.masked_fill(~mask, float("-inf"))


class DQN(RLAlgorithm):
    """Deep Q-Network with optional double-Q target (Mnih et al. 2015; van Hasselt et al. 2016)."""

    name: ClassVar[str] = "dqn"
    hp_model = DQNHyperparameters
    online_networks = ("q",)
    target_networks: ClassVar[dict[str, str]] = {"q_target": "q"}
    default_hp_space: ClassVar[dict[str, HyperparameterSpec]] = {
        "lr": HyperparameterSpec(min=1e-5, max=1e-2, kind="log", grow=1.5, shrink=1 / 1.5),
        "batch_size": HyperparameterSpec(min=32, max=512, kind="int", grow=1.5, shrink=0.75),
        "learn_step": HyperparameterSpec(min=1, max=16, kind="int", grow=1.5, shrink=0.75),
    }

    # ---- acting ---------------------------------------------------------------------------------------
    def epsilon(self) -> float:
        hp = self.hp
        return linear_epsilon(self.env_steps, hp.eps_start, hp.eps_end, hp.eps_decay_steps)

    @torch.no_grad()
    def act(self, obs: Obs, epsilon: float = 0.0, action_mask: np.ndarray | None = None) -> np.ndarray:
        """Epsilon-greedy actions for a batch of observations (masked actions never chosen)."""
        q = self.networks["q"](obs)
        mask_t = None if action_mask is None else torch.as_tensor(action_mask, dtype=torch.bool, device=q.device)
        actions = _mask_invalid(q, mask_t).argmax(dim=1).cpu().numpy()
        if epsilon > 0.0:
            n = actions.shape[0]
            explore = self.np_rng.random(n) < epsilon
            if explore.any():
                if action_mask is None:
                    random = self.np_rng.integers(0, self.action_dim, n)
                else:
                    m = np.asarray(action_mask, dtype=bool)
                    m = m | ~m.any(axis=1, keepdims=True)
                    random = (self.np_rng.random((n, self.action_dim)) * m + m).argmax(axis=1)
                actions = np.where(explore, random, actions)
        return actions

    # ---- loss maths -----------------------------------------------------------------------------------
    @torch.no_grad()
    def td_target(self, batch: Transition, next_q_online: torch.Tensor | None = None) -> torch.Tensor:
        """r + gamma * (1 - terminated) * Q_target(s', a*), a* = argmax of Q_online (double) or Q_target.

        Truncated transitions are stored with terminated=0, so they bootstrap from the final state.
        """
        hp = self.hp
        next_q_target = self.networks["q_target"](batch.next_obs)
        if hp.double:
            if next_q_online is None:
                next_q_online = self.networks["q"](batch.next_obs)
            best = _mask_invalid(next_q_online, batch.next_action_mask).argmax(dim=1, keepdim=True)
        else:
            best = _mask_invalid(next_q_target, batch.next_action_mask).argmax(dim=1, keepdim=True)
        next_q = next_q_target.gather(1, best).squeeze(1)
        return batch.reward + hp.gamma * (1.0 - batch.terminated) * next_q

    def td_loss(self, q_taken: torch.Tensor, td_target: torch.Tensor) -> torch.Tensor:
        if self.hp.loss == "huber":
            return F.smooth_l1_loss(q_taken, td_target)
        return F.mse_loss(q_taken, td_target)

    def loss(self, batch: Transition) -> torch.Tensor:
        """The TD loss of the online network on `batch` (differentiable)."""
        td_target = self.td_target(batch)
        q_taken = self.networks["q"](batch.obs).gather(1, batch.action.unsqueeze(1)).squeeze(1)
        return self.td_loss(q_taken, td_target)

    # ---- learning -------------------------------------------------------------------------------------
    def learn(self, batch: Transition) -> torch.Tensor:
        """One gradient step on `batch` and a target update; returns the (detached) loss."""
        opt = self.optimizers["q"]
        opt.zero_grad()
        if self.networks["q"].plain_mlp:
            loss = self._fused_loss_and_grad(batch)
        else:
            loss = self.loss(batch)
            loss.backward()
            loss = loss.detach()
        if self.hp.max_grad_norm is not None:
            opt.clip_grad_norm(self.hp.max_grad_norm)
        opt.step()
        self.learn_steps += 1
        hp = self.hp
        if hp.hard_update_every is None:
            self.update_targets(hp.tau)
        elif self.learn_steps % hp.hard_update_every == 0:
            self.update_targets(1.0)
        return loss

    @torch.no_grad()
    def _fused_loss_and_grad(self, batch: Transition) -> torch.Tensor:
        """Same maths as loss().backward() for a plain MLP, without autograd."""
        net = self.networks["q"]
        x, _ = self.obs_spec.preprocess(batch.obs)
        n = x.shape[0]
        if self.hp.double:
            x_next, _ = self.obs_spec.preprocess(batch.next_obs)
            out, inputs = forward_cached(net.mlp, torch.cat([x, x_next]))
            q, next_q_online = out[:n], out[n:]
            inputs = [t[:n] for t in inputs]
        else:
            (q, inputs), next_q_online = forward_cached(net.mlp, x), None
        td_target = self.td_target(batch, next_q_online)
        action = batch.action.unsqueeze(1)
        diff = q.gather(1, action).squeeze(1) - td_target
        if self.hp.loss == "huber":
            absd = diff.abs()
            loss = torch.where(absd < 1.0, 0.5 * diff * diff, absd - 0.5).mean()
            dq = diff.clamp(-1.0, 1.0).div_(n)
        else:
            loss = diff.square().mean()
            dq = diff.mul(2.0 / n)
        grad_out = torch.zeros_like(q).scatter_(1, action, dq.unsqueeze(1))
        backward_into(net.mlp, inputs, grad_out)
        return loss
