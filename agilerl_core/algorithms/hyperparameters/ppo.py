"""PPO's hyperparameters."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from agilerl_core.algorithms.hyperparameters.base import GAMMA, Hyperparameters, SDEFields
from agilerl_core.hpo.space import LEARNING_RATE, HyperparameterSpace, HyperparameterSpec


class PPOHyperparameters(Hyperparameters, SDEFields):
    """PPO (Schulman et al. 2017) with GAE (Schulman et al. 2016)."""

    algorithm_name: ClassVar[str] = "ppo"
    default_space: ClassVar[HyperparameterSpace] = {
        "lr": LEARNING_RATE,
        "clip_coef": HyperparameterSpec(min=0.05, max=0.4, kind="float", grow=1.2, shrink=0.8),
        "update_epochs": HyperparameterSpec(min=1, max=10, kind="int", grow=1.5, shrink=0.75),
    }
    wide_extra: ClassVar[HyperparameterSpace] = {
        "gamma": GAMMA,
        "gae_lambda": HyperparameterSpec(min=0.8, max=0.995, kind="discount", grow=1.5, shrink=1 / 1.5),
        "ent_coef": HyperparameterSpec(min=1e-8, max=0.1, kind="log", grow=2.0, shrink=0.5),
        "vf_coef": HyperparameterSpec(min=0.1, max=1.0, kind="float", grow=1.2, shrink=0.8),
        "num_minibatches": HyperparameterSpec(min=1, max=16, kind="int", grow=1.5, shrink=0.75),
    }

    lr: float = Field(3e-4, gt=0, description="Adam learning rate (actor and critic).")
    rollout_steps: int = Field(128, ge=1, description="Steps per env per rollout (a rollout is num_envs x this).")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    update_epochs: int = Field(4, ge=1, description="Passes over each rollout.")
    num_minibatches: int = Field(4, ge=1, description="Minibatches per pass.")
    clip_coef: float = Field(0.2, gt=0, description="Surrogate clipping range.")
    clip_vloss: bool = Field(False, description="Clip the value loss around the old values.")
    ent_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    vf_coef: float = Field(0.5, ge=0, description="Value loss coefficient.")
    max_grad_norm: float | None = Field(0.5, gt=0, description="Clip each network's gradient norm (None: off).")
    target_kl: float | None = Field(None, gt=0, description="Stop a rollout's epochs once the approx. KL exceeds this.")
    norm_adv: bool = Field(True, description="Normalise advantages per minibatch.")
    seq_len: int = Field(16, ge=1, description="Recurrent networks (network.rnn): steps per truncated-BPTT "
                                                "sequence; minibatches are sets of whole sequences.")
    log_std_init: float = Field(0.0, ge=-20, le=2, description="Continuous actions: initial log std of the Gaussian "
                                                             "policy (gsde: of each hidden unit's noise weights).")
    noise_type: Literal["gaussian", "gsde"] = Field(
        "gaussian", description="Continuous actions: the policy's noise, gaussian (a state-independent learned std) "
                                "or gsde (generalized state-dependent exploration, Raffin et al. 2022: a function of "
                                "the actor's last hidden layer, its weights drawn anew every sde_sample_freq steps, "
                                "its scales learned).")
