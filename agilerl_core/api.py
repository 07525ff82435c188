"""The Python API: evolve a population in this process, load any saved member, act with it.

    import agilerl_core as ac

    result = ac.evolve("deployments/configs/cartpole_dqn.yaml", env=MyEnv, overrides={"max_env_steps": 20_000})
    action = result.best.predict(obs)                          # the best member ever (result.elite: the last)
    champion = ac.load("runs/cartpole-dqn-latest/best")        # the newest run of that name; or s3://.../elite

:func:`evolve` is the engine's in-process loop (no Prefect, no MLflow: ``flows.run`` is the same run as a
tracked Prefect flow). :func:`load` reads a checkpoint as data (safetensors + JSON, checksums verified,
nothing it names imported or called). :class:`Callback` hooks the loop per member and per generation.
"""

from __future__ import annotations

import copy
import re
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agilerl_core.algorithms.saved import load_member
from agilerl_core.config import ENGINE_KINDS, ConfigKinds, ExperimentConfig
from agilerl_core.envs.make import bind_env_factory, resolve_env_id
from agilerl_core.errors import CheckpointError, ConfigError
from agilerl_core.hpo.population import Member
from agilerl_core.io.checkpoint import MEMBER_FORMAT, _member_record, _read_json, save_member
from agilerl_core.limits import Limits, applied
from agilerl_core.results import GenerationStats, RunResult, TrainResult

PIPELINE_SECTIONS = ("runner", "tracking", "schedule")  # what a pipeline YAML adds (tasks.config); never read here


