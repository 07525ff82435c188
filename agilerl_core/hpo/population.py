"""The population and its lineage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from agilerl_core.hpo.mutation import Mutations
from agilerl_core.hpo.tournament import Placement, elite_index

if TYPE_CHECKING:
    from agilerl_core.hpo.evolvable import Evolvable


class Selection(Protocol):
    """How the next generation is chosen from this one's fitness (tournament or multi-frequency)."""

    elitism: bool

    def plan(self, fitnesses: list[float], generation: int, rng: np.random.Generator) -> list[Placement]:
        """Where each slot of the next generation comes from, after generation `generation`'s evaluation."""

    def second_parent(self, fitnesses: list[float], first: int, rng: np.random.Generator) -> int:
        """A crossover's other parent, for a child of slot `first`."""


@dataclass
class LineageEvent:
    """How one member came to be: created at `generation` in `slot`, cloned from `parent_id` (and, for a crossover,
    crossed with `other_parent_id`)."""

    generation: int
    slot: int
    member_id: int
    parent_id: int | None
    mutation: str
    hyperparameters: dict
    architecture: str
    fitness: float | None = None  # filled in once the member is evaluated
    other_parent_id: int | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["other_parent_id"] is None:  # a plain child: the record reads as before crossovers existed
            del d["other_parent_id"]
        return d


@dataclass
class Member:
    """One population slot: its member (an Evolvable, e.g. an RL agent) and its record."""

    member_id: int
    agent: Evolvable
    parent_id: int | None = None
    mutation: str = "init"
    born: int = 0  # generation it was created in
    fitness_history: list[float] = field(default_factory=list)  # its line's evaluations, oldest first
    other_parent_id: int | None = None  # a crossover child's second parent

    @property
    def fitness(self) -> float | None:
        return self.fitness_history[-1] if self.fitness_history else None


def clone_all(agents: list[Evolvable]) -> list[Evolvable]:
    """Independent copies of `agents` (a selection's picks, repeats allowed): all at once where their class
    clones many together (``clone_many``: RL agents' weights and optimiser states gathered as the rows of
    one state), else one by one."""
    many = getattr(type(agents[0]), "clone_many", None) if agents else None
    return many(agents) if many is not None else [a.clone() for a in agents]


def _event(member: Member, slot: int, generation: int) -> LineageEvent:
    return LineageEvent(generation, slot, member.member_id, member.parent_id, member.mutation,
                        member.agent.hp.model_dump(), member.agent.describe(), other_parent_id=member.other_parent_id)


@dataclass
class Population:
    """Members plus the evolution state: generation, id counter, lineage and the evolution RNG."""

    members: list[Member]
    rng: np.random.Generator
    generation: int = 0
    next_id: int = 0
    lineage: list[LineageEvent] = field(default_factory=list)

    @classmethod
    def create(cls, agents: list[Evolvable], seed: int) -> Population:
        members = [Member(i, a) for i, a in enumerate(agents)]
        pop = cls(members, np.random.default_rng(np.random.SeedSequence([seed, 0xE70])), 0, len(members))
        pop.lineage = [_event(m, i, 0) for i, m in enumerate(members)]
        return pop

    def record_fitness(self, fitnesses: list[float]) -> None:
        """Store this generation's evaluations on members and their lineage events."""
        for slot, (m, f) in enumerate(zip(self.members, fitnesses, strict=True)):
            m.fitness_history.append(float(f))
            for ev in reversed(self.lineage):
                if ev.member_id == m.member_id and ev.generation == self.generation and ev.slot == slot:
                    ev.fitness = float(f)
                    break

    def elite(self) -> Member:
        return self.members[elite_index([m.fitness if m.fitness is not None else float("nan")
                                         for m in self.members])]

    def evolve(self, selection: Selection, mutations: Mutations,
               seed_of: Callable[[int, int], int] | None = None) -> None:
        """The next generation (in place): `selection` plans where each slot comes from (a tournament, or
        subpopulations at several rhythms), the chosen members are cloned (:func:`clone_all`: a gather over
        their state), and each planned mutation applied.
        `seed_of(generation, slot)` seeds each new member's own generators (clones of one parent, the elite
        included, then draw differently from it and from each other)."""
        fitnesses = [m.fitness if m.fitness is not None else float("nan") for m in self.members]
        plan = selection.plan(fitnesses, self.generation, self.rng)
        clones = clone_all([self.members[place.parent].agent for place in plan])
        new_members = []
        for slot, (place, agent) in enumerate(zip(plan, clones, strict=True)):
            parent = self.members[place.parent]
            if seed_of is not None:
                agent.reseed(seed_of(self.generation + 1, slot))
            other = None
            if place.action == "mutate":
                def partner(p: int = place.parent) -> tuple[int, Evolvable]:
                    q = self.members[selection.second_parent(fitnesses, p, self.rng)]
                    return q.member_id, q.agent

                mutation, other = mutations.mutate_with(agent, self.rng, partner)
            elif place.action == "migrant_weights":
                host = self.members[place.hp_from].agent
                for name in sorted(mutations.space):
                    agent.set_hyperparameter(name, getattr(host.hp, name))
                mutation = f"migrant(weights of {parent.member_id}, hp of {self.members[place.hp_from].member_id})"
            elif place.action == "migrant":
                mutation = f"migrant({parent.member_id})"
            else:
                mutation = place.action
            new_members.append(Member(self.next_id, agent, parent.member_id, mutation, self.generation + 1,
                                      list(parent.fitness_history), other))
            self.next_id += 1
        self.members = new_members
        self.generation += 1
        self.lineage += [_event(m, i, self.generation) for i, m in enumerate(new_members)]
