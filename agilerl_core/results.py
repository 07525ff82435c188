"""What a generation and a run produce: the records every layer shares (an arena returns a
:class:`TrainResult`, the evolution sums them into :class:`GenerationStats` and a :class:`RunResult`).
They sit at the bottom of the house, so the arenas that fill them and the evolution that reads them both
import down."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainResult:
    """What one member's training phase produced."""

    slot: int
    """The population slot that trained."""
    env_steps: int
    """Budget units spent: env steps (offline: gradient steps)."""
    learn_steps: int
    """Gradient steps taken."""
    episodes: int
    """Training episodes that ended in this phase."""
    mean_return: float
    """Mean return of the episodes that ended during training (nan if none)."""
    mean_loss: float
    """Mean training loss over the phase's gradient steps."""
    wall_s: float
    """Wall time of the phase, seconds."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The phase's training diagnostics, each its mean over the phase (loss, entropy, Q...; LLM: reward, KL...)."""
    metric_points: list = field(default_factory=list)
    """Within a long phase, a few points: ``[env steps of the member then, {name: mean since the point before}]``."""


@dataclass
class GenerationStats:
    """Summary of one generation (what the progress bar and trackers show)."""

    generation: int
    """The generation's number, from 0."""
    global_steps: int
    """Budget units the whole run had spent when this generation ended."""
    fitnesses: list[float]
    """Each slot's evaluation (fitness), by slot."""
    best_fitness: float
    """The best of :attr:`fitnesses`."""
    mean_fitness: float
    """The mean of :attr:`fitnesses`."""
    train_returns: list[float]
    """Each slot's mean training return this generation."""
    mutations: list[str]
    """How each slot's member came to be this generation (``init``, ``clone``, a mutation's name...)."""
    hyperparameters: list[dict]
    """Each slot's hyperparameters while it trained."""
    wall_s: float
    """Wall time of the generation, seconds."""
    train_metrics: list[dict] = field(default_factory=list)
    """Per slot: :attr:`TrainResult.metrics`."""
    groups: list[list[int]] = field(default_factory=list)
    """The slots that trained together, as one stacked group each."""
    train_metric_points: list[list] = field(default_factory=list)
    """Per slot: :attr:`TrainResult.metric_points` (empty lists for short phases)."""


@dataclass
class RunResult:
    """Outcome of an evolution run."""

    best_fitness: float
    """The best evaluation of any member in any generation."""
    elite_fitness: float
    """The final elite's last evaluation."""
    global_steps: int
    """Budget units spent in all (env steps; offline: gradient steps)."""
    max_env_steps: int
    """The run's budget."""
    wall_s: float
    """Wall time of this run (this attempt, for a resumed run), seconds."""
    env_steps_per_s: float
    """Budget units per second of :attr:`wall_s`."""
    generations: int
    """Generations evaluated."""
    elite_uri: str
    """Where the final elite was saved."""
    reached_target: bool
    """Whether :attr:`best_fitness` reached the config's ``target_fitness``."""
    history: list[GenerationStats] = field(default_factory=list, repr=False)
    """One :class:`GenerationStats` per generation (left out of the repr: long)."""
    batching: str = ""
    """How members were grouped to learn (``Evolution.batching_note``)."""
    best_uri: str = ""
    """Where the run's best member (the champion rule's choice) was saved, when it was."""
    champion: dict[str, Any] | None = None
    """That choice: the candidates (final elite, best ever) and their fresh-seed scores."""
    best_member: Any = field(default=None, repr=False, compare=False)
    """That member, in-process runs only (:attr:`agilerl_core.api.EvolveResult.best` wraps it)."""
    found: dict[str, Any] | None = None
    """What the run found (:func:`agilerl_core.hpo.found.found_hyperparameters`): the champion's mutable
    hyperparameters, their moves along its line, the final population's spread."""
    found_config_uri: str = ""
    """Where the config that re-runs from them was written (``found_config.yaml``)."""
    target_held: bool = False
    """Whether the run stopped at its target: ``target_generations`` generations in a row reached it."""
    target_generations: int = 1
    """The config's ``target_generations``."""

    def summary(self) -> dict[str, Any]:
        groups = [len(g) for g in self.history[-1].groups] if self.history else []
        return {"batching": self.batching, "group_sizes": groups,
                "best_fitness": self.best_fitness, "elite_fitness": self.elite_fitness,
                "global_steps": self.global_steps, "max_env_steps": self.max_env_steps,
                "wall_s": round(self.wall_s, 3), "env_steps_per_s": round(self.env_steps_per_s, 1),
                "generations": self.generations, "elite_uri": self.elite_uri, "reached_target": self.reached_target,
                "target_held": self.target_held, "target_generations": self.target_generations,
                **({"best_uri": self.best_uri, "champion": self.champion} if self.best_uri else {}),
                **({"found": self.found, "found_config_uri": self.found_config_uri} if self.found else {})}
