"""The hyperparameters of conservative Q-learning: CQN (discrete, on DQN) and CQL (continuous, on SAC)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from agilerl_core.algorithms.hyperparameters.base import ACTOR_CRITIC_SPACE
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters
from agilerl_core.algorithms.hyperparameters.sac import SACHyperparameters
from agilerl_core.hpo.space import LEARNING_RATE, HyperparameterSpace, HyperparameterSpec

CQL_ALPHA = HyperparameterSpec(min=0.05, max=20.0, kind="log", grow=1.5, shrink=1 / 1.5)
BATCH_SIZE = HyperparameterSpec(min=32, max=1024, kind="int", grow=1.5, shrink=0.75)


class CQNHyperparameters(DQNHyperparameters):
    """CQN: conservative Q-learning (Kumar et al. 2020, CQL(H)) on a double DQN, for discrete actions."""

    algorithm_name: ClassVar[str] = "cqn"
    default_space: ClassVar[HyperparameterSpace] = {"lr": LEARNING_RATE, "batch_size": BATCH_SIZE, "cql_alpha": CQL_ALPHA}
    fixed_fields: ClassVar[frozenset[str]] = DQNHyperparameters.fixed_fields

    cql_alpha: float = Field(1.0, ge=0, description="Weight of the conservative penalty "
                                                    "E[logsumexp_a Q(s, a) - Q(s, a_data)].")

    @model_validator(mode="after")
    def _q_values(self) -> CQNHyperparameters:
        for name in ("distributional", "per"):
            if getattr(self, name):
                raise ValueError(f"{name}: cqn's penalty is defined on Q-values learned from a fixed dataset; "
                                 f"set {name}: false")
        return self


class CQLHyperparameters(SACHyperparameters):
    """CQL on SAC (Kumar et al. 2020, CQL(H) with importance-sampled logsumexp) for continuous actions."""

    algorithm_name: ClassVar[str] = "cql"
    default_space: ClassVar[HyperparameterSpace] = {
        "lr_actor": ACTOR_CRITIC_SPACE["lr_actor"], "lr_critic": ACTOR_CRITIC_SPACE["lr_critic"],
        "batch_size": BATCH_SIZE, "cql_alpha": CQL_ALPHA}

    cql_alpha: float = Field(5.0, ge=0, description="Weight of the conservative penalty on each critic.")
    cql_n_actions: int = Field(10, ge=1, description="Sampled actions per state (uniform, and from the policy at "
                                                     "s and s') estimating logsumexp_a Q(s, a).")
