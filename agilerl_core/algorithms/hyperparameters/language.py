"""Hyperparameters of the language agents trained from game transcripts: behaviour cloning of the players'
guesses (``bc_lm``) and Implicit Language Q-Learning (``ilql``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from agilerl_core.algorithms.hyperparameters.base import BaseHyperparameters
from agilerl_core.hpo.space import LEARNING_RATE, HyperparameterSpace, HyperparameterSpec

# what ILQL evolves besides the learning rate and beta (whose ranges depend on the model), from scratch or on LoRA
ILQL_SPACE: HyperparameterSpace = {
    "expectile": HyperparameterSpec(min=0.5, max=0.95, kind="float", grow=1.05, shrink=0.95),
    "cql_weight": HyperparameterSpec(min=0.0, max=1.0, kind="float", grow=1.5, shrink=1 / 1.5),
    "tau": HyperparameterSpec(min=1e-3, max=0.5, kind="log", grow=1.5, shrink=1 / 1.5),
}


class LanguageHyperparameters(BaseHyperparameters):
    """What both language algorithms share: the optimiser and the minibatches of games."""

    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    batch_size: int = Field(64, ge=1, description="Games per gradient step.")
    max_grad_norm: float | None = Field(1.0, gt=0, description="Clip the gradient norm (None: off).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay (0: Adam).")


class BCLMHyperparameters(LanguageHyperparameters):
    """Behaviour cloning of the players' guesses: next-character cross-entropy on the guess characters only
    (the env's feedback is context, never a target)."""

    algorithm_name: ClassVar[str] = "bc_lm"
    default_space: ClassVar[HyperparameterSpace] = {"lr": LEARNING_RATE}


class ILQLHyperparameters(LanguageHyperparameters):
    """Implicit Language Q-Learning (Snell et al., 2022): Q and V heads on the language model's hidden states,
    V by expectile regression on the target Q, Q by TD to the next state's V, a conservative term and the
    language model's own cross-entropy; acting perturbs the language model's logits by beta * (Q - V)."""

    algorithm_name: ClassVar[str] = "ilql"
    default_space: ClassVar[HyperparameterSpace] = {
        "lr": LEARNING_RATE, **ILQL_SPACE,
        "beta": HyperparameterSpec(min=0.0, max=64.0, kind="float", grow=1.5, shrink=1 / 1.5),
    }

    gamma: float = Field(0.99, ge=0, le=1, description="Discount per generated character.")
    expectile: float = Field(0.7, gt=0, lt=1, description="V's expectile of the target Q (0.5: the mean; towards 1: "
                                                         "the best action's value within the data's support).")
    beta: float = Field(4.0, ge=0, description="Acting: the language model's logits plus beta * (Q - V) (0: behaviour "
                                               "cloning alone).")
    cql_weight: float = Field(0.1, ge=0, description="Weight of the conservative term (logsumexp of Q over the "
                                                     "characters minus Q of the data's character).")
    bc_weight: float = Field(1.0, ge=0, description="Weight of the language model's cross-entropy on the guesses.")
    tau: float = Field(0.05, gt=0, le=1, description="Soft update rate of the target Q heads per gradient step.")
    two_q: bool = Field(True, description="Two Q heads; targets and acting use their minimum (clipped double Q).")
