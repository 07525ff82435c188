"""Multi-frequency selection: the population split into subpopulations that evolve at different rhythms (MF-PBT,
Doulazmi et al. 2025).

One evolution rhythm is greedy: a population that evolves after every evaluation copies whatever scores best in
the short run, and can lose a schedule that only pays later. Here subpopulation ``i`` evolves only after every
``periods[i]``-th evaluation; between its evolutions its members keep training as they are.

When a subpopulation evolves, its members are ranked by this generation's fitness into four brackets:

- **winners** (the top ``winners`` share, rounded, at least one) and **survivors** (the middle) carry on unchanged;
- **open for migration** (the ``migration`` share just above the losers): each takes the strongest member of the
  other subpopulations when that member scored higher than it. Migration is asymmetric: a migrant from a faster
  subpopulation (a shorter period) brings only its weights and takes the hyperparameters of the receiving
  subpopulation's best member, so a slow subpopulation never inherits a schedule tuned to the short run; a migrant
  from a slower or equally fast one is cloned whole;
- **losers** (the bottom ``losers`` share, at least one in a subpopulation of two or more) are replaced by a clone
  of one of the winners (drawn uniformly), which is then mutated.

Every draw comes from the population's generator; with one subpopulation of period 1 this is truncation selection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agilerl_core.hpo.tournament import Placement, ranked


@dataclass(frozen=True)
class Brackets:
    """The slots of one subpopulation by bracket, best first within each."""

    winners: list[int]
    survivors: list[int]
    migration: list[int]
    losers: list[int]


def subpopulations(n: int, count: int) -> list[list[int]]:
    """Slots 0..n-1 split into `count` contiguous subpopulations as equal as they can be (the first ones larger)."""
    return [part.tolist() for part in np.array_split(np.arange(n), count)]


class MultiFrequencySelection:
    """Select by subpopulations that evolve every ``periods[i]`` generations (see the module docstring)."""

    def __init__(self, periods: list[int], winners: float = 0.25, losers: float = 0.25,
                 migration: float = 0.25) -> None:
        if not periods or any(p < 1 for p in periods):
            raise ValueError(f"periods must be one or more generation counts >= 1, got {periods}")
        for name, share in (("winners", winners), ("losers", losers), ("migration", migration)):
            if not 0 <= share <= 1:
                raise ValueError(f"{name} must be a share between 0 and 1, got {share}")
        if winners + losers + migration > 1:
            raise ValueError(f"winners + losers + migration must be at most 1, got {winners + losers + migration}")
        self.periods = list(periods)
        self.winners, self.losers, self.migration = winners, losers, migration
        self.elitism = False  # no slot is reserved for the best: winners carry on in their own slots

    def groups(self, n: int) -> list[list[int]]:
        if n < len(self.periods):
            raise ValueError(f"{len(self.periods)} subpopulations need at least {len(self.periods)} members, "
                             f"the population has {n}")
        return subpopulations(n, len(self.periods))

    def evolving(self, generation: int) -> list[bool]:
        """Which subpopulations evolve after generation `generation`'s evaluation (0-based)."""
        return [(generation + 1) % p == 0 for p in self.periods]

    def brackets(self, slots: list[int], f: np.ndarray) -> Brackets:
        """`slots` ranked by fitness `f` (ties: the lower slot first) and cut into the four brackets."""
        order = sorted(slots, key=lambda s: (-f[s], s))
        n = len(order)
        n_win = max(1, math.floor(n * self.winners + 0.5)) if n else 0
        n_lose = min(n - n_win, max(1 if n >= 2 and self.losers > 0 else 0, math.floor(n * self.losers + 0.5)))
        n_mig = min(n - n_win - n_lose, math.floor(n * self.migration + 0.5))
        cut = n - n_lose
        return Brackets(order[:n_win], order[n_win:cut - n_mig], order[cut - n_mig:cut], order[cut:])

    def plan(self, fitnesses: list[float], generation: int, rng: np.random.Generator) -> list[Placement]:
        """Where every slot of the next generation comes from."""
        f = ranked(fitnesses)
        groups = self.groups(len(fitnesses))
        plan = [Placement(s, "kept") for s in range(len(fitnesses))]
        for i, (group, evolves) in enumerate(zip(groups, self.evolving(generation), strict=True)):
            if not evolves:
                continue
            b = self.brackets(group, f)
            outside = [(s, j) for j, other in enumerate(groups) if j != i for s in other]
            for slot in b.migration:
                if not outside:
                    break
                src, j = min(outside, key=lambda sj: (-f[sj[0]], sj[0]))
                if f[src] > f[slot]:
                    faster = self.periods[j] < self.periods[i]
                    plan[slot] = Placement(src, "migrant_weights" if faster else "migrant",
                                           b.winners[0] if faster else None)
            for slot in b.losers:
                plan[slot] = Placement(int(b.winners[int(rng.integers(len(b.winners)))]), "mutate")
        return plan

    def second_parent(self, fitnesses: list[float], first: int, rng: np.random.Generator) -> int:
        """A crossover's other parent: the best other member of `first`'s subpopulation (`first` when alone)."""
        f = ranked(fitnesses)
        group = next(g for g in self.groups(len(fitnesses)) if first in g)
        others = [s for s in group if s != first]
        return min(others, key=lambda s: (-f[s], s)) if others else first
