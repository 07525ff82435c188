"""The Evolution: population, selection, mutation, history, budget, commit and resume, for any kind of member.

It knows members only through the :class:`~agilerl_core.hpo.evolvable.Evolvable` protocol and the work of a
generation only through an :class:`Arena` (one per kind of training: Gymnasium off- and on-policy, an
offline dataset; multi-agent and LLM arenas plug in the same way). It owns every seed, so the same config
and seed give the same result whoever runs the steps (the in-process loop, thread or process tasks)::

    evo.begin_generation()
    results = [evo.train(slot) for slot in slots]        # arena.train_group (a group of one), on a shard of slots
    fitnesses = [evo.evaluate(slot) for slot in slots]   # arena.evaluate (or evaluate_group, per group)
    evo.finish_generation(results, fitnesses)           # experience commit, fitness, history
    evo.commit(store, shard_refs)                       # the generation to storage, manifest last
    evo.evolve()                                        # tournament + one mutation per child
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agilerl_core.errors import CheckpointError, NonFiniteError
from agilerl_core.finite import check_weights, source_of
from agilerl_core.hpo.evolvable import Evolvable
from agilerl_core.hpo.multi_frequency import MultiFrequencySelection
from agilerl_core.hpo.mutation import Mutations
from agilerl_core.hpo.population import Member, Population, Selection
from agilerl_core.hpo.space import HyperparameterSpace, initial_values
from agilerl_core.hpo.tournament import EveryNth, NoSelection, TournamentSelection
from agilerl_core.io.checkpoint import load_population, save_member, save_population
from agilerl_core.io.history import generation_history
from agilerl_core.io.manifest import ShardRef
from agilerl_core.io.run_store import RunStore
from agilerl_core.limits import Limits, applied
from agilerl_core.results import GenerationStats, RunResult, TrainResult


def finite_max(values: Sequence[float]) -> float:
    """The largest finite value (nan when none is): a NaN or infinite fitness never counts as the best."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return max(finite) if finite else float("nan")


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integers (the master seed, a generation, a slot...)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


def groups_of(keys: Sequence[object | None], cap: int | None) -> list[tuple[int, ...]]:
    """Slots grouped by equal batch key in order of first appearance (None: a group of its own), each group
    cut into pieces of at most `cap` (None: no limit). A deterministic function of the keys."""
    order: list[object] = []
    by_key: dict[object, list[int]] = {}
    out: list[list[int]] = []
    for slot, key in enumerate(keys):
        if key is None:
            out.append([slot])
            continue
        if key not in by_key:
            by_key[key] = []
            order.append(key)
            out.append(by_key[key])
        by_key[key].append(slot)
    groups: list[tuple[int, ...]] = []
    for g in out:
        size = len(g) if cap is None else cap
        pieces = math.ceil(len(g) / size)
        groups += [tuple(g[i * size: (i + 1) * size]) for i in range(pieces)]
    return groups


# what each seed is for: derive_seed(master, PURPOSE, ...)
MEMBER_SEED, TRAIN_SEED, EVAL_SEED, CHILD_SEED, CHAMPION_SEED, HP_INIT_SEED = 1, 2, 3, 4, 5, 6


