"""Mutations of a population member, drawn with given probabilities from a seeded generator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from agilerl_core.hpo.evolvable import MUTATION_KINDS, Evolvable, MutationSettings
from agilerl_core.hpo.space import HyperparameterSpace


class Mutations:
    """Chooses and applies one mutation per member.

    Kinds and their relative weights: none, architecture (layer vs node share), parameter noise (a
    Gaussian with std `parameter_strength` times each weight tensor's std), activation, a hyperparameter
    from the declared space, and an LLM member's adapter rank. A member is only offered the kinds it supports (the weights
    of the others are dropped before normalising).
    """

    def __init__(self, weights: dict[str, float], new_layer_share: float, parameter_strength: float,
                 space: HyperparameterSpace, bounds: Any, resample: float = 0.0) -> None:
        self.weights = np.array([float(weights.get(k, 0.0)) for k in MUTATION_KINDS])
        if self.weights.sum() <= 0:
            raise ValueError("at least one mutation weight must be positive")
        self.probs = self.weights / self.weights.sum()
        self.settings = MutationSettings(new_layer_share, parameter_strength, bounds)
        self.space = dict(space)
        self.resample = float(resample)  # share of hyperparameter mutations drawn afresh from the whole range

    @classmethod
    def from_config(cls, mut, space: HyperparameterSpace, bounds: Any) -> Mutations:
        weights = {"none": mut.no_mutation, **{k: getattr(mut, k, 0.0) for k in MUTATION_KINDS if k != "none"}}
        return cls(weights, getattr(mut, "new_layer_share", 0.0), getattr(mut, "parameter_strength", 0.0), space,
                   bounds, getattr(mut, "hp_resample", 0.0))

    def _probs(self, supported: frozenset[str]) -> np.ndarray:
        if supported.issuperset(MUTATION_KINDS):
            return self.probs
        w = self.weights * np.array([k == "none" or k in supported for k in MUTATION_KINDS])
        return w / w.sum() if w.sum() > 0 else np.array([k == "none" for k in MUTATION_KINDS], dtype=float)

    def choose(self, rng: np.random.Generator, supported: frozenset[str] = frozenset(MUTATION_KINDS)) -> str:
        return MUTATION_KINDS[int(rng.choice(len(MUTATION_KINDS), p=self._probs(supported)))]

    def mutate(self, member: Evolvable, rng: np.random.Generator) -> str:
        """Apply one randomly chosen mutation to `member` in place; return what was done."""
        return self.mutate_with(member, rng)[0]

    def mutate_with(self, member: Evolvable, rng: np.random.Generator,
                    partner: Callable[[], tuple[int, Evolvable]] | None = None) -> tuple[str, int | None]:
        """:meth:`mutate`, where a crossover draws its second parent from `partner()` ((member id, member)):
        (what was done, the second parent's id or None)."""
        kind = self.choose(rng, member.mutation_kinds)
        if kind == "none":
            return "none", None
        if kind == "rl_hp":
            return self.rl_hp(member, rng), None
        if kind == "adapter_crossover":
            if partner is None:
                return "none(no second parent)", None
            other_id, other = partner()
            return f"{member.crossover(other, rng)} x{other_id}", other_id
        return member.mutate(kind, rng, self.settings), None

    def rl_hp(self, member: Evolvable, rng: np.random.Generator) -> str:
        if not self.space:
            return "none(empty hp space)"
        names = sorted(self.space)
        name = names[int(rng.integers(len(names)))]
        old = getattr(member.hp, name)
        # drawn only when resampling is on, so a run without it draws exactly as before
        if self.resample > 0 and rng.random() < self.resample:
            new, how = self.space[name].sample(rng), "~"
        else:
            new, how = self.space[name].mutate(float(old), rng), "="
        member.set_hyperparameter(name, new)
        return f"hp:{name}{how}{new:.6g}"
