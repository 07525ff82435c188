"""The continuous-action off-policy members: DDPG and TD3 (Fujimoto, van Hoof & Meger, "Addressing Function
Approximation Error in Actor-Critic Methods", ICML 2018; DDPG: Lillicrap et al., ICLR 2016) and SAC (Haarnoja
et al., "Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905, 2018).

* TD3: clipped double Q (``twin_q``), target policy smoothing (``target_noise``, ``target_noise_clip``) and
  delayed policy updates (``policy_freq``: the actor and every target move once per ``policy_freq`` critic
  steps); a = tanh(actor(s)); exploration adds Gaussian or Ornstein-Uhlenbeck noise (reset per finished
  episode per sub-env) after ``random_steps`` of uniform random actions. DDPG is TD3 with the three off.
* SAC: twin critics with Polyak-averaged targets, a squashed Gaussian actor (a = tanh(u), u ~ N(mu(s),
  sigma(s))) and a learned temperature alpha = exp(log_alpha) that keeps the entropy near ``target_entropy``
  (default -dim(A)).

Actions are in the agent's scale, [-1, 1]^dim; :class:`agilerl_core.envs.spaces.ActionSpec` maps them to the
env's bounds. This module holds a member (networks, hyperparameters, acting, state); learning is written once
for a population in :mod:`agilerl_core.algorithms.actor_critic.group`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from agilerl_core.algorithms.actor_critic.group import ActorCriticGroup, SACGroup, TD3Group
from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.gsde import zero_scale_rows
from agilerl_core.algorithms.hyperparameters.sac import SACHyperparameters
from agilerl_core.algorithms.hyperparameters.td3 import DDPGHyperparameters, TD3Hyperparameters


class ContinuousActorCritic(RLAlgorithm):
    """Base of DDPG/TD3 and SAC: an actor, one or two Q(s, a) critics, their targets."""

    action_kinds: ClassVar[tuple[str, ...]] = ("box",)
    optimizer_lrs: ClassVar[dict[str, str]] = {"actor": "lr_actor", "critic_1": "lr_critic", "critic_2": "lr_critic"}
    noise_networks: ClassVar[tuple[str, ...]] = ("actor",)
    delayed_targets: ClassVar[bool] = True  # targets move only with the actor (TD3); False: every critic step
    group_class: ClassVar[type[ActorCriticGroup]]

    def network_io(self, name: str) -> tuple[int, int]:
        if name.startswith("critic"):
            return self.action_dim, 1
        return 0, self.actor_outputs()

    def actor_outputs(self) -> int:
        return self.action_dim

    @property
    def critics(self) -> list[str]:
        return [n for n in self.online_networks if n.startswith("critic")]

    # ---- population-batched learning ------------------------------------------------------------------
    def batch_key(self) -> tuple:
        """Members with equal keys learn as one group: the same network structure (widths may differ), the
        same critics and target schedule; rates, gamma, tau, noise and policy_freq are per member."""
        return self._group_key(self.online_networks, self.delayed_targets, self.hp.max_grad_norm,
                               self.obs_norm is not None, self.noise_key())

    def noise_key(self) -> tuple:
        """The exploration noise a group draws as one (colored sequences, gSDE's weights): one kind per group;
        Gaussian and Ornstein-Uhlenbeck members group together."""
        kind = getattr(self.hp, "noise_type", None)
        if kind == "pink":
            return (True, self.hp.noise_length)
        if kind == "gsde":
            return ("gsde", self.hp.sde_sample_freq)
        return (False, None)



class TD3(ContinuousActorCritic):
    """Twin Delayed DDPG."""

    name: ClassVar[str] = "td3"
    hp_model = TD3Hyperparameters
    group_class = TD3Group

    def __init__(self, obs_spec, action, arch, hp, seed, device="cpu") -> None:
        twin = hp.twin_q
        self.online_networks = ("actor", "critic_1", "critic_2") if twin else ("actor", "critic_1")
        self.target_networks = {f"{n}_target": n for n in self.online_networks}
        super().__init__(obs_spec, action, arch, hp, seed, device)


class DDPG(TD3):
    """DDPG: one critic, no target smoothing, actor updated every step (TD3 with its changes off)."""

    name: ClassVar[str] = "ddpg"
    hp_model = DDPGHyperparameters


class SAC(ContinuousActorCritic):
    """Soft actor-critic with twin critics and a learned temperature."""

    name: ClassVar[str] = "sac"
    hp_model = SACHyperparameters
    group_class = SACGroup
    online_networks = ("actor", "critic_1", "critic_2")
    target_networks: ClassVar[dict[str, str]] = {"critic_1_target": "critic_1", "critic_2_target": "critic_2"}
    delayed_targets: ClassVar[bool] = False  # the critics' targets move after every critic step

    def __init__(self, obs_spec, action, arch, hp, seed, device="cpu") -> None:
        super().__init__(obs_spec, action, arch, hp, seed, device)
        # the temperature and its Adam moments (one scalar: plain tensors, saved as extra state)
        self.log_alpha = torch.tensor(math.log(self.hp.init_alpha), device=self.device)
        self.alpha_adam = torch.zeros(3, device=self.device)  # m, v, step
        if self.gsde:
            if self.arch.rnn is not None or self.arch.mlp.noisy:
                raise ValueError("hyperparameters.noise_type: gsde reads a feed-forward actor's last hidden layer; "
                                 "use an arch without rnn and noisy layers, or another noise_type")
            zero_scale_rows(self.networks["actor"].mlp.out, self.action_dim)

    @property
    def gsde(self) -> bool:
        """Generalized state-dependent exploration (:mod:`agilerl_core.algorithms.gsde`): the actor's output rows
        after the mean hold its noise scales, not a log-std head."""
        return self.hp.noise_type == "gsde"

    def actor_outputs(self) -> int:
        return 2 * self.action_dim  # mean and log std

    @property
    def target_entropy(self) -> float:
        t = self.hp.target_entropy
        return -float(self.action_dim) if t is None else float(t)

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return {"log_alpha": self.log_alpha, "alpha_adam": self.alpha_adam}

    def load_extra_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if "log_alpha" in tensors:
            self.log_alpha = tensors["log_alpha"].to(self.device).clone()
            self.alpha_adam = tensors["alpha_adam"].to(self.device).clone()
