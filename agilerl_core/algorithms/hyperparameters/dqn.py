"""DQN's hyperparameters (Rainbow's are DQN's with its components on)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from agilerl_core.algorithms.hyperparameters.base import GAMMA, TAU, OffPolicyHyperparameters
from agilerl_core.hpo.space import LEARNING_RATE, HyperparameterSpace, HyperparameterSpec


class DQNHyperparameters(OffPolicyHyperparameters):
    """DQN (Mnih et al. 2015; double Q: van Hasselt et al. 2016) and each Rainbow component (Hessel et al.
    2018), every one usable alone."""

    algorithm_name: ClassVar[str] = "dqn"
    default_space: ClassVar[HyperparameterSpace] = {
        "lr": LEARNING_RATE,
        "batch_size": HyperparameterSpec(min=32, max=512, kind="int", grow=1.5, shrink=0.75),
        "learn_step": HyperparameterSpec(min=1, max=16, kind="int", grow=1.5, shrink=0.75),
    }
    wide_extra: ClassVar[HyperparameterSpace] = {
        "gamma": GAMMA,
        "tau": TAU,
        "eps_end": HyperparameterSpec(min=1e-3, max=0.2, kind="log", grow=1.5, shrink=1 / 1.5),
        "eps_decay_steps": HyperparameterSpec(min=1_000, max=200_000, kind="int", grow=1.5, shrink=0.75),
    }

    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    hard_update_every: int | None = Field(None, ge=1, description="Copy online -> target every N gradient steps "
                                                                  "(None: soft updates with tau).")
    double: bool = Field(True, description="Double Q-learning target.")
    loss: Literal["mse", "huber"] = Field("mse", description="TD loss (ignored when distributional).")
    eps_start: float = Field(1.0, ge=0, le=1, description="Initial exploration rate.")
    eps_end: float = Field(0.05, ge=0, le=1, description="Final exploration rate.")
    eps_decay_steps: int = Field(10_000, ge=1, description="Member env steps over which epsilon decays linearly.")
    n_step: int = Field(1, ge=1, description="n-step returns (1: one-step TD).")
    per: bool = Field(False, description="Prioritised experience replay (Schaul et al. 2016).")
    per_alpha: float = Field(0.6, ge=0, le=1, description="PER: priority exponent.")
    per_beta: float = Field(0.4, ge=0, le=1, description="PER: initial importance-weight exponent.")
    per_beta_steps: int = Field(100_000, ge=1, description="PER: member env steps over which beta anneals to 1.")
    per_eps: float = Field(1e-6, gt=0, description="PER: added to every priority.")
    noisy: bool = Field(False, description="Noisy linear layers for exploration (Fortunato et al. 2018).")
    noisy_std: float = Field(0.5, gt=0, description="Noisy layers: initial sigma scale.")
    dueling: bool = Field(False, description="Dueling value/advantage heads (Wang et al. 2016).")
    distributional: bool = Field(False, description="C51 distributional Q (Bellemare et al. 2017).")
    num_atoms: int = Field(51, ge=2, description="C51: atoms of the return distribution.")
    v_min: float = Field(-10.0, description="C51: smallest return atom.")
    v_max: float = Field(10.0, description="C51: largest return atom.")

    @model_validator(mode="after")
    def _support(self) -> DQNHyperparameters:
        if self.distributional and self.v_min >= self.v_max:
            raise ValueError(f"v_min ({self.v_min}) must be below v_max ({self.v_max})")
        return self


class RainbowHyperparameters(DQNHyperparameters):
    """Rainbow DQN: DQN with n-step returns, PER, noisy nets, dueling heads and C51 on."""

    algorithm_name: ClassVar[str] = "rainbow"

    n_step: int = Field(3, ge=1, description="n-step returns (1: one-step TD).")
    per: bool = Field(True, description="Prioritised experience replay (Schaul et al. 2016).")
    noisy: bool = Field(True, description="Noisy linear layers for exploration (Fortunato et al. 2018).")
    dueling: bool = Field(True, description="Dueling value/advantage heads (Wang et al. 2016).")
    distributional: bool = Field(True, description="C51 distributional Q (Bellemare et al. 2017).")
    eps_start: float = Field(0.0, ge=0, le=1, description="Initial exploration rate (noisy nets explore).")
    eps_end: float = Field(0.0, ge=0, le=1, description="Final exploration rate.")
