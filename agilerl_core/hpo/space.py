"""The mutable hyperparameter space, declared as data.

Each tunable hyperparameter is declared once (name, bounds, kind, grow/shrink factors); mutation code
is generic over these declarations. Algorithms ship defaults that an experiment config may override.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class HyperparameterSpec(BaseModel):
    """One mutable hyperparameter: its bounds and how a mutation moves it."""

    model_config = ConfigDict(extra="forbid")

    min: float = Field(description="Smallest value a mutation may produce.")
    max: float = Field(description="Largest value a mutation may produce.")
    kind: Literal["int", "float", "log"] = Field(
        "float",
        description="int: rounded after scaling; float: scaled by grow or shrink; "
        "log: scaled by a factor drawn log-uniformly from [shrink, grow].",
    )
    grow: float = Field(1.2, gt=1.0, description="Factor applied when the value grows.")
    shrink: float = Field(0.8, gt=0.0, lt=1.0, description="Factor applied when the value shrinks.")

    @model_validator(mode="after")
    def _bounds(self) -> HyperparameterSpec:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        if self.kind == "log" and self.min <= 0:
            raise ValueError("a log-scaled hyperparameter needs min > 0")
        return self

    def mutate(self, value: float, rng: np.random.Generator) -> float:
        """Return a new value: value scaled up or down (50/50), clipped to [min, max]."""
        if self.kind == "log":
            factor = math.exp(rng.uniform(math.log(self.shrink), math.log(self.grow)))
        else:
            factor = self.grow if rng.random() < 0.5 else self.shrink
        new = float(np.clip(value * factor, self.min, self.max))
        if self.kind == "int":
            new_int = round(new)
            if new_int == round(value):  # small ints would never move: step by one in the chosen direction
                new_int += 1 if factor > 1 else -1
            return int(np.clip(new_int, math.ceil(self.min), math.floor(self.max)))
        return new


HyperparameterSpace = dict[str, HyperparameterSpec]


# Every Adam learning rate of the shipped algorithms mutates on a log scale within these bounds.
LEARNING_RATE = HyperparameterSpec(min=1e-5, max=1e-2, kind="log", grow=1.5, shrink=1 / 1.5)


def merge_space(
    defaults: HyperparameterSpace, overrides: dict[str, HyperparameterSpec | dict | None]
) -> HyperparameterSpace:
    """Apply config overrides to an algorithm's default space (None removes an entry)."""
    space = dict(defaults)
    for name, override in overrides.items():
        if override is None:
            space.pop(name, None)
        elif isinstance(override, HyperparameterSpec):
            space[name] = override
        else:
            base = space[name].model_dump() if name in space else {}
            space[name] = HyperparameterSpec(**{**base, **override})
    return space