class Policy:
    """A member ready to act: a run's elite, one of its population, or a loaded checkpoint.

    RL members act with :meth:`predict`; LLM members (LoRA adapters on a shared base) write with
    :meth:`generate`. A member of a finished :func:`evolve` run is live (what the run left); :meth:`save`
    writes it as a checkpoint :func:`load` reads back."""

    def __init__(self, member: Member, env: dict[str, Any]) -> None:
        self.member = member
        self.env = dict(env)  # what the member acts in, as a label: never imported or called
        self._draws: _Draws | None = None  # predict(deterministic=False)'s own fork of the member's random state

    @property
    def agent(self) -> Any:
        """The underlying agent (an RL algorithm's agent, or an LLM member)."""
        return self.member.agent

    @property
    def kind(self) -> str:
        """``"llm"`` for an LLM member, ``"language"`` for a language-game agent (Wordle), ``"rl"`` otherwise."""
        kind = self.env.get("kind")
        return kind if kind in ("llm", "language") else "rl"

    @property
    def algorithm(self) -> str:
        """The algorithm's name in the registry (``dqn``, ``ppo``, ``grpo``, ``ilql``...)."""
        return str(getattr(self.agent, "name", None) or self.agent.algorithm_name)

    @property
    def member_id(self) -> int:
        """The member's id in its run's lineage."""
        return self.member.member_id

    @property
    def fitness(self) -> float | None:
        """Its last evaluation (None before any)."""
        return self.member.fitness

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """Its (evolved) hyperparameters."""
        return self.agent.hp.model_dump()

    @property
    def observation_space(self) -> Any:
        """The observation space :meth:`predict` takes (a Dict keyed by agent id for a team); None for LLM and
        language members."""
        spec = None if self.kind != "rl" else getattr(self.agent, "env_spec", None)  # an ippo team has no obs_spec
        return None if spec is None else spec.space

    def __repr__(self) -> str:
        return (f"Policy({self.algorithm}, member {self.member_id}, fitness {self.fitness}, "
                f"env {self.env.get('env_id') or self.env.get('kind')})")

    # ---- acting -------------------------------------------------------------------------------------------
    def predict(self, obs: Any, action_mask: Any = None, deterministic: bool = True) -> Any:
        """Actions as the env takes them (a Box's bounds applied): the greedy ones, or with
        ``deterministic=False`` drawn from the member's exploration policy, as it collects experience in training:

        - ``ppo`` (and each ``ippo``/``mappo`` learner): sampled from the categorical (masked) or Gaussian policy;
        - ``sac``, ``cql``: sampled from the squashed Gaussian;
        - ``td3``, ``ddpg``, ``maddpg``, ``matd3``: the actor plus the member's Gaussian or Ornstein-Uhlenbeck
          exploration noise (clipped to the bounds; a team's Discrete agents sample their softmax);
        - ``dqn``, ``rainbow``, ``cqn``: epsilon-greedy at the member's current epsilon (``eps_start`` decayed
          over the env steps it collected: an offline ``cqn`` member, which collected none, acts at
          ``eps_start``), with fresh parameter noise for noisy networks (Rainbow);
        - ``bc``: greedy (it has no exploration policy);
        - a member still in its warm-up (``random_steps`` not yet collected): uniform random actions.

        A language-game member (``kind: language``) takes a Wordle transcript (whole turns ``guess marks\n``, or
        ``""`` for a new game), or a list of them, and returns its greedy next guess (or a list).

        The draws come from this Policy's own copy of the member's generators, taken at its first such call: they
        are reproducible (the same member, or its checkpoint loaded, draws the same sequence) and leave the
        member's own stream, which its training reads, untouched. Unlike Stable-Baselines3, where
        ``deterministic`` defaults to False, the default here is the greedy action.

        `obs` is one observation as the env returns it (inside the wrappers the run's ``env_wrappers`` named:
        the checkpoint records them, ``policy.env["env_wrappers"]``, but never applies them), or a batch of
        them (a leading batch axis): an array;
        a dict of arrays for a Dict observation space; for a multi-agent team, a dict keyed by agent id (the
        actions come back the same way). One observation gives one action, a batch a batch. `action_mask`
        (single-agent): the env's valid actions, shaped like the actions. A wrong shape raises ValueError
        naming the shape the member was trained on.

        A recurrent member (``network.rnn``) remembers: each call continues the episodes of the previous one
        (one env per row); call :meth:`reset` before new episodes, and ``reset(done)`` with the envs whose
        episode ended."""
        if self.kind == "llm":
            raise TypeError("predict: an LLM member writes text; call generate(prompts)")
        if self.kind == "language":  # a transcript (whole turns "guess marks\n") in, the next guess out
            from agilerl_core.arenas.language import next_guesses

            one = isinstance(obs, str)
            guesses = next_guesses(self.agent, [obs] if one else list(obs))
            return guesses[0] if one else guesses
        spec = self.agent.env_spec  # the spaces it acts in: an ObsSpec, a team's MultiAgentSpec
        wrappers = [w.get("wrapper") for w in self.env.get("env_wrappers") or [] if isinstance(w, dict)]
        batched, obs = _as_batch(obs, spec, f" (the env inside {', '.join(map(str, wrappers))})" if wrappers else "")
        mask = None if action_mask is None else np.asarray(action_mask, dtype=bool)
        if mask is not None and not batched:
            mask = mask[None]
        if not isinstance(deterministic, bool | np.bool_):
            raise TypeError(f"predict: deterministic={deterministic!r}; give True (the greedy action) or False (a "
                            f"draw from the member's exploration policy)")
        with torch.no_grad():
            tensors = spec.to_tensors(obs, self.agent.device)
            if deterministic:
                actions = self.agent.env_action(tensors, mask)
            else:
                if self._draws is None:
                    self._draws = _Draws(self.agent)
                actions = self._draws.sample(tensors, mask)
        if isinstance(actions, dict):
            return actions if batched else {k: v[0] for k, v in actions.items()}
        actions = np.asarray(actions)
        return actions if batched else actions[0]

    def reset(self, done: Any = None) -> None:
        """A recurrent member forgets every env's episode (`done` None) or those where `done` is set; a
        no-op for feed-forward members."""
        if self.kind == "rl":
            self.agent.reset_memory(None if done is None else np.atleast_1d(np.asarray(done, dtype=bool)))

    def generate(self, prompts: str | Sequence[str], max_new_tokens: int | None = None, temperature: float = 0.0,
                 seed: int = 0) -> str | list[str]:
        """Completions of prompt texts (greedy at temperature 0; rendered through the chat template when the
        run used it). One prompt gives one completion, a list a list."""
        if self.kind != "llm":
            raise TypeError(f"generate: a {self.algorithm} member acts in an env; call predict(obs)")
        one = isinstance(prompts, str)
        texts = self.agent.generate([prompts] if one else [str(p) for p in prompts],
                                    bool(self.env.get("chat_template")), max_new_tokens, float(temperature), int(seed))
        return texts[0] if one else texts

    def save(self, path: str | Path) -> Path:
        """Write this member as a checkpoint directory (what :func:`load` reads)."""
        return save_member(path, self.member, self.env)


