"""DQN: Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015, and
Rainbow (Hessel et al., AAAI 2018) as DQN with its components switched on, each also usable alone.

Options: double Q-learning (van Hasselt et al., AAAI 2016), soft (Polyak) or hard target updates,
MSE or Huber loss, a linear epsilon-greedy schedule, action masks from ``info["action_mask"]``
(invalid actions are never explored, chosen greedily, or bootstrapped from), and the Rainbow parts:
n-step returns (:mod:`agilerl_core.buffers.nstep`), prioritised replay
(:mod:`agilerl_core.buffers.prioritized`), noisy linear layers, dueling heads and the C51
distributional loss (:func:`categorical_projection`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.dqn_hp import DQNHyperparameters, RainbowHyperparameters
from agilerl_core.algorithms.fused_mlp import backward_into, forward_cached
from agilerl_core.buffers.prioritized import MemberPriorities
from agilerl_core.buffers.replay import Transition, n_step_return
from agilerl_core.envs.spaces import Obs
from agilerl_core.networks.evolvable import ArchSpec


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    """Epsilon after `step` env steps: linear from `start` to `end` over `decay_steps`, then flat."""
    frac = min(max(step, 0) / decay_steps, 1.0)
    return start + frac * (end - start)


def _mask_invalid(q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return q
    mask = mask | ~mask.any(dim=1, keepdim=True)  # a state with no valid action: treat all as valid
    return q.masked_fill(~mask, float("-inf"))


def categorical_projection(next_probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                           support: torch.Tensor) -> torch.Tensor:
    """C51's projection (Bellemare et al. 2017, Algorithm 1) of the target distribution onto `support`.

    Atom z_j of the next-state distribution (probability next_probs[:, j]) moves to
    Tz_j = clip(r + discount * z_j, v_min, v_max) and its mass is split between the two neighbouring
    atoms in proportion to closeness; `discount` already holds gamma^L * (1 - terminated). A Tz_j that
    lands exactly on an atom gives it all its mass.
    """
    atoms = support.shape[0]
    v_min, v_max = float(support[0]), float(support[-1])
    dz = (v_max - v_min) / (atoms - 1)
    tz = (reward.unsqueeze(1) + discount.unsqueeze(1) * support.unsqueeze(0)).clamp(v_min, v_max)
    b = ((tz - v_min) / dz).clamp(0, atoms - 1)
    lower, upper = b.floor().long(), b.ceil().long()
    out = torch.zeros_like(next_probs)
    out.scatter_add_(1, lower, next_probs * (upper.to(b.dtype) - b + (upper == lower).to(b.dtype)))
    out.scatter_add_(1, upper, next_probs * (b - lower.to(b.dtype)))
    return out


class DQN(RLAlgorithm):
    """Deep Q-Network with optional double-Q target (Mnih et al. 2015; van Hasselt et al. 2016) and
    every Rainbow component as an option."""

    name: ClassVar[str] = "dqn"
    hp_model = DQNHyperparameters
    online_networks = ("q",)
    target_networks: ClassVar[dict[str, str]] = {"q_target": "q"}

    def __init__(self, obs_spec, action, arch, hp, seed, device="cpu") -> None:
        super().__init__(obs_spec, action, arch, hp, seed, device)
        hp = self.hp
        self.per = MemberPriorities(hp.buffer_size, 0, hp.per_alpha, hp.per_eps) if hp.per else None
        self._per_leaves: np.ndarray | None = None
        self.support = torch.linspace(hp.v_min, hp.v_max, hp.num_atoms, device=self.device) \
            if hp.distributional else None

    def network_io(self, name: str) -> tuple[int, int]:
        hp = self.hp
        return 0, self.action_dim * (hp.num_atoms if hp.distributional else 1)

    def network_arch(self, arch: ArchSpec, name: str) -> ArchSpec:
        hp = self.hp
        derived = super().network_arch(arch, name)
        dueling = (hp.num_atoms if hp.distributional else 1) if hp.dueling else 0
        return replace(derived, mlp=replace(derived.mlp, noisy=hp.noisy, dueling=dueling))

    @property
    def fused(self) -> bool:
        """Plain MLP DQN: the hand-written gradient path applies."""
        hp = self.hp
        return self.networks["q"].plain_mlp and not (hp.noisy or hp.dueling or hp.distributional or hp.per)

    def batch_key(self) -> tuple | None:
        if not self.fused or self.obs_norm is not None:
            return None
        hp = self.hp
        return self._group_key(hp.double, hp.loss, hp.hard_update_every, hp.max_grad_norm, hp.n_step)

    def batch_refusal(self) -> str:
        return (f"{self.name}: only plain-MLP DQN batches (no noisy, dueling, distributional or prioritised replay "
                f"parts, no obs normalisation, no image encoders)")

    @staticmethod
    def group(agents: list[DQN]):
        from agilerl_core.algorithms.dqn_group import DQNGroup  # it builds on this module

        return DQNGroup(agents)

    def q_values(self, obs: Obs, net: str = "q") -> torch.Tensor:
        """Q(s, .) [B, A]: the network's outputs, or the means of its return distributions (C51)."""
        out = self.networks[net](obs)
        if self.support is None:
            return out
        probs = torch.softmax(out.view(out.shape[0], self.action_dim, -1), dim=2)
        return (probs * self.support).sum(dim=2)

    # ---- acting ---------------------------------------------------------------------------------------
    def epsilon(self) -> float:
        hp = self.hp
        return linear_epsilon(self.env_steps, hp.eps_start, hp.eps_end, hp.eps_decay_steps)

    @torch.no_grad()
    def act(self, obs: Obs, epsilon: float = 0.0, action_mask: np.ndarray | None = None) -> np.ndarray:
        """Epsilon-greedy actions for a batch of observations (masked actions never chosen)."""
        return self.epsilon_greedy(self.q_values(obs), epsilon, action_mask)

    def epsilon_greedy(self, q: torch.Tensor, epsilon: float, action_mask: np.ndarray | None = None) -> np.ndarray:
        """The greedy actions of Q-values `q` [N, A] (masked actions never chosen), each replaced by a random
        valid one with probability `epsilon` (drawn from this member's generator)."""
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

    def explore_action(self, obs: Obs, action_mask: np.ndarray | None = None) -> np.ndarray:
        if self.hp.noisy:  # fresh parameter noise for every step's actions
            self.networks["q"].resample_noise(self.torch_gen)
        return self.act(obs, self.epsilon(), action_mask)

    def greedy_action(self, obs: Obs, action_mask: np.ndarray | None = None) -> np.ndarray:
        if self.hp.noisy:
            self.networks["q"].noise_off()
        return self.act(obs, 0.0, action_mask)

    # ---- prioritised replay ---------------------------------------------------------------------------
    def per_beta(self) -> float:
        hp = self.hp
        return hp.per_beta + (1.0 - hp.per_beta) * min(1.0, self.env_steps / hp.per_beta_steps)

    def sample(self, buffer, slot: int) -> Transition:
        if self.per is None:
            return super().sample(buffer, slot)
        batch, self._per_leaves = self.per.sample(buffer, slot, self.hp.batch_size, self.per_beta(), self.torch_gen)
        return batch

    def committed(self, first: int, count: int) -> None:
        if self.per is not None:
            self.per.committed(first, count)

    def begin_rollout(self, num_envs: int) -> None:
        if self.per is not None:
            self.per.begin_rollout()

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return self.per.state() if self.per is not None else {}

    def load_extra_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.per is not None and "per_leaves" in tensors:
            self.per.load(tensors)

    # ---- loss maths -----------------------------------------------------------------------------------
    @torch.no_grad()
    def td_target(self, batch: Transition, next_q_online: torch.Tensor | None = None) -> torch.Tensor:
        """r + gamma * (1 - terminated) * Q_target(s', a*), a* = argmax of Q_online (double) or Q_target.

        Truncated transitions are stored with terminated=0, so they bootstrap from the final state; an
        n-step transition bootstraps with its own gamma^L.
        """
        hp = self.hp
        next_q_target = self.q_values(batch.next_obs, "q_target")
        if hp.double:
            if next_q_online is None:
                next_q_online = self.q_values(batch.next_obs)
            best = _mask_invalid(next_q_online, batch.next_action_mask).argmax(dim=1, keepdim=True)
        else:
            best = _mask_invalid(next_q_target, batch.next_action_mask).argmax(dim=1, keepdim=True)
        next_q = next_q_target.gather(1, best).squeeze(1)
        reward, discount = n_step_return(batch, hp.gamma)
        return reward + discount * (1.0 - batch.terminated) * next_q

    def td_loss(self, q_taken: torch.Tensor, td_target: torch.Tensor) -> torch.Tensor:
        if self.hp.loss == "huber":
            return F.smooth_l1_loss(q_taken, td_target)
        return F.mse_loss(q_taken, td_target)

    @torch.no_grad()
    def target_distribution(self, batch: Transition) -> torch.Tensor:
        """C51 target [B, atoms]: the next state's distribution for the greedy next action (online
        network's choice when double), projected through the Bellman update."""
        out = self.networks["q_target"](batch.next_obs)
        probs = torch.softmax(out.view(out.shape[0], self.action_dim, -1), dim=2)
        q_next = self.q_values(batch.next_obs) if self.hp.double else (probs * self.support).sum(dim=2)
        best = _mask_invalid(q_next, batch.next_action_mask).argmax(dim=1)
        next_probs = probs[torch.arange(probs.shape[0], device=probs.device), best]
        reward, discount = n_step_return(batch, self.hp.gamma)
        discount = discount * (1.0 - batch.terminated)
        return categorical_projection(next_probs, reward, discount, self.support)

    def sample_losses(self, batch: Transition) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-sample loss [B] (differentiable), per-sample priority signal [B]): the TD error for Q
        regression, the cross-entropy to the projected target for C51."""
        if self.support is not None:
            out = self.networks["q"](batch.obs)
            logits = out.view(out.shape[0], self.action_dim, -1)[torch.arange(out.shape[0]), batch.action]
            ce = -(self.target_distribution(batch) * torch.log_softmax(logits, dim=1)).sum(dim=1)
            return ce, ce.detach()
        target = self.td_target(batch)
        q_taken = self.q_values(batch.obs).gather(1, batch.action.unsqueeze(1)).squeeze(1)
        return self.td_per_sample(q_taken, target), (q_taken - target).detach().abs()

    def td_per_sample(self, q_taken: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-sample regression loss of Q towards the TD target (MSE or Huber)."""
        if self.hp.loss == "huber":
            return F.smooth_l1_loss(q_taken, target, reduction="none")
        return (q_taken - target).square()

    def loss(self, batch: Transition) -> torch.Tensor:
        """The (importance-weighted) loss of the online network on `batch` (differentiable)."""
        per_sample, _ = self.sample_losses(batch)
        if batch.weight is not None:
            return (per_sample * batch.weight).mean()
        return per_sample.mean()

    # ---- learning -------------------------------------------------------------------------------------
    def learn(self, batch: Transition) -> torch.Tensor:
        """One gradient step on `batch`, priority updates, and a target update; returns the (detached) loss."""
        opt = self.optimizers["q"]
        opt.zero_grad()
        hp = self.hp
        if hp.noisy:  # independent noise for the online and target networks at every step
            self.networks["q"].resample_noise(self.torch_gen)
            self.networks["q_target"].resample_noise(self.torch_gen)
        if self.fused:
            loss = self._fused_loss_and_grad(batch)
        else:
            per_sample, signal = self.sample_losses(batch)
            loss = (per_sample * batch.weight).mean() if batch.weight is not None else per_sample.mean()
            loss.backward()
            loss = loss.detach()
            if self.per is not None and self._per_leaves is not None:
                self.per.update(self._per_leaves, signal.cpu().numpy())
                self._per_leaves = None
        if hp.max_grad_norm is not None:
            opt.clip_grad_norm(hp.max_grad_norm)
        opt.step()
        self.learn_steps += 1
        if hp.hard_update_every is None:
            self.update_targets(hp.tau)
        elif self.learn_steps % hp.hard_update_every == 0:
            self.update_targets(1.0)
        return loss

    @torch.no_grad()
    def _fused_loss_and_grad(self, batch: Transition) -> torch.Tensor:
        """Same maths as loss().backward() for a plain MLP, without autograd."""
        net = self.networks["q"]
        x = net.features(batch.obs)  # a plain MLP's input (normalised when normalize_obs)
        n = x.shape[0]
        if self.hp.double:
            x_next = net.features(batch.next_obs)
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


class Rainbow(DQN):
    """Rainbow DQN (Hessel et al. 2018): DQN with n-step returns, prioritised replay, noisy layers,
    dueling heads and C51 on by default."""

    name: ClassVar[str] = "rainbow"
    hp_model = RainbowHyperparameters
