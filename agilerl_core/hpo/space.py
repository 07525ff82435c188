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
    kind: Literal["int", "float", "log", "discount"] = Field(
        "float",
        description="int: rounded after scaling; float: scaled by grow or shrink; "
        "log: scaled by a factor drawn log-uniformly from [shrink, grow]; discount (a value in [0, 1) such as "
        "gamma or GAE lambda): 1 - value scaled like log, so the horizon 1 / (1 - value) moves by that factor.",
    )
    grow: float = Field(1.2, gt=1.0, description="Factor applied when the value grows.")
    shrink: float = Field(0.8, gt=0.0, lt=1.0, description="Factor applied when the value shrinks.")

    @model_validator(mode="after")
    def _bounds(self) -> HyperparameterSpec:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        if self.kind == "log" and self.min <= 0:
            raise ValueError("a log-scaled hyperparameter needs min > 0")
        if self.kind == "discount" and not (self.min >= 0 and self.max < 1):
            raise ValueError("a discount hyperparameter needs 0 <= min and max < 1 (it scales 1 - value)")
        return self

    def mutate(self, value: float, rng: np.random.Generator) -> float:
        """Return a new value: value scaled up or down (50/50), clipped to [min, max]."""
        if self.kind in ("log", "discount"):
            factor = math.exp(rng.uniform(math.log(self.shrink), math.log(self.grow)))
        else:
            factor = self.grow if rng.random() < 0.5 else self.shrink
        return self._scaled(value, factor, step_ints=True)

    def spread(self, value: float, factor: float, rng: np.random.Generator) -> float:
        """`value` scaled by a factor drawn log-uniformly from [1 / factor, factor] (for a discount: 1 - value),
        clipped to the bounds: an initial member near the config's value."""
        return self._scaled(value, math.exp(rng.uniform(-math.log(factor), math.log(factor))), step_ints=False)

    def sample(self, rng: np.random.Generator) -> float:
        """A value drawn from the whole range: log-uniformly for log kinds and for ints from 1 up (batch sizes,
        epochs, steps: their mutations are multiplicative too), 1 - value log-uniformly for a discount, uniformly
        otherwise."""
        lo, hi = self.min, self.max
        if self.kind == "discount":
            return self._bounded(1.0 - math.exp(rng.uniform(math.log(max(1.0 - hi, 1e-12)), math.log(1.0 - lo))))
        if self.kind == "log" or (self.kind == "int" and lo >= 1):
            x = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        else:
            x = rng.uniform(lo, hi)
        return self._bounded(x)

    def _scaled(self, value: float, factor: float, step_ints: bool) -> float:
        if self.kind == "discount":
            return self._bounded(1.0 - (1.0 - value) * factor)
        new = self._bounded(value * factor)
        if self.kind == "int" and step_ints and new == round(value):
            # small ints would never move: step by one in the chosen direction
            new = self._bounded(round(value) + (1 if factor > 1 else -1))
        return new

    def _bounded(self, x: float) -> float:
        x = float(np.clip(x, self.min, self.max))
        if self.kind == "int":
            return int(np.clip(round(x), math.ceil(self.min), math.floor(self.max)))
        return x

    def widened_to(self, value: float) -> HyperparameterSpec | None:
        """This spec with its bounds stretched to hold `value` (a config's initial value outside an algorithm's
        default bounds); None where the kind cannot hold it (a log kind at zero or below, a discount at 1)."""
        if self.min <= value <= self.max:
            return self
        if (self.kind == "log" and value <= 0) or (self.kind == "discount" and not 0 <= value < 1):
            return None
        return self.model_copy(update={"min": min(self.min, value), "max": max(self.max, value)})


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


def initial_values(space: HyperparameterSpace, values: dict[str, float], method: str, spread: float,
                   rng: np.random.Generator) -> dict[str, float]:
    """One member's first hyperparameters (``hp_init``): `values` (the config's) as they are (``config``),
    each scaled around itself (``spread``) or drawn from its whole range (``sample``); names in sorted order,
    so a draw depends on the space, not on dict order."""
    if method == "config":
        return dict(values)
    if method not in ("spread", "sample"):
        raise ValueError(f"hp_init.method: {method!r} is not one of config, spread, sample")
    out = dict(values)
    for name in sorted(space):
        spec = space[name]
        out[name] = spec.sample(rng) if method == "sample" else spec.spread(float(values[name]), spread, rng)
    return out
