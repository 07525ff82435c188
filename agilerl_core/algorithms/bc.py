"""Behaviour cloning: the policy imitates the dataset's actions by supervised learning, the baseline every
offline RL method is measured against (it matches the data's behaviour, not better, not worse).

Discrete actions: cross-entropy of the policy's logits against the dataset's action. Continuous
actions: mean squared error of the deterministic policy tanh(f(s)) against the dataset's action in
the agent's [-1, 1] scale.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.bc_hp import BCHyperparameters
from agilerl_core.buffers.replay import Transition
from agilerl_core.envs.spaces import Obs


class BC(RLAlgorithm):
    """Behaviour cloning for Discrete and Box actions."""

    name: ClassVar[str] = "bc"
    hp_model = BCHyperparameters
    online_networks = ("policy",)
    target_networks: ClassVar[dict[str, str]] = {}
    action_kinds: ClassVar[tuple[str, ...]] = ("discrete", "box")

    def loss(self, batch: Transition) -> torch.Tensor:
        out = self.networks["policy"](batch.obs)
        if self.action_spec.discrete:
            return F.cross_entropy(out, batch.action)
        return F.mse_loss(torch.tanh(out), batch.action)

    def learn(self, batch: Transition) -> torch.Tensor:
        opt = self.optimizers["policy"]
        opt.zero_grad()
        loss = self.loss(batch)
        loss.backward()
        if self.hp.max_grad_norm is not None:
            opt.clip_grad_norm(self.hp.max_grad_norm)
        opt.step()
        self.learn_steps += 1
        return loss.detach()

    @torch.no_grad()
    def greedy_action(self, obs: Obs, action_mask: np.ndarray | None = None) -> np.ndarray:
        out = self.networks["policy"](obs)
        if self.action_spec.discrete:
            if action_mask is not None:
                mask = torch.as_tensor(action_mask, dtype=torch.bool, device=out.device)
                out = out.masked_fill(~(mask | ~mask.any(dim=1, keepdim=True)), float("-inf"))
            return out.argmax(dim=1).cpu().numpy()
        return torch.tanh(out).cpu().numpy()

    def explore_action(self, obs: Obs, action_mask: np.ndarray | None = None) -> np.ndarray:
        """BC never collects experience (the config requires a dataset); its policy acts greedily."""
        return self.greedy_action(obs, action_mask)