class Arena(Protocol):
    """Where one kind of member trains and is judged. The evolution calls these; an arena never selects,
    mutates or seeds on its own."""

    kind: str  # the experiment kind it serves (gym, offline, ...)
    space: HyperparameterSpace  # the members' mutable hyperparameters
    arch_bounds: Any  # what architecture mutations must respect
    env_desc: dict[str, Any]  # what a checkpoint records about where its members act
    shares_experience: bool  # members learn from each other's committed experience (shards)
    evaluation_notes: tuple[str, ...]  # member attributes its evaluate sets beside the fitness (logged)
    buffer: Any  # the shared experience (a ReplayBuffer) when shares_experience, else None

    def build_members(self, seeds: list[int]) -> list[Evolvable]:
        """One fresh member per seed."""

    def member_from_state(self, tensors: dict[str, Any], meta: dict[str, Any]) -> Evolvable:
        """Rebuild a member from :meth:`Evolvable.state` output."""

    def begin_generation(self, slots: int) -> None:
        """Prepare `slots` members' fresh-experience areas (the committed experience stays)."""

    def batch_key(self, member: Evolvable) -> Any:
        """Members with equal keys may train and evaluate as one group (None: this member alone)."""

    def train_group(self, members: list[Evolvable], slots: list[int], seeds: list[int], steps: int
                    ) -> list[TrainResult]:
        """Train `members` (in `slots`, one batch key) for `steps` budget units each; a member alone is a group
        of one."""

    def evaluate_group(self, members: list[Evolvable], seed: int, slots: list[int]) -> list[float]:
        """Fitness of `members` (one batch key) at once, each as it would score alone."""

    def evaluate(self, member: Evolvable, seed: int, slot: int | None = None) -> float:
        """Fitness of `member` (its evaluation env is keyed by `slot`, so slots evaluate concurrently)."""

    def shard(self, slot: int) -> dict[str, Any] | None:
        """Slot `slot`'s fresh experience of this generation."""

    def commit_experience(self, shards: list[dict[str, Any]], members: list[Evolvable]) -> None:
        """Append the generation's shards (in member order) to the shared experience."""

    def experience_state(self) -> dict[str, int]:
        """The shared experience's ring state for the manifest (zeros when none)."""

    def restore_experience(self, store: RunStore, generation: int) -> None:
        """The shared experience exactly as committed after `generation`."""


@dataclass(frozen=True)
class EvolutionSettings:
    """What the evolution needs of a config, whatever the kind."""

    population_size: int
    seed: int
    evo_steps: int  # budget units per member per generation
    max_steps: int  # the global budget
    target_fitness: float | None
    selection: Selection
    mutations: Mutations
    batch_members: bool = True  # members of one batch key learn as one group
    group_cap: int | None = None  # at most this many members per group (None: no limit)
    limits: Limits | None = None  # the config's limit table: what the run reads and rebuilds is checked against it
    hp_init: tuple[str, float] = ("config", 2.0)  # the first generation's hyperparameters: (method, spread)
    target_generations: int = 1  # the run stops once this many generations in a row reached target_fitness

    @classmethod
    def from_config(cls, cfg, space: HyperparameterSpace, arch_bounds: Any, batch_members: bool = True,
                    group_cap: int | None = None) -> EvolutionSettings:
        """The settings of an engine config; grouping is the caller's (the pipeline's runner decides it)."""
        return cls(cfg.population_size, cfg.seed, cfg.evo_steps, cfg.max_env_steps, cfg.target_fitness,
                   selection_of(cfg),
                   Mutations.from_config(cfg.mutation, space, arch_bounds), batch_members, group_cap,
                   getattr(cfg, "limits", None), _hp_init(cfg), cfg.target_generations)


def _hp_init(cfg) -> tuple[str, float]:
    init = getattr(cfg, "hp_init", None)
    return ("config", 2.0) if init is None else (init.method, init.spread)


def selection_of(cfg) -> Selection:
    """The selection a config asks for: tournaments (``tournament:``), multi-frequency subpopulations
    (``selection: {method: multi_frequency}``) or none (``selection: {method: none}``: evolution off)."""
    sel = getattr(cfg, "selection", None)
    if sel is not None and sel.method == "multi_frequency":
        return MultiFrequencySelection(sel.periods, sel.winners, sel.losers, sel.migration)
    if sel is not None and sel.method == "none":
        return NoSelection()
    tournament = TournamentSelection(cfg.tournament.size, cfg.tournament.elitism)
    every = getattr(sel, "every", 1) if sel is not None else 1
    return EveryNth(tournament, every) if every > 1 else tournament


