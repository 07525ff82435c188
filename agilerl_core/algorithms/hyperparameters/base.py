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

# What the zoo's Optuna samplers search beside the rates, where a member can change it mid-run (hyperparameters
# the group reads per member: never one that sizes a buffer or a network, or one in the group's batch key).
# A discount moves its horizon 1 / (1 - value) by 1.5x either way per mutation; a config value outside these
# default bounds stretches them (or, where the kind cannot hold it, e.g. an entropy bonus of 0 on a log scale,
# leaves that one out): only bounds the config declares in hp_space refuse an initial value outside them.
GAMMA = HyperparameterSpec(min=0.9, max=0.9999, kind="discount", grow=1.5, shrink=1 / 1.5)
TAU = HyperparameterSpec(min=5e-4, max=0.1, kind="log", grow=1.5, shrink=1 / 1.5)


class BaseHyperparameters(BaseModel):
    """What every algorithm's hyperparameters share (RL agents and language models alike)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    algorithm_name: ClassVar[str]
    default_space: ClassVar[HyperparameterSpace] = {}  # the mutable ones, declared as data
    # what else a member can change mid-run, as wide as rl-zoo3's samplers search (``hp_space_preset: wide``)
    wide_extra: ClassVar[HyperparameterSpace] = {}
    # structural: they size the shared buffer or the networks' outputs, so they never mutate
    fixed_fields: ClassVar[frozenset[str]] = frozenset({"buffer_size", "n_step", "num_atoms", "v_min", "v_max",
                                                        "rollout_steps", "obs_norm_clip"})

    @classmethod
    def preset_space(cls, preset: str = "default") -> HyperparameterSpace:
        """The mutable space a config starts from: ``default`` (the rates and batch sizes) or ``wide`` (also
        :attr:`wide_extra`: discounts, target rates, exploration schedules and noise, loss coefficients)."""
        if preset not in ("default", "wide"):
            raise ValueError(f"hp_space_preset: {preset!r} is not default or wide")
        return {**cls.default_space, **cls.wide_extra} if preset == "wide" else dict(cls.default_space)

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


class ColoredNoiseFields(BaseModel):
    """The shape of colored (``noise_type: pink``) exploration noise, shared by the actor-critic algorithms."""

    noise_beta: float = Field(1.0, ge=0, le=3, description="pink: the spectrum's exponent (0 white, 1 pink, 2 "
                                                           "red/Brownian).")
    noise_length: int = Field(1000, ge=2, le=100_000, description="pink: steps per noise sequence (about an "
                                                                  "episode); a new one is drawn after it.")


class OUNoiseFields(BaseModel):
    """The Ornstein-Uhlenbeck exploration process (``noise_type: ou``), shared by the actor-critic algorithms."""

    ou_theta: float = Field(0.15, gt=0, description="Ornstein-Uhlenbeck mean reversion.")
    ou_dt: float = Field(1e-2, gt=0, description="Ornstein-Uhlenbeck time step.")


class SDEFields(BaseModel):
    """Generalized state-dependent exploration's rhythm (``noise_type: gsde``), shared by SAC and PPO."""

    sde_sample_freq: int = Field(16, ge=1, le=100_000, description="gsde: env steps between draws of the noise "
                                                                   "weights (the noise is smooth in the state "
                                                                   "between them).")
