"""TD3: Fujimoto, van Hoof & Meger, "Addressing Function Approximation Error in Actor-Critic Methods",
ICML 2018; and DDPG (Lillicrap et al., ICLR 2016) as TD3 with its three changes switched off.

* clipped double Q (``twin_q``): two critics, the target bootstraps from the smaller estimate;
* target policy smoothing (``target_noise``, ``target_noise_clip``): clipped Gaussian noise on the
  target action;
* delayed policy updates (``policy_freq``): the actor and every target move once per
  ``policy_freq`` critic updates.

The actor is deterministic, a = tanh(actor(s)) in [-1, 1]^dim. Exploration adds Gaussian or
Ornstein-Uhlenbeck noise (reset per finished episode per sub-env), after ``random_steps`` of uniform
random actions.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from agilerl_core.algorithms.actor_critic import ContinuousActorCritic, GaussianNoise, OUNoise
from agilerl_core.algorithms.td3_hp import DDPGHyperparameters, TD3Hyperparameters
from agilerl_core.buffers.replay import Transition, n_step_return
from agilerl_core.envs.spaces import Obs


class TD3(ContinuousActorCritic):
    """Twin Delayed DDPG."""

    name: ClassVar[str] = "td3"
    hp_model = TD3Hyperparameters

    def __init__(self, obs_spec, action, arch, hp, seed, device="cpu") -> None:
        twin = hp.twin_q
        self.online_networks = ("actor", "critic_1", "critic_2") if twin else ("actor", "critic_1")
        self.target_networks = {f"{n}_target": n for n in self.online_networks}
        self._noise: GaussianNoise | OUNoise | None = None
        super().__init__(obs_spec, action, arch, hp, seed, device)

    # ---- acting ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def policy(self, obs: Obs, target: bool = False) -> torch.Tensor:
        return torch.tanh(self.networks["actor_target" if target else "actor"](obs))

    def greedy_action(self, obs: Obs, action_mask: np.ndarray | None = None) -> np.ndarray:
        return self.policy(obs).cpu().numpy()

    def begin_rollout(self, num_envs: int) -> None:
        cls = OUNoise if self.hp.noise_type == "ou" else GaussianNoise
        self._noise = cls(num_envs, self.action_dim)

    def episodes_done(self, done: np.ndarray) -> None:
        if self._noise is not None and done.any():
            self._noise.reset(done)

    def explore_action(self, obs: Obs, action_mask: np.ndarray | None = None) -> np.ndarray:
        n = next(iter(obs.values())).shape[0]
        return self.explore_from(None if self.in_warmup() else self.greedy_action(obs), n)

    def explore_from(self, greedy: np.ndarray | None, n: int) -> np.ndarray:
        """Exploration actions for `n` envs: the policy's `greedy` actions plus noise, or uniform random
        ones during warm-up (when `greedy` is not needed)."""
        if self.in_warmup():
            return self.random_actions(n)
        if self._noise is None or self._noise_shape() != (n, self.action_dim):
            self.begin_rollout(n)
        hp = self.hp
        noise = self._noise.sample(self.np_rng, hp.expl_noise, hp.ou_theta, hp.ou_dt)
        return np.clip(greedy + noise, -1.0, 1.0).astype(np.float32)

    # ---- population-batched learning ------------------------------------------------------------------
    def batch_key(self) -> tuple | None:
        if self.obs_norm is not None or not all(self.networks[n].plain_mlp for n in self.online_networks):
            return None
        return self._group_key(self.online_networks, self.delayed_targets, self.hp.max_grad_norm)

    def batch_refusal(self) -> str:
        return f"{self.name}: only plain-MLP actors and critics batch (no obs normalisation, no encoders)"

    @staticmethod
    def group(agents: list[TD3]):
        from agilerl_core.algorithms.td3_group import TD3Group  # it builds on this module

        return TD3Group(agents)

    def _noise_shape(self) -> tuple[int, int]:
        return self._noise.x.shape if isinstance(self._noise, OUNoise) else self._noise.shape

    # ---- loss maths -----------------------------------------------------------------------------------
    @torch.no_grad()
    def target(self, batch: Transition, smoothing_noise: torch.Tensor | None = None) -> torch.Tensor:
        """y = r + discount * (1 - terminated) * min_i Q_i'(s', clip(mu'(s') + clip(noise, -c, c), -1, 1)).

        `smoothing_noise` (standard normal, shape [B, dim]) is drawn from the agent's generator when
        not given; it is scaled by target_noise. With twin_q off the minimum is over one critic.
        """
        hp = self.hp
        next_a = self.policy(batch.next_obs, target=True)
        if hp.target_noise > 0:
            if smoothing_noise is None:
                smoothing_noise = torch.randn(next_a.shape, generator=self.torch_gen).to(next_a.device)
            eps = (smoothing_noise * hp.target_noise).clamp(-hp.target_noise_clip, hp.target_noise_clip)
            next_a = (next_a + eps).clamp(-1.0, 1.0)
        q_next = torch.stack([self.q(f"{c}_target", batch.next_obs, next_a) for c in self.critics]).min(0).values
        reward, discount = n_step_return(batch, hp.gamma)
        return reward + discount * (1.0 - batch.terminated) * q_next

    def actor_loss(self, batch: Transition) -> torch.Tensor:
        """-Q_1(s, mu(s)), averaged (the deterministic policy gradient)."""
        return -self.q("critic_1", batch.obs, torch.tanh(self.networks["actor"](batch.obs))).mean()

    def actor_objective(self, batch: Transition) -> torch.Tensor:
        return self.actor_loss(batch)


class DDPG(TD3):
    """DDPG: one critic, no target smoothing, actor updated every step (TD3 with its changes off)."""

    name: ClassVar[str] = "ddpg"
    hp_model = DDPGHyperparameters
