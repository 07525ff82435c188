"""Evolve a population in this process: :func:`evolve`, what it returns (:class:`EvolveResult`), and how it reads
the config it is given (:func:`resolve_config`) and names its run (:func:`env_run_name`)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agilerl_core.api.callbacks import Callback, CallbackHooks
from agilerl_core.api.policy import Policy
from agilerl_core.config import ENGINE_KINDS, ConfigKinds, ExperimentConfig
from agilerl_core.envs.make import bind_env_factory, resolve_env_id
from agilerl_core.errors import BudgetWarning, ConfigError
from agilerl_core.results import GenerationStats, RunResult

PIPELINE_SECTIONS = ("runner", "tracking", "schedule")  # what a pipeline YAML adds (tasks.config); never read here


@dataclass(repr=False)
class EvolveResult:
    """What :func:`evolve` returns. Deploy :attr:`best`: the final elite can be worse than a member an earlier
    generation had (an elite that trains on can collapse)."""

    elite: Policy
    """The final population's best member (saved under ``run_dir/elite``)."""
    best: Policy
    """The best member the run ever evaluated, re-scored on fresh seeds against the final elite (the pipeline's
    champion rule; saved under ``run_dir/best``): the one to deploy."""
    population: list[Policy]
    """The final population by slot (saved under ``run_dir/population``)."""
    history: list[GenerationStats]
    """One entry per generation: fitnesses, mutations, hyperparameters..."""
    run: RunResult
    """The run's figures: best and elite fitness, steps, wall time, env steps/s, batching, the champion choice."""
    run_dir: Path
    """The run's own directory (``OUTPUT_DIR/NAME-sSEED-TIMESTAMP`` unless ``run_dir=`` was given)."""
    config: Any
    """The validated config the run used."""
    stopped_by: str | None = None
    """The callback that stopped the run early, if one did."""
    summary: dict[str, Any] = field(default_factory=dict)
    """The run's JSON summary (as the CLI prints it)."""

    def __repr__(self) -> str:
        return (f"EvolveResult(best={self.best!r}, elite={self.elite!r}, generations={len(self.history)}, "
                f"best_fitness={self.best_fitness:.4g}, run_dir={str(self.run_dir)!r})")

    @property
    def best_fitness(self) -> float:
        """The best evaluation of any member in any generation."""
        return self.run.best_fitness

    @property
    def best_params(self) -> dict[str, Any]:
        """The champion's mutable hyperparameters (as an Optuna study's ``best_params``); :attr:`found` has how
        they moved along its line and where the final population stands."""
        return dict((self.run.found or {}).get("values", {}))

    @property
    def found(self) -> dict[str, Any] | None:
        """What the run found (:func:`agilerl_core.hpo.found.found_hyperparameters`)."""
        return self.run.found

    @property
    def found_config(self) -> Path | None:
        """The config that re-runs from :attr:`best_params` (``run_dir/found_config.yaml``)."""
        return Path(self.run.found_config_uri) if self.run.found_config_uri else None


def resolve_config(config: Any, overrides: dict[str, Any] | None = None, env: Any = None,
                   kinds: ConfigKinds = ENGINE_KINDS, leave_out: tuple[str, ...] = PIPELINE_SECTIONS
                   ) -> tuple[Any, dict[str, Any]]:
    """`config` (a YAML path, a dict or a config object) validated with `overrides` applied and, when `env` (an
    env factory) is given, its env id replaced by the factory's in-process label (a config may then leave
    ``env_id`` out); `env` as a string is an env id (``"CartPole-v1"``, ``module:EnvId``) that replaces the
    config's ``env_id`` (and its ``env_entry_point``), an unregistered Gymnasium id refused naming `env`. The
    pipeline's sections `leave_out` are left out (named in the second item). Refused, naming the field, where
    the factory would have to be built in another process."""
    if isinstance(env, str):  # a registered id (or module:EnvId) names the config's env_id, as a config would
        if not env.strip():
            raise ConfigError("env: an empty env id; pass a Gymnasium id such as env=\"CartPole-v1\", or a function "
                              "or class that builds the env")
        label = env
    else:
        label = None if env is None else bind_env_factory(env, "env")
    cfg, left_out = kinds.resolve(config, overrides, leave_out, env_id=label)
    if isinstance(env, str) and cfg.kind in ("gym", "offline") and cfg.env_backend in ("gymnasium", "gymnasium_async"):
        try:  # checked here, so the refusal names the argument the id came from
            resolve_env_id(cfg.env_id)
        except ConfigError as err:
            raise ConfigError(f"env: {str(err).removeprefix('env_id: ')}") from None
    if label is not None and not isinstance(env, str) and cfg.kind == "multi_agent" and cfg.vector_workers > 0:
        raise ConfigError(f"vector_workers: {cfg.vector_workers} worker processes cannot build an env factory "
                          f"given as env= (it exists only in this process); set vector_workers: 0, or register "
                          f"the env in an importable module and name it as env_id module:env")
    return cfg, left_out


