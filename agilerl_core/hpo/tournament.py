"""Tournament selection with elitism, no selection (evolution off), and the plan every selection hands the
population."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Placement:
    """Where one slot of the next generation comes from: a copy of the member in slot `parent`, and what is done
    to it. `action`: ``elite`` and ``kept`` (carried on unchanged), ``mutate`` (one mutation), ``migrant`` (a
    whole member from another subpopulation) or ``migrant_weights`` (its weights, with the hyperparameters of the
    member in slot `hp_from`)."""

    parent: int
    action: str
    hp_from: int | None = None


def ranked(fitnesses: list[float]) -> np.ndarray:
    """Fitnesses as selection compares them: a NaN or infinite fitness counts as -inf (never wins)."""
    f = np.asarray(fitnesses, dtype=np.float64)
    return np.where(np.isfinite(f), f, -np.inf)


def elite_index(fitnesses: list[float]) -> int:
    """Index of the fittest member (the first one on ties; NaN or inf counts as worst)."""
    return int(np.argmax(ranked(fitnesses)))


class TournamentSelection:
    """Pick parents by tournaments of `size` members; with elitism the best is always slot 0."""

    def __init__(self, size: int = 2, elitism: bool = True) -> None:
        if size < 1:
            raise ValueError("tournament size must be >= 1")
        self.size = size
        self.elitism = elitism

    def select(self, fitnesses: list[float], rng: np.random.Generator) -> list[int]:
        """Parent index for every slot of the next population (same size as `fitnesses`)."""
        n = len(fitnesses)
        f = ranked(fitnesses)
        parents = [elite_index(fitnesses)] if self.elitism else []
        k = min(self.size, n)
        while len(parents) < n:
            entrants = rng.choice(n, size=k, replace=False)
            parents.append(int(entrants[np.argmax(f[entrants])]))
        return parents

    def plan(self, fitnesses: list[float], generation: int, rng: np.random.Generator) -> list[Placement]:
        """Every slot's parent (:meth:`select`): slot 0 the elite kept unchanged (with elitism), every other one
        mutated."""
        parents = self.select(fitnesses, rng)
        return [Placement(p, "elite" if slot == 0 and self.elitism else "mutate") for slot, p in enumerate(parents)]

    def second_parent(self, fitnesses: list[float], first: int, rng: np.random.Generator) -> int:
        """A crossover's other parent: the winner of a tournament among the members other than `first` (`first`
        itself when it is alone)."""
        others = np.array([i for i in range(len(fitnesses)) if i != first])
        if not len(others):
            return first
        f = ranked(fitnesses)
        entrants = rng.choice(others, size=min(self.size, len(others)), replace=False)
        return int(entrants[np.argmax(f[entrants])])


class NoSelection:
    """Evolution off (``selection: {method: none}``): every slot carries its own member on unchanged, never
    mutated, crossed or replaced, so the population is K independent learners (still sharing their experience
    as every population does); what a run with selection gains over it is what evolution adds."""

    elitism = False  # no slot is reserved for the best: every member stays in its own slot

    def plan(self, fitnesses: list[float], generation: int, rng: np.random.Generator) -> list[Placement]:
        """Every slot from itself, kept as it is."""
        return [Placement(slot, "kept") for slot in range(len(fitnesses))]

    def second_parent(self, fitnesses: list[float], first: int, rng: np.random.Generator) -> int:
        """No crossover partner: nothing is mutated."""
        return first


class EveryNth:
    """A selection that evolves after every `every`-th evaluation only (``selection.every``): in between, every
    slot carries its own member on, so the population is judged more often than it is selected (an off-policy
    run's first evaluation comes after a short generation, not a long one) while selection sees as many steps
    of learning between evolutions as before."""

    def __init__(self, inner: TournamentSelection | NoSelection, every: int) -> None:
        if every < 1:
            raise ValueError("selection.every must be >= 1")
        self.inner, self.every = inner, every
        self.elitism = inner.elitism

    def evolves_after(self, generation: int) -> bool:
        """Whether the evolution after generation `generation`'s evaluation selects and mutates."""
        return (generation + 1) % self.every == 0

    def plan(self, fitnesses: list[float], generation: int, rng: np.random.Generator) -> list[Placement]:
        if not self.evolves_after(generation):
            return NoSelection().plan(fitnesses, generation, rng)
        return self.inner.plan(fitnesses, generation, rng)

    def second_parent(self, fitnesses: list[float], first: int, rng: np.random.Generator) -> int:
        return self.inner.second_parent(fitnesses, first, rng)
