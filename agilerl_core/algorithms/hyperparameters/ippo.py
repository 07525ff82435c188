"""IPPO's hyperparameters: PPO's, and which agents share a policy."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from agilerl_core.algorithms.hyperparameters.ppo import PPOHyperparameters


class IPPOHyperparameters(PPOHyperparameters):
    """IPPO (de Witt et al. 2020): independent PPO learners, each on its agents' own observations."""

    algorithm_name: ClassVar[str] = "ippo"
    fixed_fields: ClassVar[frozenset[str]] = PPOHyperparameters.fixed_fields | {"share_policy"}

    noise_type: Literal["gaussian"] = Field("gaussian", description="The policy's noise on Box actions: gaussian "
                                                                    "(gsde is PPO's on single-agent envs only).")
    share_policy: Literal["agent", "group"] = Field("agent", description="One policy per agent, or one per group "
                                                                         "(agents named GROUP_N, identical spaces), "
                                                                         "trained on all its agents' experience.")


class MAPPOHyperparameters(IPPOHyperparameters):
    """MAPPO (Yu et al. 2022): IPPO's learners with a centralised critic on the team's joint observation."""

    algorithm_name: ClassVar[str] = "mappo"