class _Draws:
    """A Policy's own copy of its member's random state (numpy and torch generators, exploration noise processes),
    taken once: ``predict(deterministic=False)`` runs the member's own exploration code (``explore_action``, a
    group of one for teams) with this copy swapped in, so its draws are reproducible and the member's stream
    (what its training draws next) is left as it was."""

    _STATE = ("np_rng", "torch_gen", "_noise")  # what an agent's exploration reads and advances

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.units = list(agent.learners.values()) if hasattr(agent, "learners") else [agent]  # ippo: per unit
        self.forks = [{name: self._fork(getattr(u, name)) for name in self._STATE if hasattr(u, name)}
                      for u in self.units]

    @staticmethod
    def _fork(value: Any) -> Any:
        if isinstance(value, torch.Generator):
            gen = torch.Generator(device=value.device)
            gen.set_state(value.get_state())
            return gen
        return copy.deepcopy(value)  # a numpy Generator, a noise process (or None)

    def sample(self, obs: Any, mask: Any) -> Any:
        """Exploration actions as the env takes them, drawn with this copy of the random state."""
        own = [{name: getattr(u, name) for name in fork} for u, fork in zip(self.units, self.forks, strict=True)]
        try:
            for u, fork in zip(self.units, self.forks, strict=True):
                for name, value in fork.items():
                    setattr(u, name, value)
            if hasattr(self.agent, "learners"):  # a team of PPO learners (ippo/mappo): each unit samples its rows
                return self.agent.env_actions(self._team_sample(obs, mask))
            actions = self.agent.explore_action(obs, mask)
            return self.agent.env_actions(actions) if isinstance(actions, dict) else \
                self.agent.action_spec.to_env(actions)
        finally:
            for u, fork, mine in zip(self.units, self.forks, own, strict=True):
                for name in fork:
                    fork[name] = getattr(u, name)  # a process replaced on a new batch size is kept
                    setattr(u, name, mine[name])

    def _team_sample(self, obs: Any, mask: Any) -> dict[str, np.ndarray]:
        """Each agent's sampled actions of an ippo/mappo team: its unit's PPO learner samples the unit's agents'
        rows stacked (as ``greedy_action`` stacks them), a centralised critic reading the joint observation."""
        agent, out = self.agent, {}
        for u, learner in agent.learners.items():
            agents = agent.units[u]
            unit_mask = None if mask is None or mask.get(agents[0]) is None else agent.stack(u, mask)
            acts = learner.policy_step({"obs": agent.stack(u, obs)}, unit_mask, agent.critic_input(u, obs))[0]
            n = obs[agents[0]].shape[0]
            out.update({a: acts[i * n:(i + 1) * n] for i, a in enumerate(agents)})
        return out


