"""DQN: Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015, and
Rainbow (Hessel et al., AAAI 2018) as DQN with its components switched on, each also usable alone.

Options: double Q-learning (van Hasselt et al., AAAI 2016), soft (Polyak) or hard target updates,
MSE or Huber loss, a linear epsilon-greedy schedule, action masks from ``info["action_mask"]``
(invalid actions are never explored, chosen greedily, or bootstrapped from), and the Rainbow parts:
n-step returns (:mod:`agilerl_core.buffers.nstep`), prioritised replay
(:mod:`agilerl_core.buffers.prioritized`), noisy linear layers, dueling heads and the C51
distributional loss (:func:`~agilerl_core.algorithms.dqn.maths.categorical_projection`).

This module holds a member: its networks, hyperparameters, acting and priorities. Learning is written
once for a population in :mod:`agilerl_core.algorithms.dqn.group`; a member alone learns as a group of one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.dqn.group import DQNGroup
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters, RainbowHyperparameters
from agilerl_core.buffers.prioritized import MemberPriorities
from agilerl_core.networks.evolvable import ArchSpec


class DQN(RLAlgorithm):
    """Deep Q-Network with optional double-Q target (Mnih et al. 2015; van Hasselt et al. 2016) and
    every Rainbow component as an option."""

    name: ClassVar[str] = "dqn"
    hp_model = DQNHyperparameters
    online_networks = ("q",)
    target_networks: ClassVar[dict[str, str]] = {"q_target": "q"}
    group_class: ClassVar[type[DQNGroup]] = DQNGroup

    def __init__(self, obs_spec, action, arch, hp, seed, device="cpu") -> None:
        super().__init__(obs_spec, action, arch, hp, seed, device)
        hp = self.hp
        self.per = MemberPriorities(hp.buffer_size, 0, hp.per_alpha, hp.per_eps, self.device) if hp.per else None
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

    # ---- population-batched learning ------------------------------------------------------------------
    def batch_key(self) -> tuple:
        """Members with equal keys learn as one group: the same network structure (hidden widths may differ)
        and the same structural options; rates, gamma, tau, batch size and the schedules are per member."""
        hp = self.hp
        heads = (hp.noisy, hp.dueling, hp.distributional, hp.num_atoms, hp.v_min, hp.v_max) \
            if hp.distributional else (hp.noisy, hp.dueling)
        return self._group_key(hp.double, hp.loss, hp.hard_update_every, hp.max_grad_norm, hp.n_step, hp.per,
                               self.obs_norm is not None, heads)


    # ---- prioritised replay ---------------------------------------------------------------------------
    def committed(self, first: int, count: int, dead: torch.Tensor | None = None) -> None:
        if self.per is not None:
            self.per.committed(first, count, dead)

    def begin_rollout(self, num_envs: int) -> None:
        if self.per is not None:
            self.per.begin_rollout()

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return self.per.state() if self.per is not None else {}

    def load_extra_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.per is not None and "per_leaves" in tensors:
            self.per.load(tensors)


class Rainbow(DQN):
    """Rainbow DQN (Hessel et al. 2018): DQN with n-step returns, prioritised replay, noisy layers,
    dueling heads and C51 on by default."""

    name: ClassVar[str] = "rainbow"
    hp_model = RainbowHyperparameters
