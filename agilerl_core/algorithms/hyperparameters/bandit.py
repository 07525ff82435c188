"""Hyperparameters of the neural contextual bandits (NeuralUCB, NeuralTS and the epsilon-greedy baseline)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from agilerl_core.algorithms.hyperparameters.base import Hyperparameters
from agilerl_core.hpo.space import LEARNING_RATE, HyperparameterSpace, HyperparameterSpec

_LEARNING: HyperparameterSpace = {
    "lr": LEARNING_RATE,
    "batch_size": HyperparameterSpec(min=16, max=512, kind="int", grow=1.5, shrink=0.75),
    "learn_step": HyperparameterSpec(min=1, max=8, kind="int", grow=1.5, shrink=0.75),
}


class NeuralBanditHyperparameters(Hyperparameters):
    """What every neural bandit shares: a network scoring each (context, arm) pair, fitted by mean squared error
    to the rewards of past pulls drawn from the population's shared replay of pulls."""

    algorithm_name: ClassVar[str] = "neural_bandit"

    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    batch_size: int = Field(64, ge=1, description="Pulls per gradient step.")
    learn_step: int = Field(1, ge=1, description="Pulls per gradient step (a member's, counted over its envs).")
    learning_delay: int = Field(64, ge=0, description="Member pulls before the first gradient step.")
    buffer_size: int = Field(10_000, ge=1, description="Pulls the shared replay holds.")
    max_grad_norm: float | None = Field(None, gt=0, description="Clip the gradient norm (None: off).")
    arm_features: Literal["one_hot", "block"] = Field(
        "one_hot", description="The network's input for (context, arm): one_hot appends the arm's one-hot to the "
                               "context (D + K inputs); block puts the context in the arm's block of K x D zeros "
                               "(AgileRL's BanditEnv layout: K x D inputs, first-layer weights per arm).")


_LAMBDA = HyperparameterSpec(min=1e-3, max=100.0, kind="log", grow=1.5, shrink=1 / 1.5)
_SCALE = HyperparameterSpec(min=1e-3, max=10.0, kind="log", grow=1.5, shrink=1 / 1.5)


class _ConfidenceHyperparameters(NeuralBanditHyperparameters):
    """What NeuralUCB and NeuralTS share: the prior's precision lambda of the confidence width."""

    lamb: float = Field(1.0, gt=0, description="Regularisation lambda: Z starts at lambda (the prior's precision).")


class NeuralUCBHyperparameters(_ConfidenceHyperparameters):
    """NeuralUCB (Zhou, Li and Gu, 2020): pull argmax_a f(x, a) + gamma * sigma(x, a), where sigma^2 =
    lambda * sum_j g_j^2 / Z_j, g the gradient of f(x, a) for the network's parameters and Z = lambda + the sum
    of g^2 over past pulls (the covariance's diagonal)."""

    algorithm_name: ClassVar[str] = "neural_ucb"
    default_space: ClassVar[HyperparameterSpace] = {**_LEARNING, "gamma": _SCALE, "lamb": _LAMBDA}

    gamma: float = Field(1.0, ge=0, description="Exploration: the weight of the confidence bonus sigma.")


class NeuralTSHyperparameters(_ConfidenceHyperparameters):
    """NeuralTS (Zhang, Zhou, Liu and Gu, 2021): pull argmax_a of a sample from N(f(x, a), (nu * sigma(x, a))^2),
    sigma as NeuralUCB's."""

    algorithm_name: ClassVar[str] = "neural_ts"
    default_space: ClassVar[HyperparameterSpace] = {**_LEARNING, "nu": _SCALE, "lamb": _LAMBDA}

    nu: float = Field(0.1, ge=0, description="Exploration: the posterior's scale (the sample's std is nu * sigma). "
                                             "On digits, 0.1 against 1.0: the population's training regret "
                                             "4,150-4,380 against 27,700-29,800 for the same held-out reward.")


class NeuralEpsilonGreedyHyperparameters(NeuralBanditHyperparameters):
    """The baseline: the same network, pulling a uniformly random arm with probability epsilon, else the best."""

    algorithm_name: ClassVar[str] = "neural_eps_greedy"
    default_space: ClassVar[HyperparameterSpace] = {
        **_LEARNING, "epsilon": HyperparameterSpec(min=0.0, max=0.5, kind="float", grow=1.5, shrink=1 / 1.5)}

    epsilon: float = Field(0.1, ge=0, le=1, description="Probability of a uniformly random pull.")
