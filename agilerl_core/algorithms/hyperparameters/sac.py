"""SAC's hyperparameters."""

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
    SDEFields,
)
from agilerl_core.hpo.space import HyperparameterSpace


class SACHyperparameters(OffPolicyHyperparameters, ColoredNoiseFields, OUNoiseFields, SDEFields):
    """SAC (Haarnoja et al. 2018, "applications" version): twin critics, squashed Gaussian actor,
    automatic entropy tuning."""

    algorithm_name: ClassVar[str] = "sac"
    default_space: ClassVar[HyperparameterSpace] = ACTOR_CRITIC_SPACE
    wide_extra: ClassVar[HyperparameterSpace] = {"gamma": GAMMA, "tau": TAU}

    batch_size: int = Field(256, ge=1, description="Transitions per gradient step.")
    lr_actor: float = Field(3e-4, gt=0, description="Actor Adam learning rate.")
    lr_critic: float = Field(3e-4, gt=0, description="Critic Adam learning rate.")
    lr_alpha: float = Field(3e-4, gt=0, description="Temperature Adam learning rate.")
    init_alpha: float = Field(1.0, gt=0, description="Initial temperature.")
    auto_entropy: bool = Field(True, description="Tune the temperature towards target_entropy.")
    target_entropy: float | None = Field(None, description="Entropy target (None: -action_dim).")
    policy_freq: int = Field(1, ge=1, description="Critic updates per actor update.")
    random_steps: int = Field(0, ge=0, description="Member env steps of uniformly random actions at the start.")
    noise_type: Literal["gaussian", "pink", "ou", "gsde"] = Field(
        "gaussian", description="The noise exploration samples the policy with: gaussian (white, each step "
                                "independent), pink (colored 1/f^noise_beta sequences of noise_length steps, "
                                "Eberhard et al. 2023), ou (a unit-variance Ornstein-Uhlenbeck process, ou_theta "
                                "and ou_dt) or gsde (generalized state-dependent exploration, Raffin et al. 2022: "
                                "the noise a function of the actor's last hidden layer, its weights drawn anew "
                                "every sde_sample_freq steps and its scales learned, log_std_init). Learning "
                                "always samples white noise (gsde: from the state-dependent Gaussian).")
    log_std_init: float = Field(-3.0, ge=-20, le=2, description="gsde: the initial log scale of each hidden "
                                                                "unit's noise weights.")
