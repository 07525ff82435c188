"""PPO: Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347 (2017), with GAE.

Discrete actions: a categorical policy over the actor's logits (action masks respected). Box actions:
a Gaussian over the actor's means with a state-independent log std (agent scale; the env receives
the sample clipped to [-1, 1] and scaled to its bounds). A separate critic estimates V(s); both
share the agent's architecture, so one mutation changes them together.

Per rollout: GAE advantages, then ``update_epochs`` passes of shuffled minibatches of the clipped
surrogate (:func:`ppo_loss`), optional value clipping, entropy bonus, per-minibatch advantage
normalisation, and an early stop once the approximate KL exceeds ``target_kl``.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.optim import adam_update_
from agilerl_core.algorithms.ppo_group import PPOGroup, minibatch_bounds
from agilerl_core.algorithms.ppo_hp import PPOHyperparameters
from agilerl_core.buffers.rollout import Rollout
from agilerl_core.envs.spaces import Obs


def ppo_loss(new_logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float) -> torch.Tensor:
    """Clipped surrogate (to minimise): mean of max(-A r, -A clip(r, 1 - c, 1 + c)), r = pi_new / pi_old."""
    ratio = (new_logp - old_logp).exp()
    return torch.max(-adv * ratio, -adv * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()


def value_loss(values: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor, clip: float | None) -> torch.Tensor:
    """0.5 (V - R)^2, or with clipping 0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)."""
    unclipped = (values - returns).square()
    if clip is None:
        return 0.5 * unclipped.mean()
    clipped = (old_values + (values - old_values).clamp(-clip, clip) - returns).square()
    return 0.5 * torch.max(unclipped, clipped).mean()


class PPO(RLAlgorithm):
    """Proximal policy optimisation with an actor and a critic network."""

    name: ClassVar[str] = "ppo"
    hp_model = PPOHyperparameters
    action_kinds: ClassVar[tuple[str, ...]] = ("discrete", "box")
    uses_replay: ClassVar[bool] = False
    online_networks = ("actor", "critic")
    target_networks: ClassVar[dict[str, str]] = {}
    noise_networks: ClassVar[tuple[str, ...]] = ("actor",)

    def __init__(self, obs_spec, action, arch, hp, seed, device="cpu") -> None:
        super().__init__(obs_spec, action, arch, hp, seed, device)
        self.continuous = not self.action_spec.discrete
        # Gaussian log std (Box actions): a plain tensor with its own Adam moments, saved as extra state
        self.log_std = torch.full((self.action_dim,), float(self.hp.log_std_init), device=self.device)
        self.log_std_adam = torch.zeros(2 * self.action_dim + 1, device=self.device)  # m, v, step

    def network_io(self, name: str) -> tuple[int, int]:
        return (0, 1) if name == "critic" else (0, self.action_dim)

    # ---- the policy -----------------------------------------------------------------------------------
    def value(self, obs: Obs) -> torch.Tensor:
        return self.networks["critic"](obs).squeeze(1)

    def _dist_params(self, obs: Obs, mask: torch.Tensor | None, log_std: torch.Tensor | None = None):
        return self.dist_from(self.networks["actor"](obs), mask, log_std)

    def dist_from(self, out: torch.Tensor, mask: torch.Tensor | None, log_std: torch.Tensor | None = None):
        """The policy's distribution parameters from the actor's outputs `out` [..., A]: (means, log std)
        for Box actions, (logits with masked actions at -1e9, None) for discrete ones."""
        if self.continuous:
            return out, (self.log_std if log_std is None else log_std).expand_as(out)
        if mask is not None:
            mask = mask | ~mask.any(dim=-1, keepdim=True)
            out = out.masked_fill(~mask, -1e9)
        return out, None

    def log_prob_entropy(self, obs: Obs, actions: torch.Tensor, mask: torch.Tensor | None = None,
                         log_std: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(a|s), entropy of pi(.|s)) for a batch (differentiable)."""
        return self.log_prob_entropy_from(*self._dist_params(obs, mask, log_std), actions)

    def log_prob_entropy_from(self, p: torch.Tensor, log_std: torch.Tensor | None, actions: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`log_prob_entropy` from distribution parameters (:meth:`dist_from`); leading dims kept."""
        if self.continuous:
            std = log_std.exp()
            logp = (-0.5 * ((actions - p) / std).square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
            ent = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1)
            return logp, ent
        logits = torch.log_softmax(p, dim=-1)
        probs = logits.exp()
        return logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), -(probs * logits).sum(-1)

    @torch.no_grad()
    def policy_step(self, obs: Obs, action_mask: np.ndarray | None = None
                    ) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        """Sampled actions (agent scale), their log-probs and the state values, for collection."""
        mask = None if action_mask is None else torch.as_tensor(action_mask, dtype=torch.bool, device=self.device)
        actions, logp = self.sample_from(*self._dist_params(obs, mask))
        return actions, logp, self.value(obs)

    @torch.no_grad()
    def sample_from(self, p: torch.Tensor, log_std: torch.Tensor | None) -> tuple[np.ndarray, torch.Tensor]:
        """Actions sampled from distribution parameters [N, A] (this member's generator) and their log-probs."""
        if self.continuous:
            noise = torch.randn(p.shape, generator=self.torch_gen).to(p.device)
            actions = p + log_std.exp() * noise
        else:
            u = torch.rand(p.shape[0], 1, generator=self.torch_gen).to(p.device)
            cdf = torch.softmax(p, dim=1).cumsum(dim=1)
            actions = (u > cdf).sum(dim=1).clamp(max=self.action_dim - 1)
        logp, _ = self.log_prob_entropy_from(p, log_std, actions)
        return actions.cpu().numpy(), logp

    def explore_action(self, obs: Obs, action_mask: np.ndarray | None = None) -> np.ndarray:
        return self.policy_step(obs, action_mask)[0]

    @torch.no_grad()
    def greedy_action(self, obs: Obs, action_mask: np.ndarray | None = None) -> np.ndarray:
        mask = None if action_mask is None else torch.as_tensor(action_mask, dtype=torch.bool, device=self.device)
        p, _ = self._dist_params(obs, mask)
        return (p if self.continuous else p.argmax(dim=1)).cpu().numpy()

    # ---- population-batched learning ------------------------------------------------------------------
    def batch_key(self) -> tuple | None:
        if self.obs_norm is not None or not all(self.networks[n].plain_mlp for n in self.online_networks):
            return None
        hp = self.hp
        return self._group_key(self.continuous, hp.norm_adv, hp.clip_vloss, hp.max_grad_norm, hp.rollout_steps)

    def batch_refusal(self) -> str:
        return f"{self.name}: only plain-MLP actors and critics batch (no obs normalisation, no encoders)"

    @staticmethod
    def group(agents: list[PPO]):
        return PPOGroup(agents)

    # ---- learning -------------------------------------------------------------------------------------
    @staticmethod
    def rollout_rows(rollout: Rollout, steps: int, advantages: torch.Tensor, returns: torch.Tensor,
                     valid: torch.Tensor | None = None) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """What an update learns from: the first `steps` rows of `rollout` flattened, with their advantages
        and returns, only those where `valid` [T, N] is set (None: all)."""
        data = rollout.flat(steps)
        adv, ret = advantages[:steps].reshape(-1), returns[:steps].reshape(-1)
        if valid is not None:
            rows = valid[:steps].reshape(-1).nonzero().squeeze(1)
            data = {k: ({kk: vv.index_select(0, rows) for kk, vv in v.items()} if isinstance(v, dict)
                        else v.index_select(0, rows)) for k, v in data.items()}
            adv, ret = adv.index_select(0, rows), ret.index_select(0, rows)
        return data, adv, ret

    def learn_rollout(self, rollout: Rollout, steps: int, advantages: torch.Tensor, returns: torch.Tensor,
                      valid: torch.Tensor | None = None) -> dict[str, float]:
        """The PPO update on the first `steps` rows of `rollout` (only those where `valid`, [T, N], is set:
        a multi-agent rollout pads the steps of agents that are out of their episode); returns loss statistics."""
        hp = self.hp
        data, adv_all, ret_all = self.rollout_rows(rollout, steps, advantages, returns, valid)
        n = adv_all.shape[0]
        bounds = minibatch_bounds(n, hp.num_minibatches)
        stats = {"loss": 0.0, "approx_kl": 0.0, "updates": 0}
        for _ in range(hp.update_epochs):
            perm = torch.randperm(n, generator=self.torch_gen)
            stop = False
            for start, end in bounds:
                idx = perm[start: end]
                obs = {k: v.index_select(0, idx) for k, v in data["obs"].items()}
                mask = data["masks"].index_select(0, idx) if "masks" in data else None
                log_std = self.log_std.clone().requires_grad_(self.continuous)
                new_logp, entropy = self.log_prob_entropy(obs, data["actions"].index_select(0, idx), mask, log_std)
                old_logp = data["logprobs"].index_select(0, idx)
                adv = adv_all.index_select(0, idx)
                if hp.norm_adv and adv.numel() > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                v = self.value(obs)
                vloss = value_loss(v, ret_all.index_select(0, idx), data["values"].index_select(0, idx),
                                   hp.clip_coef if hp.clip_vloss else None)
                loss = ppo_loss(new_logp, old_logp, adv, hp.clip_coef) - hp.ent_coef * entropy.mean() \
                    + hp.vf_coef * vloss
                for opt in self.optimizers.values():
                    opt.zero_grad()
                loss.backward()
                for name, opt in self.optimizers.items():
                    if hp.max_grad_norm is not None:  # log_std is an actor parameter: clipped with it
                        opt.clip_grad_norm(hp.max_grad_norm, log_std.grad if name == "actor" and self.continuous
                                           else None)
                    opt.step()
                if self.continuous:  # Adam with the actor's learning rate
                    adam_update_(self.log_std, log_std.grad, self.log_std_adam, hp.lr)
                self.learn_steps += 1
                with torch.no_grad():
                    log_ratio = new_logp.detach() - old_logp
                    approx_kl = float(((log_ratio.exp() - 1) - log_ratio).mean())
                stats["loss"] += float(loss.detach())
                stats["approx_kl"] = approx_kl
                stats["updates"] += 1
                if hp.target_kl is not None and approx_kl > hp.target_kl:
                    stop = True
                    break
            if stop:
                break
        stats["loss"] /= max(stats["updates"], 1)
        return stats

    # ---- state ----------------------------------------------------------------------------------------
    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return {"log_std": self.log_std, "log_std_adam": self.log_std_adam} if self.continuous else {}

    def load_extra_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if "log_std" in tensors:
            self.log_std = tensors["log_std"].to(self.device).clone()
            self.log_std_adam = tensors["log_std_adam"].to(self.device).clone()