def _as_batch(obs: Any, spec: Any, wrapped: str = "") -> tuple[bool, Any]:
    """(whether `obs` was a batch, `obs` with a leading batch axis), checked against the spec's spaces."""
    agents = getattr(spec, "agents", None)
    if agents is not None:  # a team: {agent_id: obs}
        if not isinstance(obs, dict) or set(obs) != set(agents):
            raise ValueError(f"predict: a team's observations are a dict keyed by agent id {list(agents)}, got "
                             f"{sorted(obs) if isinstance(obs, dict) else type(obs).__name__}")
        parts = {a: (np.asarray(obs[a]), tuple(spec.obs[a].space.shape)) for a in agents}
    elif getattr(spec, "is_dict", False):
        keys = list(spec.space.spaces)
        if not isinstance(obs, dict) or set(obs) != set(keys):
            raise ValueError(f"predict: this member observes a Dict with keys {keys}; got "
                             f"{sorted(obs) if isinstance(obs, dict) else type(obs).__name__}")
        parts = {k: (np.asarray(obs[k]), tuple(spec.space.spaces[k].shape)) for k in keys}
    else:
        parts = {"obs": (np.asarray(obs), tuple(spec.space.shape))}
    kinds = set()
    for key, (arr, shape) in parts.items():
        if arr.shape == shape:
            kinds.add(False)
        elif arr.shape[1:] == shape:
            kinds.add(True)
        else:
            where = "" if key == "obs" else f"[{key!r}]"
            raise ValueError(f"predict: observation{where} has shape {arr.shape}; this member was trained on "
                             f"observations of shape {shape} (one) or (batch, *{shape}) (a batch){wrapped}")
    if len(kinds) != 1:
        raise ValueError("predict: mix of one observation and a batch across keys; give every key the same form")
    batched = kinds.pop()
    out = {k: (a if batched else a[None]) for k, (a, _) in parts.items()}
    return batched, out if agents is not None or getattr(spec, "is_dict", False) else out["obs"]


# ---- callbacks ----------------------------------------------------------------------------------------------
class Callback:
    """Hooks into an evolution run; override what you need. Exceptions propagate (they stop the run).

    - :meth:`on_member_trained` after each member's training phase, before evaluation;
    - :meth:`on_generation` after each generation is evaluated (and, in a flow, committed): return True to
      stop the run there (the elite, the population and, in a flow, the champion are still saved).

    A plain function passed as a callback is called as :meth:`on_generation`."""

    def on_member_trained(self, slot: int, member: Policy, result: TrainResult) -> None:
        """Member `slot` finished training this generation (`result`: env steps, mean return, loss...)."""

    def on_generation(self, stats: GenerationStats, population: list[Policy]) -> bool | None:
        """Generation `stats.generation` is evaluated (`population`: the members by slot, fitness set).
        Return True to stop the run after it."""
        return None


class _FunctionCallback(Callback):
    def __init__(self, fn: Callable[[GenerationStats, list[Policy]], bool | None]) -> None:
        self.fn = fn

    def on_generation(self, stats: GenerationStats, population: list[Policy]) -> bool | None:
        return self.fn(stats, population)


def as_callbacks(callbacks: Sequence[Callback | Callable] | Callback | None) -> list[Callback]:
    """Callback objects from what a caller passed (a Callback, a function, a list of them)."""
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback) or not isinstance(callbacks, Sequence):
        callbacks = [callbacks]
    out = []
    for i, cb in enumerate(callbacks):
        if isinstance(cb, Callback):
            out.append(cb)
        elif callable(cb):
            out.append(_FunctionCallback(cb))
        else:
            raise ConfigError(f"callbacks[{i}]: a {type(cb).__name__} is neither a Callback nor a function of "
                              f"(stats, population)")
    return out


class CallbackHooks:
    """The callbacks of one run, called with the run's members as :class:`Policy` views."""

    def __init__(self, callbacks: Sequence[Callback | Callable] | Callback | None, env: dict[str, Any]) -> None:
        self.callbacks = as_callbacks(callbacks)
        self.env = env
        self.stopped_by: str | None = None

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def member_trained(self, members: list[Member], result: TrainResult) -> None:
        for cb in self.callbacks:
            cb.on_member_trained(result.slot, Policy(members[result.slot], self.env), result)

    def generation(self, stats: GenerationStats, members: list[Member]) -> bool:
        """Call every on_generation; True when one asked to stop (all are called first)."""
        population = [Policy(m, self.env) for m in members]
        stop = [cb for cb in self.callbacks if cb.on_generation(stats, population) is True]
        if stop:
            self.stopped_by = type(stop[0]).__name__ if not isinstance(stop[0], _FunctionCallback) \
                else getattr(stop[0].fn, "__name__", "function")
        return bool(stop)


