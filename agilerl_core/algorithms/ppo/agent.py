"""PPO: Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347 (2017), with GAE.

Discrete actions: a categorical policy over the actor's logits (action masks respected). Box actions:
a Gaussian over the actor's means with a state-independent log std (agent scale; the env receives
the sample clipped to [-1, 1] and scaled to its bounds). A separate critic estimates V(s); both
share the agent's architecture, so one mutation changes them together.

Per rollout: GAE advantages, then ``update_epochs`` passes of shuffled minibatches of the clipped
surrogate (:func:`~agilerl_core.algorithms.ppo.maths.ppo_loss`), optional value clipping, entropy bonus,
per-minibatch advantage normalisation, and an early stop once the approximate KL exceeds ``target_kl``.

This module holds a member: its networks and state. Acting and learning are written once for a population in
:mod:`agilerl_core.algorithms.ppo.group`; a member alone is a group of one.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.gsde import zero_scale_rows
from agilerl_core.algorithms.hyperparameters.ppo import PPOHyperparameters
from agilerl_core.algorithms.ppo.group import PPOGroup
from agilerl_core.envs.spaces import ObsSpec


class PPO(RLAlgorithm):
    """Proximal policy optimisation with an actor and a critic network."""

    name: ClassVar[str] = "ppo"
    hp_model = PPOHyperparameters
    action_kinds: ClassVar[tuple[str, ...]] = ("discrete", "box")
    uses_replay: ClassVar[bool] = False
    online_networks = ("actor", "critic")
    target_networks: ClassVar[dict[str, str]] = {}
    noise_networks: ClassVar[tuple[str, ...]] = ("actor",)
    group_class = PPOGroup

    def __init__(self, obs_spec, action, arch, hp, seed, device="cpu", critic_obs_spec: ObsSpec | None = None) -> None:
        # a centralised critic (MAPPO) reads other observations than the actor: the team's joint observation
        self.critic_obs_spec = critic_obs_spec
        super().__init__(obs_spec, action, arch, hp, seed, device)
        self.continuous = not self.action_spec.discrete
        if self.gsde:
            if self.recurrent:
                raise ValueError("hyperparameters.noise_type: gsde reads a feed-forward actor's last hidden layer; "
                                 "drop network.rnn or use noise_type gaussian")
            zero_scale_rows(self.networks["actor"].mlp.out, self.action_dim)
        # Gaussian log std (Box actions): a plain tensor with its own Adam moments, saved as extra state
        self.log_std = torch.full((self.action_dim,), float(self.hp.log_std_init), device=self.device)
        self.log_std_adam = torch.zeros(2 * self.action_dim + 1, device=self.device)  # m, v, step

    @property
    def gsde(self) -> bool:
        """Generalized state-dependent exploration on Box actions (:mod:`agilerl_core.algorithms.gsde`): the
        actor's output rows after the means hold its noise scales; discrete actions ignore noise_type."""
        return self.hp.noise_type == "gsde" and not self.action_spec.discrete

    @property
    def recurrent(self) -> bool:
        """Whether the networks have a recurrent core (network.rnn)."""
        return self.arch.rnn is not None

    def network_io(self, name: str) -> tuple[int, int]:
        if name != "critic":
            return 0, 2 * self.action_dim if self.gsde else self.action_dim
        return (0 if self.critic_obs_spec is None else self.critic_obs_spec.vector_dim - self.obs_spec.vector_dim), 1

    def network_obs_spec(self, name: str) -> ObsSpec:
        return self.critic_obs_spec if name == "critic" and self.critic_obs_spec is not None else self.obs_spec

    def init_kwargs(self) -> dict:
        return {} if self.critic_obs_spec is None else {"critic_obs_spec": self.critic_obs_spec}

    # ---- population-batched learning ------------------------------------------------------------------
    def batch_key(self) -> tuple:
        """Members with equal keys learn as one group: the same network structure (hidden widths may differ),
        action kind, advantage normalisation, value clipping, gradient clipping and rollout length; rates,
        coefficients, epochs, minibatches and KL targets are per member."""
        hp = self.hp
        return self._group_key(self.continuous, hp.norm_adv, hp.clip_vloss, hp.max_grad_norm, hp.rollout_steps,
                               self.obs_norm is not None, hp.seq_len if self.recurrent else None,
                               None if self.critic_obs_spec is None else self.critic_obs_spec.vector_dim,
                               hp.sde_sample_freq if self.gsde else None)

    # ---- state ----------------------------------------------------------------------------------------
    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return {"log_std": self.log_std, "log_std_adam": self.log_std_adam} if self.continuous else {}

    def load_extra_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if "log_std" in tensors:
            self.log_std = tensors["log_std"].to(self.device).clone()
            self.log_std_adam = tensors["log_std_adam"].to(self.device).clone()

