"""MADDPG's and MATD3's hyperparameters."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from agilerl_core.algorithms.hyperparameters.base import ACTOR_CRITIC_SPACE, OffPolicyHyperparameters, OUNoiseFields
from agilerl_core.hpo.space import HyperparameterSpace


class MADDPGHyperparameters(OffPolicyHyperparameters, OUNoiseFields):
    """MADDPG (Lowe et al. 2017): a deterministic actor per agent on its own observation, a centralised
    critic per agent on every agent's observation and action."""

    algorithm_name: ClassVar[str] = "maddpg"
    default_space: ClassVar[HyperparameterSpace] = ACTOR_CRITIC_SPACE
    fixed_fields: ClassVar[frozenset[str]] = OffPolicyHyperparameters.fixed_fields | {"share_policy"}

    batch_size: int = Field(128, ge=1, description="Transitions (vector rows of all agents) per gradient step.")
    learn_step: int = Field(16, ge=1, description="Env steps (of all agents) per gradient step.")
    gamma: float = Field(0.95, ge=0, le=1, description="Discount factor.")
    tau: float = Field(0.01, gt=0, le=1, description="Soft target update rate.")
    lr_actor: float = Field(1e-3, gt=0, description="Actors' Adam learning rate.")
    lr_critic: float = Field(1e-3, gt=0, description="Critics' Adam learning rate.")
    learning_delay: int = Field(1_000, ge=0, description="Member env steps before the first gradient step.")
    twin_q: bool = Field(False, description="Two critics per agent, the target takes their minimum (MATD3).")
    policy_freq: int = Field(1, ge=1, description="Critic updates per actor (and target) update.")
    target_noise: float = Field(0.0, ge=0, description="Target policy smoothing noise std on Box actions (0: off).")
    target_noise_clip: float = Field(0.5, ge=0, description="Target policy smoothing: noise clip.")
    expl_noise: float = Field(0.1, ge=0, description="Exploration noise scale on Box actions (agent scale [-1, 1]).")
    noise_type: Literal["gaussian", "ou"] = Field("gaussian", description="Exploration noise process (Box actions).")
    gumbel_temperature: float = Field(1.0, gt=0, description="Gumbel-softmax temperature of Discrete actions.")
    share_policy: Literal["agent", "group"] = Field("agent", description="One actor per agent, or one per group "
                                                                         "(agents named GROUP_N, identical spaces) "
                                                                         "acting for each of them and trained on all "
                                                                         "their rows; critics stay one per agent.")


class MATD3Hyperparameters(MADDPGHyperparameters):
    """MATD3 (Ackermann et al. 2019): MADDPG with TD3's twin critics, delayed actors and target smoothing."""

    algorithm_name: ClassVar[str] = "matd3"

    twin_q: bool = Field(True, description="Two critics per agent, the target takes their minimum.")
    policy_freq: int = Field(2, ge=1, description="Critic updates per actor (and target) update.")
    target_noise: float = Field(0.2, ge=0, description="Target policy smoothing noise std on Box actions (0: off).")
