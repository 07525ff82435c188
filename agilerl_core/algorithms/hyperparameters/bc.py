"""Behaviour cloning's hyperparameters."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from agilerl_core.algorithms.hyperparameters.base import Hyperparameters
from agilerl_core.hpo.space import LEARNING_RATE, HyperparameterSpace, HyperparameterSpec


class BCHyperparameters(Hyperparameters):
    """Behaviour cloning: supervised regression of the dataset's actions (the offline baseline)."""

    algorithm_name: ClassVar[str] = "bc"
    default_space: ClassVar[HyperparameterSpace] = {
        "lr": LEARNING_RATE, "batch_size": HyperparameterSpec(min=32, max=1024, kind="int", grow=1.5, shrink=0.75)}

    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    batch_size: int = Field(256, ge=1, description="Transitions per gradient step.")
    max_grad_norm: float | None = Field(None, gt=0, description="Clip the gradient norm (None: off).")