def _under_limits(method: Callable) -> Callable:
    """Run `method` under the run's own limit table (a member rebuilt from its state, a checkpoint read on resume,
    an architecture grown by mutation: checked against what the user's config allows, not the defaults)."""
    @functools.wraps(method)
    def wrapper(self: Evolution, *args: Any, **kwargs: Any) -> Any:
        with applied(self.settings.limits):
            return method(self, *args, **kwargs)
    return wrapper


class Evolution:
    """One evolution run of any Evolvable in its arena."""

    def __init__(self, arena: Arena, settings: EvolutionSettings) -> None:
        self.arena = arena
        self.settings = settings
        seeds = [derive_seed(settings.seed, MEMBER_SEED, i) for i in range(settings.population_size)]
        members = arena.build_members(seeds)
        self._initial_hyperparameters(members)
        self.population = Population.create(members, settings.seed)
        self.global_steps = 0
        self.history: list[GenerationStats] = []
        self._gen_t0 = time.perf_counter()

    def _initial_hyperparameters(self, members: list[Evolvable]) -> None:
        """``hp_init``: every member but slot 0 (which keeps the config's values) starts at values spread around
        the config's or sampled from the mutable space, each slot from a generator of its own."""
        method, spread = self.settings.hp_init
        space = self.arena.space
        if method == "config" or not space:
            return
        for slot, member in enumerate(members[1:], start=1):
            rng = np.random.default_rng(derive_seed(self.settings.seed, HP_INIT_SEED, slot))
            current = {name: float(getattr(member.hp, name)) for name in space}
            for name, value in initial_values(space, current, method, spread, rng).items():
                member.set_hyperparameter(name, value)

    # ---- the generation step -------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        """The generation the next train/evaluate calls belong to."""
        return self.population.generation

    def generation_steps(self) -> int:
        """Budget units per member this generation: evo_steps, or what is left of the budget shared out
        (the last generation shrinks, so a run stops at its budget instead of a generation past it)."""
        remaining = self.settings.max_steps - self.global_steps
        if remaining <= 0:  # a generation run by hand past the budget is a whole one
            return self.settings.evo_steps
        return min(self.settings.evo_steps, math.ceil(remaining / len(self.population.members)))

    def begin_generation(self) -> None:
        """Empty every member's fresh-experience area (the committed experience stays as it is)."""
        self._gen_t0 = time.perf_counter()
        self.arena.begin_generation(len(self.population.members))

    @_under_limits
    def train(self, slot: int, generation: int | None = None, steps: int | None = None) -> TrainResult:
        """Train member `slot` (thread-safe across distinct slots)."""
        gen = self.generation if generation is None else generation
        seed = derive_seed(self.settings.seed, TRAIN_SEED, gen, slot)
        return self._finite(gen, lambda: self.arena.train_group([self.population.members[slot].agent], [slot], [seed],
                                                                self.generation_steps() if steps is None else steps))[0]

    def _finite(self, generation: int, train: Callable[[], list[TrainResult]]) -> list[TrainResult]:
        """`train()`'s results once every trained member's weights (and mean loss) are finite; a
        :class:`NonFiniteError` from the arena or from these checks names the source, member and generation."""
        try:
            results = train()
            for r in results:
                if r.learn_steps and not math.isfinite(r.mean_loss):
                    raise NonFiniteError(None, r.slot, f"the mean loss ({r.mean_loss})")
                check_weights(self.population.members[r.slot].agent, r.slot)
        except NonFiniteError as err:
            member = self.population.members[err.slot] if 0 <= err.slot < len(self.population.members) else None
            raise err.named(source_of(getattr(self.arena, "cfg", None)), None if member is None else member.member_id,
                            generation) from err
        return results

    def check_finite(self, member: Member, when: str) -> None:
        """A NonFiniteError when `member`'s weights hold NaN or inf (it is never saved, committed or registered)."""
        slot = next((i for i, m in enumerate(self.population.members) if m is member), -1)
        try:
            check_weights(member.agent, slot, when)
        except NonFiniteError as err:
            raise err.named(source_of(getattr(self.arena, "cfg", None)), member.member_id,
                            self.population.generation) from None

    def grouping(self) -> dict[str, Any]:
        """What decides the groups besides the population (pinned in the run's record)."""
        return {"batch_members": self.settings.batch_members, "group_cap": self.settings.group_cap}

    def pin_grouping(self, grouping: dict[str, Any]) -> bool:
        """Group as a run's record says (a resumed run trains the groups the uninterrupted run would, whatever
        runner resumes it); True when that changed the settings."""
        pinned = {"batch_members": bool(grouping["batch_members"]),
                  "group_cap": None if grouping["group_cap"] is None else int(grouping["group_cap"])}
        if pinned == self.grouping():
            return False
        self.settings = replace(self.settings, **pinned)
        return True

    def groups(self) -> list[tuple[int, ...]]:
        """The slots that train together (one task each): members with equal batch keys (the arena's, when
        it batches and batching is on), at most the settings' cap per group. A deterministic function of
        the population, so every runner and a resumed run group alike."""
        keys = [self.arena.batch_key(m.agent) if self.settings.batch_members else None for m in self.population.members]
        return groups_of(keys, self.settings.group_cap)

    def batching_note(self) -> str:
        """What the run's summary says about batching (which members could not batch, and why)."""
        if not self.settings.batch_members:
            return "off (batch_members: false)"
        refusals = sorted({m.agent.batch_refusal() for m in self.population.members
                           if self.arena.batch_key(m.agent) is None})
        scope = getattr(self.arena, "batch_scope", None)
        on = "on" if scope is None else f"on ({scope})"
        return on if not refusals else "groups of one: " + "; ".join(refusals)

    @_under_limits
    def train_group(self, slots: tuple[int, ...] | list[int], generation: int | None = None,
                    steps: int | None = None) -> list[TrainResult]:
        """Train the members in `slots` (one of :meth:`groups`) together; a group of one trains alone."""
        if len(slots) == 1:
            return [self.train(slots[0], generation, steps)]
        gen = self.generation if generation is None else generation
        seeds = [derive_seed(self.settings.seed, TRAIN_SEED, gen, s) for s in slots]
        return self._finite(gen, lambda: self.arena.train_group([self.population.members[s].agent for s in slots],
                                                                list(slots), seeds,
                                                                self.generation_steps() if steps is None else steps))

    @_under_limits
    def evaluate_group(self, slots: tuple[int, ...] | list[int], generation: int | None = None,
                       own_env: bool = False) -> list[float]:
        """Fitness of the members in `slots` (one of :meth:`groups`): at once (one by one when batching is off)."""
        if len(slots) == 1 or not self.settings.batch_members:
            return [self.evaluate(s, generation, own_env) for s in slots]
        gen = self.generation if generation is None else generation
        return self.arena.evaluate_group([self.population.members[s].agent for s in slots],
                                         derive_seed(self.settings.seed, EVAL_SEED, gen), list(slots))

    @_under_limits
    def evaluate(self, slot: int, generation: int | None = None, own_env: bool = False) -> float:
        """Fitness of member `slot`; `own_env`: in the slot's own evaluation env (concurrent evaluations)."""
        gen = self.generation if generation is None else generation
        return self.arena.evaluate(self.population.members[slot].agent, derive_seed(self.settings.seed, EVAL_SEED, gen),
                                   slot if own_env else None)

    @_under_limits
    def finish_generation(self, results: list[TrainResult], fitnesses: list[float],
                          shards: list[dict[str, Any]] | None = None) -> GenerationStats:
        """Commit the fresh experience (the staged shards, or `shards` from other processes) in member
        order, record fitness and the generation's stats."""
        pop = self.population
        if self.arena.shares_experience:
            shards = shards if shards is not None else [self.arena.shard(r.slot) for r in results]
            self.arena.commit_experience(shards, [m.agent for m in pop.members])
        self.global_steps += sum(r.env_steps for r in results)
        pop.record_fitness(fitnesses)
        stats = GenerationStats(pop.generation, self.global_steps, list(fitnesses), finite_max(fitnesses),
                                float(np.mean(fitnesses)), [r.mean_return for r in results],
                                [m.mutation for m in pop.members], [m.agent.hp.model_dump() for m in pop.members],
                                time.perf_counter() - self._gen_t0, [dict(r.metrics) for r in results],
                                [list(g) for g in self.groups()], [list(r.metric_points) for r in results])
        self.history.append(stats)
        return stats

    @_under_limits
    def run_generation(self, on_trained: Callable[[TrainResult], None] | None = None) -> GenerationStats:
        """Train every member, evaluate, commit the fresh experience, record fitness. `on_trained` is called
        with each member's result as soon as its group has trained (before any evaluation)."""
        self.begin_generation()
        steps = self.generation_steps()
        groups = self.groups()
        results = []
        for g in groups:
            trained = self.train_group(g, steps=steps)
            for r in trained if on_trained is not None else ():
                on_trained(r)
            results += trained
        results.sort(key=lambda r: r.slot)
        fitness = {s: f for g in groups for s, f in zip(g, self.evaluate_group(g), strict=True)}
        return self.finish_generation(results, [fitness[s] for s in range(len(self.population.members))])

    @_under_limits
    def evolve(self) -> None:
        """Tournament selection with elitism, then one mutation per non-elite child: the next generation."""
        seed = self.settings.seed
        self.population.evolve(self.settings.selection, self.settings.mutations,
                               lambda generation, slot: derive_seed(seed, CHILD_SEED, generation, slot))

    def best_fitness(self) -> float:
        """The best evaluation of any generation so far."""
        return finite_max([h.best_fitness for h in self.history])

    def best_generation(self) -> int | None:
        """The generation whose elite scored the run's best evaluation (the earliest on a tie); None before any."""
        if not self.history:
            return None
        best = self.best_fitness()
        return next(h.generation for h in self.history if h.best_fitness == best or
                    (np.isnan(best) and np.isnan(h.best_fitness)))

    def fresh_fitness(self, agent: Evolvable, rounds: int) -> float:
        """`agent`'s mean fitness over `rounds` evaluations on seeds no generation evaluated on (the champion's
        re-scoring: a lucky evaluation during the run does not carry over)."""
        scores = [self.arena.evaluate(agent, derive_seed(self.settings.seed, CHAMPION_SEED, r)) for r in range(rounds)]
        return float(np.mean(scores))

    def target_held(self) -> bool:
        """Whether the last ``target_generations`` generations (settings) each had a member at the target fitness:
        the run's stop at its target."""
        target, hold = self.settings.target_fitness, self.settings.target_generations
        return (target is not None and len(self.history) >= hold
                and all(h.best_fitness >= target for h in self.history[-hold:]))

    def finished(self) -> bool:
        return self.target_held() or self.global_steps >= self.settings.max_steps

    def result(self, wall_s: float, steps_run: int, elite_uri: str) -> RunResult:
        """The run's outcome after its last generation (`steps_run`: budget units spent in `wall_s`)."""
        target = self.settings.target_fitness
        best = self.best_fitness()
        elite = self.population.elite().fitness
        return RunResult(best_fitness=best, elite_fitness=float("nan") if elite is None else elite,
                         global_steps=self.global_steps, max_env_steps=self.settings.max_steps, wall_s=wall_s,
                         env_steps_per_s=steps_run / max(wall_s, 1e-9), generations=len(self.history),
                         elite_uri=elite_uri, reached_target=target is not None and best >= target,
                         history=self.history, batching=self.batching_note(), target_held=self.target_held(),
                         target_generations=self.settings.target_generations)

    # ---- members as data -------------------------------------------------------------------------------
    @_under_limits
    def load_member_state(self, slot: int, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        """Replace member `slot` with one rebuilt from :meth:`Evolvable.state` output."""
        self.population.members[slot].agent = self.arena.member_from_state(tensors, meta)

    def evaluation_notes(self, slot: int) -> dict[str, Any]:
        """What evaluating member `slot` noted on it besides its fitness (the arena's `evaluation_notes`:
        per-agent returns, sample completions), so a process runner can carry it back with the fitness."""
        agent = self.population.members[slot].agent
        return {k: getattr(agent, k) for k in self.arena.evaluation_notes if hasattr(agent, k)}

    def take_evaluation_notes(self, slot: int, notes: dict[str, Any]) -> None:
        """Put notes from :meth:`evaluation_notes` (taken in another process) on member `slot`."""
        unknown = set(notes) - set(self.arena.evaluation_notes)
        if unknown:
            raise ValueError(f"evaluation notes {sorted(unknown)} are not this arena's "
                             f"{list(self.arena.evaluation_notes)}")
        for k, v in notes.items():
            setattr(self.population.members[slot].agent, k, v)

    def elite(self) -> Member:
        return self.population.elite()

    # ---- persistence ----------------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        return {"global_steps": self.global_steps, "history": [asdict(h) for h in self.history]}

    def _load_extra(self, population: Population, meta: dict[str, Any], where: str = "population.json") -> None:
        """Take `population` with the run's step count and history from its population.json record `meta` (read
        from `where`), every field of every generation's stats checked first (:func:`generation_history`): a
        CheckpointError names the file and field, and the evolution stays as it was."""
        steps, history = generation_history(meta, where, len(population.members))
        self.population, self.global_steps, self.history = population, steps, history

    @_under_limits
    def save(self, path: str | Path, config: dict[str, Any] | None = None, with_buffer: bool = True) -> Path:
        """The whole population (and the shared experience) in one directory."""
        extra = {**self.extra_state(), **({"config": config} if config is not None else {})}
        return save_population(path, self.population, self.arena.env_desc,
                               self.arena.buffer if with_buffer else None, extra)

    @_under_limits
    def restore(self, path: str | Path) -> None:
        """Continue from :meth:`save` output: the run then proceeds exactly as if uninterrupted."""
        pop, meta = load_population(path, buffer=self.arena.buffer, rebuild=self.arena.member_from_state)
        self._load_extra(pop, meta, str(Path(path) / "population.json"))

    @_under_limits
    def save_elite(self, path: str | Path) -> Path:
        elite = self.population.elite()
        self.check_finite(elite, "before saving it as the elite")
        return save_member(path, elite, self.arena.env_desc)

    @_under_limits
    def commit(self, store: RunStore, shards: list[ShardRef]) -> None:
        """Write the evaluated generation (members, evolution state, shard refs, experience ring) to `store`."""
        elite = self.population.members.index(self.population.elite())
        self.check_finite(self.population.members[elite], "before committing it as the generation's elite")
        store.commit_generation(self.population, self.arena.env_desc, shards, self.extra_state(),
                                self.arena.experience_state(), elite)

    @_under_limits
    def resume(self, store: RunStore, generation: int) -> None:
        """Continue from a committed generation: population, history and experience exactly as they were."""
        pop, meta = store.load_generation(generation, rebuild=self.arena.member_from_state)
        if len(pop.members) != self.settings.population_size:
            raise CheckpointError(f"{store.uri}: generation {generation} has {len(pop.members)} members, the "
                                  f"config asks for {self.settings.population_size}")
        self._load_extra(pop, meta, store.storage.url(store.key(store.gen_dir(generation), "population",
                                                                "population.json")))
        self.arena.restore_experience(store, generation)