# ---- evolve -------------------------------------------------------------------------------------------------
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
        progress: show a progress bar (stderr).
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
    from agilerl_core.experiment import build_evolution, default_run_dir, point_latest, train_local

    cfg, left_out = resolve_config(config, overrides, env)
    if env is not None and "name" not in cfg.model_fields_set:  # runs of an env are named after it
        cfg = cfg.model_copy(update={"name": env_run_name(env, cfg.name)})
    runner = left_out.get("runner")
    moved = [k for k in ("batch_members", "group_size") if isinstance(runner, dict) and k in runner]
    if moved:  # the pipeline's other sections (tracking, schedule, the runner's kind) mean nothing in-process
        warnings.warn(f"evolve: the config's runner.{' and runner.'.join(moved)} are read by the pipeline "
                      f"(flows.run, agilerl-flow run), not in-process; pass {'= / '.join(moved)}= to evolve",
                      stacklevel=2)
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ConfigError(f"group_size: {group_size!r}; give a whole number >= 1 or None (no limit)")
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


# ---- load ---------------------------------------------------------------------------------------------------
def load(uri: str | Path, device: str = "cpu", limits: Limits | dict[str, Any] | None = None) -> Policy:
    """A saved member ready to act: a member directory (a run's ``elite/``, ``population/members/N``, a
    registered champion's ``member`` artifact), local or ``s3://bucket/prefix/...`` (read with the standard AWS
    environment: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``).

    The checkpoint is data: safetensors and JSON, every file's checksum verified; nothing it names is
    imported, registered or called. An LLM member rebuilds its base from the recorded path or config and
    refuses a base whose weights hash differently. Every size the files declare is checked against the limit
    table before anything is allocated (`limits` raises entries for this load, e.g. ``{"layer_width": 16384}``:
    see docs/security.md).

    Raises:
        CheckpointError: the URI holds no member, or a file is missing, truncated or tampered with.
        StorageError: the S3 store cannot be read (credentials, bucket).
    """
    with applied(limits):
        return _load(uri, device)


def _load(uri: str | Path, device: str) -> Policy:
    text = str(uri)
    if text.startswith("s3://"):
        from agilerl_core.io.storage import open_storage

        parent, _, name = text.rstrip("/").rpartition("/")
        if not name or parent == "s3:/":
            raise CheckpointError(f"{text}: name a member directory, e.g. s3://bucket/runs/RUN/elite")
        with tempfile.TemporaryDirectory(prefix="agilerl-load-") as tmp:
            local = open_storage(parent).download_dir(name, Path(tmp) / "member")
            return _load_dir(local, text, device)
    return _load_dir(Path(uri), text, device)


def _load_dir(path: Path, where: str, device: str) -> Policy:
    if not (path / "member.json").exists() and not (path / "member.json").is_symlink():  # other kinds: named below
        hint = ""
        if (path / "elite" / "member.json").is_file():
            hint = f"; the run's elite is {where.rstrip('/')}/elite"
        elif (path / "population.json").is_file():
            hint = f"; a population: load one member, e.g. {where.rstrip('/')}/members/0"
        raise CheckpointError(f"{where}: no member checkpoint there (member.json){hint}")
    from agilerl_core.io.run_store import verify_committed

    verify_committed(path)  # a member of a committed generation: its files checked against the manifest
    meta = _read_json(path / "member.json", MEMBER_FORMAT, path)
    env = meta.get("env") if isinstance(meta.get("env"), dict) else {}
    if env.get("kind") == "llm":
        from agilerl_core.arenas.llm import load_llm_member

        agent, env = load_llm_member(str(path), device)
        record = _member_record(meta, str(path / "member.json"))  # every field checked
        member = Member(record["member_id"], agent, *record["rest"])
        return Policy(member, env)
    if env.get("kind") == "language":
        from agilerl_core.arenas.language import load_language_member

        agent, env = load_language_member(str(path))
        record = _member_record(meta, str(path / "member.json"))
        return Policy(Member(record["member_id"], agent, *record["rest"]), env)
    member, env = load_member(path, device=device)
    return Policy(member, env)