def evolve(config: str | Path | dict[str, Any] | ExperimentConfig, *, env: Callable[..., Any] | str | None = None,
           overrides: dict[str, Any] | None = None, callbacks: Sequence[Callback | Callable] | None = None,
           progress: bool = True, run_dir: str | Path | None = None, batch_members: bool = True,
           group_size: int | None = None) -> EvolveResult:
    """Evolve a population in this process until the target fitness, the step budget or a callback stops it.

    Args:
        config: a YAML path, a dict of config fields, or a config object (``validate_config``). The
            pipeline's sections (runner, tracking, schedule) are not read here (a warning names them).
        env: a Gymnasium env id (``"Acrobot-v1"``, ``"module:EnvId"``), which sets the config's ``env_id``;
            or a function or class that builds a new Gymnasium env on each call (a PettingZoo parallel env for
            multi-agent configs), which replaces ``env_id`` in this process (``env_kwargs`` are passed to it).
            A factory cannot travel to other processes by name: configs using it run in this process only.
        overrides: dotted config fields, e.g. ``{"hyperparameters.lr": 3e-4, "max_env_steps": 20_000}``.
        callbacks: :class:`Callback` objects, or functions ``(stats, population) -> bool | None`` called after
            each generation (True stops the run).
        progress: show a progress bar on stderr when it is a terminal, else one line per generation (a log
            file, CI); False: the lines, never a bar.
        run_dir: where the elite, the best member and the population are saved (default: a new directory
            ``OUTPUT_DIR/NAME-sSEED-TIMESTAMP`` per run, with ``OUTPUT_DIR/NAME-latest`` pointing at the newest;
            NAME is the config's ``name``, else the env's, e.g. ``corridor`` for a ``Corridor`` class).
        batch_members: members of one architecture learn as one stacked group (False: one by one).
        group_size: at most this many members per group (None: no limit).

    Returns:
        An :class:`EvolveResult`: ``best`` (the member to deploy: the final elite or the best member of any
        generation, whichever scores higher on fresh seeds, as the pipeline's champion), ``elite`` (the final
        population's best) and ``population`` (each with ``predict`` / ``generate``), ``history`` and the run's
        figures.

    Raises:
        ConfigError: a bad config, override, env or callback, naming the field, before anything trains.
    """
    from agilerl_core.code_refs import import_config_modules
    from agilerl_core.experiment import build_evolution, default_run_dir, point_latest, train_local

    cfg, left_out = resolve_config(config, overrides, env)
    import_config_modules(cfg)  # modules the config names, found beside the user as `python -m` finds them
    if env is not None and "name" not in cfg.model_fields_set:  # runs of an env are named after it
        cfg = cfg.model_copy(update={"name": env_run_name(env, cfg.name)})
    runner = left_out.get("runner")
    moved = [k for k in ("batch_members", "group_size") if isinstance(runner, dict) and k in runner]
    if moved:  # the pipeline's other sections (tracking, schedule, the runner's kind) are left out quietly
        warnings.warn(f"evolve: the config's runner.{' and runner.'.join(moved)} are read by the pipeline "
                      f"(flows.run, agilerl-flow run), not in-process; pass {'= / '.join(moved)}= to evolve",
                      stacklevel=2)
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ConfigError(f"group_size: {group_size!r}; give a whole number >= 1 or None (no limit)")
    note = cfg.budget_note()
    if note:  # once, before anything trains
        warnings.warn(f"evolve: {note}", BudgetWarning, stacklevel=2)
    explicit_dir = run_dir is not None
    run_dir = Path(run_dir or default_run_dir(cfg))  # inside output_dir, checked before anything is built
    hooks = CallbackHooks(callbacks, {})
    evo = build_evolution(cfg, batch_members, group_size)
    hooks.env = evo.arena.env_desc
    res = train_local(cfg, progress=progress, run_dir=run_dir, evolution=evo, hooks=hooks)
    if not explicit_dir:
        point_latest(cfg, run_dir)
    population = [Policy(m, evo.arena.env_desc) for m in evo.population.members]
    elite = population[evo.population.members.index(evo.population.elite())]
    best = next((p for p in population if p.member is res.best_member), None) or Policy(res.best_member,
                                                                                         evo.arena.env_desc)
    summary = {**res.summary(), "run_dir": str(run_dir), "stopped_by": hooks.stopped_by}
    return EvolveResult(elite, best, population, list(res.history), res, run_dir, cfg, hooks.stopped_by, summary)


def env_run_name(env: Any, default: str) -> str:
    """A run name from the env given to :func:`evolve`: its id (a string) or its class's or function's name,
    lowercased, with anything but letters, digits, ``_``, ``-`` and ``.`` dropped (`default` when nothing is
    left)."""
    raw = env if isinstance(env, str) else getattr(env, "__name__", "") or type(env).__name__
    name = re.sub(r"\.{2,}", ".", re.sub(r"[^a-z0-9_.-]+", "-", str(raw).lower())).strip("-.")[:64]
    return name or default
