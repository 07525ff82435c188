"""The Experiment (one run's population, envs and shared buffer, off- or on-policy) and the in-process loop."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from agilerl_core.algorithms.registry import get_algorithm
from agilerl_core.buffers.replay import ReplayBuffer, Shard, transition_fields
from agilerl_core.config import ExperimentConfig
from agilerl_core.data.loader import Dataset, check_fits, dataset_buffer, load_dataset
from agilerl_core.envs.make import make_vector_env, probe_spaces
from agilerl_core.envs.spaces import ActionSpec, ObsSpec, action_spec
from agilerl_core.errors import CheckpointError, ConfigError, DatasetError
from agilerl_core.hpo.mutation import Mutations
from agilerl_core.hpo.population import Population
from agilerl_core.hpo.space import merge_space
from agilerl_core.hpo.tournament import TournamentSelection
from agilerl_core.io.checkpoint import load_population, save_member, save_population
from agilerl_core.io.run_store import RunStore, ShardRef
from agilerl_core.io.storage import s3_options
from agilerl_core.networks.evolvable import ArchBounds, initial_arch
from agilerl_core.training.generation import (
    TrainResult,
    derive_seed,
    evaluate_member,
    train_member,
    train_member_offline,
    train_member_on_policy,
)


@dataclass
class GenerationStats:
    """Summary of one generation (what the progress bar and trackers show)."""

    generation: int
    global_steps: int
    fitnesses: list[float]
    best_fitness: float
    mean_fitness: float
    train_returns: list[float]
    mutations: list[str]
    hyperparameters: list[dict]
    wall_s: float


@dataclass
class RunResult:
    """Outcome of an evolution run."""

    best_fitness: float
    global_steps: int
    wall_s: float
    env_steps_per_s: float
    generations: int
    elite_uri: str
    reached_target: bool
    history: list[GenerationStats] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"best_fitness": self.best_fitness, "global_steps": self.global_steps, "wall_s": round(self.wall_s, 3),
                "env_steps_per_s": round(self.env_steps_per_s, 1), "generations": self.generations,
                "elite_uri": self.elite_uri, "reached_target": self.reached_target}


def check_action_space(cfg: ExperimentConfig, algo_cls: type, spec: ActionSpec, space) -> None:
    """A ConfigError naming the algorithms that fit when `cfg.algorithm` cannot act in `space`."""
    if spec.kind in algo_cls.action_kinds:
        return
    from agilerl_core.algorithms.registry import algorithms_for
    from agilerl_core.config import OFFLINE_ALGORITHMS, ON_POLICY

    kinds = " or ".join("Discrete" if k == "discrete" else "Box" for k in algo_cls.action_kinds)
    unfit = ON_POLICY if cfg.dataset is not None else OFFLINE_ALGORITHMS
    fits = [a for a in algorithms_for(spec.kind) if a not in unfit]
    raise ConfigError(f"algorithm: {cfg.algorithm} needs {kinds} actions, but {cfg.env_id} has {space}; use one of "
                      f"{', '.join(fits)}")


def _probe_action_mask(env) -> int | None:
    _, info = env.reset(seed=0)
    mask = info.get("action_mask")
    return None if mask is None else int(np.asarray(mask).reshape(env.num_envs, -1).shape[1])


class Experiment:
    """Everything one evolution run needs in one process: population, shared buffer, envs."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self._setup_spec(cfg)
        self.eval_env = make_vector_env(cfg.env_id, cfg.eval_episodes, cfg.env_kwargs)
        self.buffer: ReplayBuffer | None = None  # the shared experience; None: on-policy or offline
        self.dataset_buffer: ReplayBuffer | None = None  # offline: the dataset, fixed for the whole run
        if self.dataset is not None:
            self.envs = []  # members never act in training
            self.dataset_buffer = dataset_buffer(self.dataset.transitions, self.obs_spec, self.action_spec,
                                                 self.device)
        else:
            self.envs = [make_vector_env(cfg.env_id, cfg.num_envs, cfg.env_kwargs)
                         for _ in range(cfg.population_size)]
        if self.algo_cls.uses_replay and self.dataset is None:
            mask_dim = _probe_action_mask(self.envs[0])
            n_step = getattr(cfg.hyperparameters, "n_step", 1) > 1
            self.buffer = ReplayBuffer(transition_fields(self.obs_spec, mask_dim, self.action_spec, n_step),
                                       cfg.hyperparameters.buffer_size, self.device)
        self.slot_capacity = math.ceil(cfg.evo_steps / cfg.num_envs) * cfg.num_envs
        agents = [self.algo_cls(self.obs_spec, self.action_spec, self.arch, cfg.hyperparameters,
                                derive_seed(cfg.seed, 1, i), self.device) for i in range(cfg.population_size)]
        if self.dataset_buffer is not None and cfg.hyperparameters.normalize_obs:
            obs = self.obs_spec.to_tensors(self.dataset.transitions.observations)
            for agent in agents:  # offline: the statistics of the whole dataset, from the start
                agent.observe(obs)
        self.population = Population.create(agents, cfg.seed)
        self.global_steps = 0
        self.history: list[GenerationStats] = []

    def _setup_spec(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device: 'cuda' was requested but no CUDA device is available; use 'cpu' or 'auto'")
        self.device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
        torch.set_num_threads(cfg.torch_threads)
        obs_space, act_space = probe_spaces(cfg.env_id, cfg.env_kwargs)
        self.obs_spec = ObsSpec(obs_space, cfg.network.cnn.channels_last)
        self.action_spec = action_spec(act_space)
        self.algo_cls = get_algorithm(cfg.algorithm)
        check_action_space(cfg, self.algo_cls, self.action_spec, act_space)
        self.action_dim = self.action_spec.dim
        if cfg.hyperparameters.normalize_obs and not self.obs_spec.vector_dim:
            raise ConfigError(f"hyperparameters.normalize_obs: {cfg.env_id}'s observations have no vector part "
                              f"to normalise (images are scaled to [0, 1] already); set normalize_obs: false")
        self.env_desc = {"env_id": cfg.env_id, "env_kwargs": cfg.env_kwargs,
                         "channels_last": cfg.network.cnn.channels_last}
        self.space = merge_space(self.algo_cls.default_hp_space, cfg.hp_space)
        for name, spec in self.space.items():
            value = getattr(cfg.hyperparameters, name)
            if not spec.min <= value <= spec.max:
                raise ConfigError(f"hyperparameters.{name}: initial value {value} lies outside hp_space.{name} "
                                  f"bounds [{spec.min}, {spec.max}]; change one of them")
        self.bounds = ArchBounds.from_config(cfg.network)
        self.arch = initial_arch(self.obs_spec, self.action_dim, cfg.network)
        self.tournament = TournamentSelection(cfg.tournament.size, cfg.tournament.elitism)
        self.mutations = Mutations.from_config(cfg.mutation, self.space, self.bounds)
        self.dataset = self._load_dataset(cfg, obs_space, act_space)

    @staticmethod
    def _load_dataset(cfg: ExperimentConfig, obs_space, act_space) -> Dataset | None:
        """The offline dataset (downloaded into the cache if on S3), checked against the env and its pin."""
        if cfg.dataset is None:
            return None
        ds = load_dataset(cfg.dataset.uri, cfg.dataset.format, s3_options(cfg), cfg.dataset.cache_dir)
        if cfg.dataset.sha256 is not None and ds.sha256 != cfg.dataset.sha256:
            raise DatasetError(f"dataset.uri {cfg.dataset.uri!r}: content hash {ds.sha256} differs from dataset.sha256 "
                               f"{cfg.dataset.sha256} (the run was started on other data); restore that dataset or "
                               f"start a new run")
        check_fits(ds, cfg.env_id, obs_space, act_space)
        return ds

    @classmethod
    def check(cls, cfg: ExperimentConfig) -> None:
        """Every check the constructor makes (device, env id, spaces, hp bounds, architecture), without
        building the envs, agents or buffer: what a launcher runs before handing the config on."""
        cls.__new__(cls)._setup_spec(cfg)

    # ---- the generation step -------------------------------------------------------------------------
    def begin_generation(self) -> None:
        """Empty every member's staging area (the committed buffer stays as it is)."""
        self._gen_t0 = time.perf_counter()
        if self.buffer is not None:
            self.buffer.reserve_staging(len(self.population.members), self.slot_capacity)

    def train(self, slot: int, generation: int | None = None) -> TrainResult:
        """Train member `slot` for evo_steps into its staging area (thread-safe across distinct slots)."""
        gen = self.population.generation if generation is None else generation
        seed = derive_seed(self.cfg.seed, 2, gen, slot)
        agent = self.population.members[slot].agent
        if self.dataset_buffer is not None:
            return train_member_offline(agent, slot, self.dataset_buffer, self.cfg.evo_steps)
        if self.buffer is None:
            return train_member_on_policy(agent, slot, self.envs[slot], self.cfg.evo_steps, seed)
        self.buffer.reset_slot(slot)
        return train_member(agent, slot, self.envs[slot], self.buffer, self.cfg.evo_steps, seed)

    def evaluate(self, slot: int, generation: int | None = None, eval_env=None) -> float:
        gen = self.population.generation if generation is None else generation
        return evaluate_member(self.population.members[slot].agent, eval_env or self.eval_env,
                               derive_seed(self.cfg.seed, 3, gen), self.cfg.eval_max_steps)

    def finish_generation(self, results: list[TrainResult], fitnesses: list[float],
                          shards: list[Shard] | None = None) -> GenerationStats:
        """Commit the fresh experience (the staged shards, or `shards` from other processes) in member
        order, record fitness and the generation's stats."""
        pop = self.population
        if self.buffer is not None:
            first = self.buffer.pos
            shards = shards if shards is not None else [self.buffer.shard(r.slot) for r in results]
            self.buffer.commit(shards)
            count = sum(next(iter(sh.values())).shape[0] for sh in shards) if shards else 0
            for m in pop.members:  # e.g. prioritised replay: the new rows enter every member's priorities
                m.agent.committed(first, count)
        self.global_steps += sum(r.env_steps for r in results)
        pop.record_fitness(fitnesses)
        stats = GenerationStats(pop.generation, self.global_steps, list(fitnesses), max(fitnesses),
                                float(np.mean(fitnesses)), [r.mean_return for r in results],
                                [m.mutation for m in pop.members], [m.agent.hp.model_dump() for m in pop.members],
                                time.perf_counter() - getattr(self, "_gen_t0", time.perf_counter()))
        self.history.append(stats)
        return stats

    def run_generation(self) -> GenerationStats:
        """Train every member, evaluate, commit the fresh experience, record fitness."""
        self.begin_generation()
        n = len(self.population.members)
        results = [self.train(slot) for slot in range(n)]
        fitnesses = [self.evaluate(slot) for slot in range(n)]
        return self.finish_generation(results, fitnesses)

    def finished(self) -> bool:
        cfg = self.cfg
        reached = bool(self.history) and cfg.target_fitness is not None and \
            self.history[-1].best_fitness >= cfg.target_fitness
        return reached or self.global_steps >= cfg.max_env_steps

    def result(self, wall_s: float, steps_run: int, elite_uri: str) -> RunResult:
        """The run's outcome after its last generation (`steps_run`: env steps taken in `wall_s`)."""
        last = self.history[-1]
        target = self.cfg.target_fitness
        return RunResult(best_fitness=last.best_fitness, global_steps=self.global_steps, wall_s=wall_s,
                         env_steps_per_s=steps_run / max(wall_s, 1e-9), generations=len(self.history),
                         elite_uri=elite_uri, reached_target=target is not None and last.best_fitness >= target,
                         history=self.history)

    def evolve(self) -> None:
        self.population.evolve(self.tournament, self.mutations)

    # ---- persistence ----------------------------------------------------------------------------------
    def save(self, path: str | Path, with_buffer: bool = True) -> Path:
        extra = {"global_steps": self.global_steps, "history": [asdict(h) for h in self.history],
                 "config": self.cfg.model_dump(mode="json")}
        return save_population(path, self.population, self.env_desc, self.buffer if with_buffer else None, extra)

    def restore(self, path: str | Path) -> None:
        """Continue from a saved population (and buffer): the run then proceeds exactly as if uninterrupted."""
        pop, meta = load_population(path, self.obs_spec, self.buffer, self.device)
        self.population = pop
        self.global_steps = int(meta["extra"]["global_steps"])
        self.history = [GenerationStats(**h) for h in meta["extra"]["history"]]

    def save_elite(self, path: str | Path) -> Path:
        return save_member(path, self.population.elite(), self.env_desc)

    # ---- committed generations in a run store ----------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        return {"global_steps": self.global_steps, "history": [asdict(h) for h in self.history]}

    def commit(self, store: RunStore, shards: list[ShardRef]) -> None:
        """Write the evaluated generation (members, evolution state, shard refs, buffer ring) to `store`."""
        b = self.buffer
        buf = {"size": b.size, "pos": b.pos, "capacity": b.capacity} if b else {"size": 0, "pos": 0, "capacity": 0}
        elite = self.population.members.index(self.population.elite())
        store.commit_generation(self.population, self.env_desc, shards, self.extra_state(), buf, elite)

    def resume(self, store: RunStore, generation: int) -> None:
        """Continue from a committed generation: population, history and the buffer exactly as they were."""
        pop, meta = store.load_generation(generation, self.obs_spec, self.device)
        if len(pop.members) != self.cfg.population_size:
            raise CheckpointError(f"{store.uri}: generation {generation} has {len(pop.members)} members, the "
                                  f"config asks for {self.cfg.population_size}")
        self.population = pop
        self.global_steps = int(meta["extra"]["global_steps"])
        self.history = [GenerationStats(**h) for h in meta["extra"]["history"]]
        if self.buffer is not None:
            store.rebuild_buffer(generation, self.buffer)

    def load_member_state(self, slot: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Replace member `slot`'s agent with one rebuilt from :meth:`RLAlgorithm.state` output."""
        self.population.members[slot].agent = self.algo_cls.from_state(self.obs_spec, tensors, meta, self.device)


def train_local(cfg: ExperimentConfig, progress: bool = True, run_dir: str | Path | None = None,
                     experiment: Experiment | None = None) -> RunResult:
    """Evolve a population until the target fitness or the global env-step budget; save the elite."""
    exp = experiment or Experiment(cfg)
    t0 = time.perf_counter()
    steps0 = exp.global_steps
    bar = tqdm(total=cfg.max_env_steps, initial=exp.global_steps, unit="step", file=sys.stderr,
               disable=not progress, dynamic_ncols=True, desc="evolution")
    try:
        while not exp.finished():
            if exp.history:  # the population was evaluated: select and mutate before training again
                exp.evolve()
            stats = exp.run_generation()
            elapsed = time.perf_counter() - t0
            bar.update(stats.global_steps - bar.n)
            bar.set_postfix(gen=stats.generation, best=f"{stats.best_fitness:.1f}",
                            mean=f"{stats.mean_fitness:.1f}",
                            sps=f"{(exp.global_steps - steps0) / max(elapsed, 1e-9):.0f}")
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    run_dir = Path(run_dir or Path(cfg.output_dir) / f"{cfg.name}-seed{cfg.seed}")
    elite_path = exp.save_elite(run_dir / "elite")
    exp.save(run_dir / "population")
    return exp.result(wall, exp.global_steps - steps0, str(elite_path.resolve()))
