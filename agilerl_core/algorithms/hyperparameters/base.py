"""What every algorithm's hyperparameter model shares, and the mutation spaces several algorithms use.

Each algorithm's model lives beside it (``dqn_hp.py`` beside ``dqn.py``) and imports no torch, so the config
validates fast and never imports an algorithm."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agilerl_core.hpo.space import LEARNING_RATE, HyperparameterSpace, HyperparameterSpec

HP_TAG = "__algorithm__"  # the config's union of hyperparameter models is discriminated by this key

ACTOR_CRITIC_SPACE: HyperparameterSpace = {
    "lr_actor": LEARNING_RATE,
    "lr_critic": LEARNING_RATE,
    "batch_size": HyperparameterSpec(min=32, max=1024, kind="int", grow=1.5, shrink=0.75),
    "learn_step": HyperparameterSpec(min=1, max=16, kind="int", grow=1.5, shrink=0.75),
}


class BaseHyperparameters(BaseModel):
    """What every algorithm's hyperparameters share (RL agents and language models alike)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    algorithm_name: ClassVar[str]
    default_space: ClassVar[HyperparameterSpace] = {}  # the mutable ones, declared as data
    # structural: they size the shared buffer or the networks' outputs, so they never mutate
    fixed_fields: ClassVar[frozenset[str]] = frozenset({"buffer_size", "n_step", "num_atoms", "v_min", "v_max",
                                                        "rollout_steps", "obs_norm_clip"})

    @model_validator(mode="before")
    @classmethod
    def _drop_tag(cls, data: Any) -> Any:
        if isinstance(data, dict) and HP_TAG in data:
            data = {k: v for k, v in data.items() if k != HP_TAG}
        return data


class Hyperparameters(BaseHyperparameters):
    """What every RL algorithm's hyperparameters share."""

    normalize_obs: bool = Field(False, description="Normalise the observation vector by its running mean and "
                                "std (updated from training experience, saved in checkpoints).")
    obs_norm_clip: float = Field(10.0, gt=0, description="Clip normalised observations to [-clip, clip].")


class OffPolicyHyperparameters(Hyperparameters):
    """Replay-based learning: how much, how often, from how large a shared buffer."""

    batch_size: int = Field(128, ge=1, description="Transitions per gradient step.")
    learn_step: int = Field(1, ge=1, description="Env steps (transitions) per gradient step.")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    tau: float = Field(0.005, gt=0, le=1, description="Soft target update rate.")
    max_grad_norm: float | None = Field(None, gt=0, description="Clip each network's gradient norm (None: off).")
    learning_delay: int = Field(1_000, ge=0, description="Member env steps before the first gradient step.")
    buffer_size: int = Field(100_000, ge=1, description="Capacity of the shared replay buffer (transitions).")
