"""An experiment config made into an Evolution, and the plain in-process loop that runs one.

``build_evolution`` is the one place that reads a config's kind and algorithm: the registry names the
arena, the arena checks the config against the env (and dataset) while it builds, the Evolution drives it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from agilerl_core.algorithms.registry import algorithm_info, get_algorithm
from agilerl_core.arenas import arena_class
from agilerl_core.config import ExperimentConfig
from agilerl_core.errors import ConfigError
from agilerl_core.hpo.evolution import Evolution, EvolutionSettings, RunResult
from agilerl_core.limits import applied


def build_arena(cfg: ExperimentConfig):
    """The arena of `cfg`'s kind and algorithm, built (and so checked) from it."""
    return arena_class(algorithm_info(cfg.algorithm).arenas[cfg.kind])(cfg, get_algorithm(cfg.algorithm))


def build_evolution(cfg: ExperimentConfig, batch_members: bool = True, group_cap: int | None = None) -> Evolution:
    """The Evolution of `cfg` in its arena: every check (device, env id, spaces, hyperparameter bounds,
    dataset) happens here, before anything trains or is written. Members of one batch key learn as one group
    (`batch_members`; False: each alone), at most `group_cap` members per group (None: no limit)."""
    with applied(getattr(cfg, "limits", None)):  # sizes the build reads (a dataset, an LLM base) under the config's
        arena = build_arena(cfg)
        return Evolution(arena, EvolutionSettings.from_config(cfg, arena.space, arena.arch_bounds, batch_members,
                                                              group_cap))


def default_run_dir(cfg: ExperimentConfig) -> Path:
    """OUTPUT_DIR/NAME-seedSEED, where a run keeps its elite and population; a ConfigError naming `name` when
    that directory would not be one directory inside output_dir (the name is validated already: this is the
    second check, on the joined path)."""
    root = Path(cfg.output_dir)
    run_dir = root / f"{cfg.name}-seed{cfg.seed}"
    if Path(os.path.abspath(run_dir)).parent != Path(os.path.abspath(root)):
        raise ConfigError(f"name: {cfg.name!r} would put the run's directory at {os.path.abspath(run_dir)}, outside "
                          f"output_dir {os.path.abspath(root)}; give a plain name (letters, digits, _, -, .), "
                          f"e.g. cartpole-dqn")
    return run_dir


def train_local(cfg: ExperimentConfig, progress: bool = True, run_dir: str | Path | None = None,
                evolution: Evolution | None = None, batch_members: bool = True, hooks: Any = None) -> RunResult:
    """Evolve a population until the target fitness or the budget, in this process; save the elite and the
    population under `run_dir` (default OUTPUT_DIR/NAME-seedSEED). `batch_members`: see :func:`build_evolution`.
    `hooks`: the run's callbacks (:class:`agilerl_core.api.CallbackHooks`); one may stop the run early."""
    run_dir = Path(run_dir or default_run_dir(cfg))  # checked before anything trains or is written
    evo = evolution or build_evolution(cfg, batch_members)
    on_trained = (lambda r: hooks.member_trained(evo.population.members, r)) if hooks else None
    t0 = time.perf_counter()
    steps0 = evo.global_steps
    bar = tqdm(total=cfg.max_env_steps, initial=evo.global_steps, unit="step", file=sys.stderr,
               disable=not progress, dynamic_ncols=True, desc="evolution")
    try:
        while not evo.finished():
            if evo.history:  # the population was evaluated: select and mutate before training again
                evo.evolve()
            stats = evo.run_generation(on_trained)
            elapsed = time.perf_counter() - t0
            bar.update(stats.global_steps - bar.n)
            bar.set_postfix(gen=stats.generation, best=f"{stats.best_fitness:.1f}",
                            mean=f"{stats.mean_fitness:.1f}",
                            sps=f"{(evo.global_steps - steps0) / max(elapsed, 1e-9):.0f}")
            if hooks and hooks.generation(stats, evo.population.members):
                break
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    elite_path = evo.save_elite(run_dir / "elite")
    evo.save(run_dir / "population", config=cfg.model_dump(mode="json"))
    return evo.result(wall, evo.global_steps - steps0, str(elite_path.resolve()))
