"""Vectorised env construction and early validation of env ids, your own envs included.

An env is named by a registered Gymnasium id (``CartPole-v1``), by Gymnasium's ``module:EnvId`` form (the
module is imported first, so it can register its envs), by an id plus an entry point
(``env_entry_point: my_pkg.envs:GridWorld``) that registers it when it is not registered yet, or, from
Python, by an env factory bound in this process (:func:`bind_env_factory`: ``evolve(cfg, env=MyEnv)``), which
lives only in this process and is named ``<MyEnv>``.
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from agilerl_core.code_refs import split_env_id, split_ref, split_wrapper
from agilerl_core.errors import ConfigError

if TYPE_CHECKING:
    from agilerl_core.envs.torch_classic import TorchClassicVector

_FACTORIES: dict[str, Callable[..., Any]] = {}  # in-process env factories by label (bind_env_factory)


def bind_env_factory(factory: Any, field: str = "env") -> str:
    """Bind an env factory (a class or function that builds a new env on each call, e.g. ``MyEnv`` or
    ``lambda: MyEnv(size=8)``) in this process and return the label a config's ``env_id`` names it by
    (``<MyEnv>``). A factory cannot travel to another process by name: configs naming it run in this one."""
    if isinstance(factory, str) or not callable(factory):
        what = "an env object" if hasattr(factory, "step") and hasattr(factory, "reset") else type(factory).__name__
        raise ConfigError(f"{field}: got {what}; pass a function or class that builds a new env on each call (e.g. "
                          f"{field}=MyEnv or {field}=lambda: MyEnv(size=8)): a population needs many copies")
    name = getattr(factory, "__name__", None) or type(factory).__name__
    name = re.sub(r"[^\w.-]+", "", name.replace("<lambda>", "lambda")) or "env"
    label, n = f"<{name}>", 1
    while _FACTORIES.get(label, factory) is not factory:
        n += 1
        label = f"<{name}#{n}>"
    _FACTORIES[label] = factory
    return label


def env_factory(env_id: str) -> Callable[..., Any] | None:
    """The factory bound in this process under `env_id` (None: not a bound label)."""
    factory = _FACTORIES.get(env_id)
    if factory is None and env_id.startswith("<") and env_id.endswith(">"):
        raise ConfigError(f"env_id: {env_id!r} names an env factory given to evolve()/flows.run() in another "
                          f"process; a factory cannot travel between processes. Register the env with gymnasium "
                          f"in an importable module and name it module:EnvId (or give env_entry_point)")
    return factory


def resolve_env_id(env_id: str, entry_point: str | None = None) -> str:
    """The registered id `env_id` stands for, after importing its module (``module:EnvId``) and registering
    `entry_point` under it; a ConfigError naming the field and close ids when it stays unknown. A label
    bound by :func:`bind_env_factory` stands for itself."""
    if env_factory(env_id) is not None:
        return env_id
    module, name = split_env_id(env_id)  # as Gymnasium reads it: one colon, a module name before it
    if module is not None:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"env_id: {env_id!r} names module {module!r}, which cannot be imported ({err}); "
                              f"install the package that provides it or add its folder to PYTHONPATH") from None
    if entry_point is not None and name not in gym.registry:
        module, attr = split_ref(entry_point, "env_entry_point")
        try:
            found = getattr(importlib.import_module(module), attr, None)
        except ImportError as err:
            raise ConfigError(f"env_entry_point: module {module!r} cannot be imported ({err}); install the "
                              f"package that provides it or add its folder to PYTHONPATH") from None
        if not callable(found):
            raise ConfigError(f"env_entry_point: {entry_point!r} must name a class or function as module:Name, "
                              f"e.g. my_pkg.envs:GridWorld")
        gym.register(name, entry_point=entry_point)
    if name in gym.registry:
        return name
    close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ConfigError(f"env_id: {env_id!r} is not a registered Gymnasium environment.{hint} Install the package "
                      f"that registers it, fix the id, name its module as module:EnvId, or give env_entry_point "
                      f"(module:Class) to register your own env.")


def check_env_id(env_id: str, entry_point: str | None = None) -> None:
    """Raise a ConfigError naming close registered ids when `env_id` is unknown."""
    resolve_env_id(env_id, entry_point)


def make_env(env_id: str, env_kwargs: dict[str, Any] | None = None, entry_point: str | None = None) -> gym.Env:
    """Build one env, turning construction failures into ConfigErrors."""
    name = resolve_env_id(env_id, entry_point)
    factory = env_factory(name)
    if factory is not None:
        return _from_factory(name, factory, env_kwargs)
    try:
        return gym.make(name, **(env_kwargs or {}))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"env_kwargs: gymnasium.make({env_id!r}, **env_kwargs) failed: {err}") from None
    except gym.error.DependencyNotInstalled as err:
        raise ConfigError(f"env_id: {env_id!r} needs an optional dependency: {err}") from None


def _from_factory(label: str, factory: Callable[..., Any], env_kwargs: dict[str, Any] | None) -> gym.Env:
    try:
        env = factory(**(env_kwargs or {}))
    except TypeError as err:
        raise ConfigError(f"env_kwargs: the env factory {label} failed with env_kwargs {env_kwargs or {}}: {err}") \
            from None
    if not isinstance(env, gym.Env):
        raise ConfigError(f"env: the factory {label} built a {type(env).__name__}, not a gymnasium.Env (for "
                          f"multi-agent configs: a PettingZoo parallel env)")
    return env


def resolve_wrapper(name: str, field: str, vector: bool = False) -> type:
    """The wrapper class `name` (module.Name or module:Name) names: a gymnasium.Wrapper (a VectorWrapper for
    vector wrappers); a ConfigError naming `field` otherwise."""
    module, attr = split_wrapper(name, field)
    try:
        found = getattr(importlib.import_module(module), attr, None)
    except ImportError as err:
        raise ConfigError(f"{field}: module {module!r} cannot be imported ({err}); install the package that "
                          f"provides it or fix the name") from None
    base = gym.vector.VectorWrapper if vector else gym.Wrapper
    if not (isinstance(found, type) and issubclass(found, base)):
        want = f"{base.__module__}.{base.__name__}"
        what = ("not found" if found is None else f"a class that is not a {want}" if isinstance(found, type)
                else f"a {type(found).__name__}, not a {want}")
        hint = (" (env_wrappers take wrappers of one env, vector_wrappers those of gymnasium.wrappers.vector)"
                if isinstance(found, type) and issubclass(found, gym.vector.VectorWrapper | gym.Wrapper) else "")
        raise ConfigError(f"{field}: {name!r} is {what}{hint}")
    return found


def _wrapped(env: Any, wrappers: Sequence[Any], field: str, evaluation: bool, vector: bool = False) -> Any:
    """`env` inside `wrappers` (WrapperConfig-like: wrapper, kwargs, eval_kwargs), in order."""
    for i, w in enumerate(wrappers):
        cls = resolve_wrapper(w.wrapper, f"{field}[{i}].wrapper", vector)
        kwargs = {**w.kwargs, **(w.eval_kwargs or {})} if evaluation else dict(w.kwargs)
        try:
            env = cls(env, **kwargs)
        except gym.error.DependencyNotInstalled as err:
            raise ConfigError(f"{field}[{i}].wrapper: {w.wrapper} needs an optional dependency: {err}") from None
        except (TypeError, ValueError, gym.error.Error) as err:
            raise ConfigError(f"{field}[{i}].kwargs: {w.wrapper}(env, **{kwargs}) failed: {err}") from None
    return env


@dataclass(frozen=True)
class EnvRecipe:
    """How a config's envs are built: the env (an id, ``module:EnvId``, an entry point or a factory bound in
    this process), its kwargs, and the wrappers around every copy (``env_wrappers``: training, evaluation and
    dataset collection alike, evaluation with its ``eval_kwargs``) and around each training vector env
    (``vector_wrappers``)."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    entry_point: str | None = None
    wrappers: tuple[Any, ...] = ()
    vector_wrappers: tuple[Any, ...] = ()
    backend: str = "gymnasium"  # or envpool (agilerl_core.envs.envpool_backend), torch (envs.torch_classic)
    compile: bool = False  # backend torch: the envs' step compiled (compile_envs)

    @classmethod
    def of(cls, cfg: Any) -> EnvRecipe:
        """The recipe a Gymnasium or offline config names."""
        return cls(cfg.env_id, dict(cfg.env_kwargs), cfg.env_entry_point, tuple(getattr(cfg, "env_wrappers", ())),
                   tuple(getattr(cfg, "vector_wrappers", ())), getattr(cfg, "env_backend", "gymnasium"),
                   bool(getattr(cfg, "compile_envs", False)))

    def check(self) -> None:
        """The fast check before anything starts: the env id and every wrapper resolve (ConfigErrors naming the
        field)."""
        if self.backend == "envpool":
            from agilerl_core.envs.envpool_backend import check_envpool_id

            if self.env_id in _FACTORIES:
                raise ConfigError("env_backend: envpool builds its envs by task id; an env factory (env=) runs with "
                                  "env_backend: gymnasium")
            check_envpool_id(self.env_id)
            return
        if self.backend == "torch":
            from agilerl_core.envs.torch_classic import check_torch_env

            if self.env_id in _FACTORIES:
                raise ConfigError("env_backend: torch steps its own classic-control envs by id; an env factory (env=) "
                                  "runs with env_backend: gymnasium")
            check_torch_env(self.env_id, self.kwargs)
            return
        check_env_id(self.env_id, self.entry_point)
        for i, w in enumerate(self.wrappers):
            resolve_wrapper(w.wrapper, f"env_wrappers[{i}].wrapper")
        for i, w in enumerate(self.vector_wrappers):
            resolve_wrapper(w.wrapper, f"vector_wrappers[{i}].wrapper", vector=True)

    def make(self, evaluation: bool = False) -> gym.Env:
        """One wrapped env."""
        return _wrapped(make_env(self.env_id, self.kwargs, self.entry_point), self.wrappers, "env_wrappers",
                        evaluation)

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        """(observation_space, action_space) of one wrapped env: what members see and checkpoints record."""
        if self.backend == "envpool":
            self.check()
            env = self.vector(1)
            try:
                return env.single_observation_space, env.single_action_space
            finally:
                env.close()
        if self.backend == "torch":
            from agilerl_core.envs.torch_classic import TorchClassicVector

            self.check()
            one = TorchClassicVector(self.env_id, 1, "cpu", self.kwargs)
            return one.single_observation_space, one.single_action_space
        env = self.make()
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()

    def vector(self, num_envs: int, evaluation: bool = False) -> Any:
        """`num_envs` wrapped copies in a synchronous vector env with same-step autoreset (see
        :func:`make_vector_env`; envpool's C++ envs with the same semantics for ``backend: envpool``); the vector
        wrappers come per training phase (:meth:`for_training`). ``backend: torch``: the tensor envs of
        :meth:`torch_vector` on the cpu behind Gymnasium's numpy API."""
        if self.backend == "torch":
            return self.torch_vector(num_envs, "cpu").as_gymnasium()
        if self.backend == "envpool":
            from agilerl_core.envs.envpool_backend import EnvpoolVector

            self.check()
            return EnvpoolVector(self.env_id, num_envs, self.kwargs)
        self.make(evaluation).close()  # validate once with a clear error
        one = lambda: self.make(evaluation)  # noqa: E731
        if self.backend == "gymnasium_async":  # forked workers: the recipe (a bound factory too) goes with them
            envs = AsyncVectorEnv([one for _ in range(num_envs)], context="fork",
                                  autoreset_mode=AutoresetMode.SAME_STEP)
        else:
            envs = SyncVectorEnv([one for _ in range(num_envs)], autoreset_mode=AutoresetMode.SAME_STEP)
        if self.vector_wrappers:  # validated now, before any work
            _wrapped(envs, self.vector_wrappers, "vector_wrappers", False, vector=True)
        return envs

    def torch_vector(self, num_envs: int, device: Any) -> TorchClassicVector:
        """``backend: torch`` only: `num_envs` copies as a
        :class:`~agilerl_core.envs.torch_classic.TorchClassicVector` on `device` (tensors in, tensors out)."""
        if self.backend != "torch":
            raise ValueError(f"torch_vector: env_backend is {self.backend}; tensor envs need env_backend: torch")
        from agilerl_core.envs.torch_classic import TorchClassicVector

        self.check()
        return TorchClassicVector(self.env_id, num_envs, device, self.kwargs, compile=self.compile)

    def for_training(self, envs: list[Any]) -> list[Any]:
        """Training vector envs inside fresh vector wrappers: their statistics (e.g. NormalizeReward's running
        return) start anew each training phase, which reset the envs anyway, so a run resumed from a checkpoint
        trains exactly as an uninterrupted one."""
        if not self.vector_wrappers:
            return envs
        return [_wrapped(e, self.vector_wrappers, "vector_wrappers", False, vector=True) for e in envs]

    def describe(self) -> dict[str, Any]:
        """The wrappers as data, for a checkpoint's env description (a label: never imported to load it)."""
        out: dict[str, Any] = {}
        if self.wrappers:
            out["env_wrappers"] = [{"wrapper": w.wrapper, "kwargs": dict(w.kwargs)} for w in self.wrappers]
        if self.vector_wrappers:
            out["vector_wrappers"] = [{"wrapper": w.wrapper, "kwargs": dict(w.kwargs)} for w in self.vector_wrappers]
        return out


def probe_spaces(env_id: str, env_kwargs: dict[str, Any] | None = None,
                 entry_point: str | None = None) -> tuple[gym.Space, gym.Space]:
    """(observation_space, action_space) of one env instance."""
    env = make_env(env_id, env_kwargs, entry_point)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def make_vector_env(env_id: str, num_envs: int, env_kwargs: dict[str, Any] | None = None,
                    entry_point: str | None = None) -> SyncVectorEnv:
    """A synchronous vector env that autoresets in the same step.

    Same-step autoreset returns the first observation of the next episode and puts the last one in
    ``info["final_obs"]``, so every step yields one storable transition per sub-env. Sync beats async
    for cheap envs on few cores (8.8x for CartPole on 2 cores).
    """
    make_env(env_id, env_kwargs, entry_point).close()  # validate once with a clear error
    name = resolve_env_id(env_id, entry_point)
    kwargs = dict(env_kwargs or {})
    factory = env_factory(name)
    one = (lambda: _from_factory(name, factory, kwargs)) if factory is not None else (lambda: gym.make(name, **kwargs))
    return SyncVectorEnv([one for _ in range(num_envs)],
                         autoreset_mode=AutoresetMode.SAME_STEP)
