"""TD3's hyperparameters (DDPG's are TD3's with its tricks off)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from agilerl_core.algorithms.hyperparameters.base import (
    ACTOR_CRITIC_SPACE,
    GAMMA,
    TAU,
    ColoredNoiseFields,
    OffPolicyHyperparameters,
    OUNoiseFields,
)
from agilerl_core.hpo.space import HyperparameterSpace, HyperparameterSpec


class TD3Hyperparameters(OffPolicyHyperparameters, ColoredNoiseFields, OUNoiseFields):
    """TD3 (Fujimoto et al. 2018): clipped double Q, target policy smoothing, delayed actor updates."""

    algorithm_name: ClassVar[str] = "td3"
    default_space: ClassVar[HyperparameterSpace] = ACTOR_CRITIC_SPACE
    wide_extra: ClassVar[HyperparameterSpace] = {
        "gamma": GAMMA, "tau": TAU,
        "expl_noise": HyperparameterSpec(min=0.01, max=1.0, kind="log", grow=1.5, shrink=1 / 1.5),
        "target_noise": HyperparameterSpec(min=0.01, max=0.5, kind="log", grow=1.5, shrink=1 / 1.5),
    }

    batch_size: int = Field(256, ge=1, description="Transitions per gradient step.")
    lr_actor: float = Field(1e-3, gt=0, description="Actor Adam learning rate.")
    lr_critic: float = Field(1e-3, gt=0, description="Critic Adam learning rate.")
    twin_q: bool = Field(True, description="Clipped double Q: two critics, the target takes their minimum.")
    policy_freq: int = Field(2, ge=1, description="Critic updates per actor (and target) update.")
    target_noise: float = Field(0.2, ge=0, description="Target policy smoothing: noise std (0: off).")
    target_noise_clip: float = Field(0.5, ge=0, description="Target policy smoothing: noise clip.")
    expl_noise: float = Field(0.1, ge=0, description="Exploration noise scale (actions in [-1, 1]).")
    noise_type: Literal["gaussian", "ou", "pink"] = Field(
        "gaussian", description="Exploration noise process: gaussian (white, each step independent), ou "
                                "(Ornstein-Uhlenbeck, ou_theta and ou_dt) or pink (colored 1/f^noise_beta "
                                "sequences of noise_length steps, Eberhard et al. 2023); expl_noise scales each.")
    random_steps: int = Field(0, ge=0, description="Member env steps of uniformly random actions at the start.")


class DDPGHyperparameters(TD3Hyperparameters):
    """DDPG (Lillicrap et al. 2016): TD3 with its three tricks off."""

    algorithm_name: ClassVar[str] = "ddpg"

    twin_q: bool = Field(False, description="Clipped double Q: two critics, the target takes their minimum.")
    policy_freq: int = Field(1, ge=1, description="Critic updates per actor (and target) update.")
    target_noise: float = Field(0.0, ge=0, description="Target policy smoothing: noise std (0: off).")
