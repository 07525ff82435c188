"""PettingZoo parallel envs, named and vectorised.

An env is named ``module:env`` (``mpe2:simple_speaker_listener_v4``): ``env`` is a module with a
``parallel_env`` function (PettingZoo's convention) or a function returning a parallel env; ``env_kwargs``
go to that function. :class:`ParallelVectorEnv` steps N copies together in this process;
:class:`ProcessParallelVectorEnv` steps them in a few worker processes, each hosting a block of copies
(for slow envs: for MPE on 2 cores, workers were slower than stepping in the learner's process).

Observations, actions, rewards and flags travel as ``dict[agent_id, np.ndarray]`` with a leading
sub-env dimension. A sub-env whose agents are all done is reset in the same step (its last observations
go to ``info["final_obs"]``), so every step yields one storable transition per sub-env. An agent that is
done while others play on is *dead* for the rest of that episode: its observation is zeros, its
``info["alive"]`` entry False, its action ignored, and its reward 0.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from agilerl_core.code_refs import ref_problem
from agilerl_core.envs import mpe_batched
from agilerl_core.envs.aec_direct import DirectAECParallel, direct_parallel
from agilerl_core.envs.make import env_factory
from agilerl_core.errors import ConfigError

AgentArrays = dict[str, np.ndarray]


def agent_group(agent_id: str) -> str:
    """The group of an agent: its id without the trailing ``_<index>`` (``speaker_0`` -> ``speaker``)."""
    head, sep, tail = agent_id.rpartition("_")
    return head if sep and tail.isdigit() else agent_id


def policy_units(spec: Any, share: str) -> dict[str, tuple[str, ...]]:
    """Policy unit name -> its agents (in env order): one per agent (`share` "agent"), or one per group of agents
    with identical spaces (`share` "group"; a ConfigError naming the group otherwise). `spec`: a MultiAgentSpec."""
    if share == "agent":
        return {a: (a,) for a in spec.agents}
    units: dict[str, list[str]] = {}
    for a in spec.agents:
        units.setdefault(agent_group(a), []).append(a)
    for group, agents in units.items():
        first = agents[0]
        for a in agents[1:]:
            if spec.obs[a].space != spec.obs[first].space or spec.actions[a] != spec.actions[first]:
                raise ConfigError(f"hyperparameters.share_policy: group {group!r} mixes spaces ({first} and {a} "
                                  f"differ), so its agents cannot share one policy; use share_policy: agent")
    return {g: tuple(a) for g, a in units.items()}


def resolve_env_fn(env_id: str) -> Callable[..., Any]:
    """The function that builds the parallel env `env_id` names (``module:env``); a ConfigError naming the
    field and the fix otherwise. A factory bound in this process (``evolve(cfg, env=...)``) is used as it is."""
    bound = env_factory(env_id)
    if bound is not None:
        return bound
    if ref_problem(env_id, "mpe2:simple_speaker_listener_v4") is not None:  # exactly one colon, module:identifier
        raise ConfigError(f"env_id: {env_id!r} must name a PettingZoo parallel env as module:env, e.g. "
                          f"mpe2:simple_speaker_listener_v4 (a module with parallel_env, or a function)")
    module, _, attr = env_id.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        raise ConfigError(f"env_id: {env_id!r} names module {module!r}, which cannot be imported ({err}); "
                          f"install the package that provides it (e.g. pip install mpe2)") from None
    found = getattr(mod, attr, None)
    if found is None:
        try:  # a submodule not imported by its package (mpe2.simple_spread_v3 is; others may not be)
            found = importlib.import_module(f"{module}.{attr}")
        except ImportError:
            names = sorted(n for n in dir(mod) if not n.startswith("_"))
            raise ConfigError(f"env_id: module {module!r} has no env {attr!r}; it has: {', '.join(names[:30])}")\
                from None
    fn = getattr(found, "parallel_env", found)
    if not callable(fn):
        raise ConfigError(f"env_id: {env_id!r} is neither a module with parallel_env nor a function")
    return fn


def make_parallel_env(env_id: str, env_kwargs: dict[str, Any] | None = None):
    """One parallel env, with construction failures as ConfigErrors; an AEC env behind PettingZoo's
    conversion is stepped directly (:mod:`agilerl_core.envs.aec_direct`)."""
    fn = resolve_env_fn(env_id)
    try:
        env = fn(**(env_kwargs or {}))
    except TypeError as err:
        raise ConfigError(f"env_kwargs: {env_id}(**env_kwargs) failed: {err}") from None
    for attr in ("possible_agents", "observation_space", "action_space", "reset", "step"):
        if not hasattr(env, attr):
            raise ConfigError(f"env_id: {env_id!r} built a {type(env).__name__}, not a PettingZoo parallel env "
                              f"(it lacks {attr}); name the parallel_env function (AEC envs are not supported)")
    return direct_parallel(env)


def check_parallel_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> None:
    """Build and close one env: the fast check the CLI runs before anything starts."""
    env = make_parallel_env(env_id, env_kwargs)
    env.close()


class ParallelVectorEnv:
    """N copies of a PettingZoo parallel env stepped together, same-step autoreset (see the module doc)."""

    def __init__(self, env_fns: list[Callable[[], Any]]) -> None:
        if not env_fns:
            raise ValueError("a vector env needs at least one env")
        self._envs = [fn() for fn in env_fns]
        first = self._envs[0]
        self.agents: list[str] = list(first.possible_agents)
        self.observation_spaces = {a: first.observation_space(a) for a in self.agents}
        self.action_spaces = {a: first.action_space(a) for a in self.agents}
        self.num_envs = len(self._envs)
        self._alive = {a: np.zeros(self.num_envs, dtype=bool) for a in self.agents}
        self._masks = {a: self._mask_width(a) for a in self.agents}
        self._pending: dict[str, np.ndarray] | None = None  # a started step's actions
        # copies stepped directly (every one an AEC env behind checking wrappers only): the checks the wrappers
        # would do run once for all copies' actions
        self._batch_checks = all(isinstance(e, DirectAECParallel) for e in self._envs)

    def _mask_width(self, agent: str) -> int | None:
        space = self.action_spaces[agent]
        return int(space.n) if isinstance(space, spaces.Discrete) else None

    # ---- the per-copy work (the process variant runs it in workers) ------------------------------------
    def _reset_copies(self, seeds: list[int | None], rows: list[int]) -> list[tuple[dict, dict]]:
        return [self._envs[i].reset(seed=s) for i, s in zip(rows, seeds, strict=True)]

    def _send_steps(self, actions: dict[str, np.ndarray]) -> None:
        return None  # in this process the copies step in _recv_steps

    def _recv_steps(self, actions: dict[str, np.ndarray]) -> list[tuple]:
        out = []
        if self._batch_checks:  # every copy's action checks at once
            actions = self._envs[0].checked_batch(actions, self._alive)
        kwargs = {"checked": True} if self._batch_checks else {}
        for i, env in enumerate(self._envs):
            live = list(env.agents)
            out.append((*env.step({a: actions[a][i] for a in live}, **kwargs), live, not env.agents))
        return out

    # ---- the vector API --------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[AgentArrays, dict[str, Any]]:
        """Reset every copy (copy i with seed + i when a seed is given)."""
        seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        results = self._reset_copies(seeds, list(range(self.num_envs)))
        obs = self._blank_obs()
        masks = self._blank_masks()
        for i, (o, infos) in enumerate(results):
            self._write_obs(i, o, infos, obs, masks)
        return obs, {"alive": {a: v.copy() for a, v in self._alive.items()}, "action_mask": masks}

    def step(self, actions: dict[str, np.ndarray]) -> tuple[AgentArrays, AgentArrays, AgentArrays, AgentArrays,
                                                          dict[str, Any]]:
        """Step every copy with `actions` (env format, leading sub-env dim; dead agents' rows are ignored).

        Returns (obs, rewards, terminated, truncated, info). `info` holds ``acted`` (which agents acted in
        this step), ``alive`` (which act next), ``action_mask``, ``env_done`` (copies whose episode ended
        and were reset), ``final_obs`` (their last observations; the rows of other copies repeat obs) and
        ``final_action_mask`` (the masks that went with them)."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: dict[str, np.ndarray]) -> None:
        """Start :meth:`step` (worker processes begin stepping their copies); :meth:`step_wait` finishes it. A
        group steps every member's envs this way, so all their workers step at once."""
        self._pending = actions
        self._send_steps(actions)  # worker processes: every block steps at once

    def step_wait(self) -> tuple[AgentArrays, AgentArrays, AgentArrays, AgentArrays, dict[str, Any]]:
        """The results of the :meth:`step_async` before it (what :meth:`step` returns)."""
        actions, self._pending = self._pending, None
        return self._finish_step(self._recv_steps(actions))

    def _finish_step(self, results: list[tuple]) -> tuple[AgentArrays, AgentArrays, AgentArrays, AgentArrays,
                                                          dict[str, Any]]:
        n = self.num_envs
        obs = self._blank_obs()
        masks = self._blank_masks()
        rewards = {a: np.zeros(n, dtype=np.float32) for a in self.agents}
        terminated = {a: np.zeros(n, dtype=bool) for a in self.agents}
        truncated = {a: np.zeros(n, dtype=bool) for a in self.agents}
        acted = {a: v.copy() for a, v in self._alive.items()}
        env_done = np.zeros(n, dtype=bool)
        reset_rows = []
        for i, (o, rew, term, trunc, infos, live, over) in enumerate(results):
            for a in live:
                rewards[a][i] = rew.get(a, 0.0)
                terminated[a][i] = bool(term.get(a, False))
                truncated[a][i] = bool(trunc.get(a, False))
            self._write_obs(i, o, infos, obs, masks)
            if over:
                env_done[i] = True
                reset_rows.append(i)
        final_obs = {a: v.copy() for a, v in obs.items()} if reset_rows else obs
        final_masks = {a: None if m is None else m.copy() for a, m in masks.items()} if reset_rows else masks
        if reset_rows:
            for i, (o, infos) in zip(reset_rows, self._reset_copies([None] * len(reset_rows), reset_rows),
                                     strict=True):
                for a in self.agents:
                    obs[a][i] = 0
                    if masks[a] is not None:
                        masks[a][i] = True
                self._write_obs(i, o, infos, obs, masks)
        info = {"acted": acted, "alive": {a: v.copy() for a, v in self._alive.items()}, "action_mask": masks,
                "env_done": env_done, "final_obs": final_obs, "final_action_mask": final_masks}
        return obs, rewards, terminated, truncated, info

    def close(self) -> None:
        for env in self._envs:
            env.close()

    # ---- helpers ---------------------------------------------------------------------------------------
    def _blank_obs(self) -> AgentArrays:
        out = {}
        for a, space in self.observation_spaces.items():
            dtype = np.int64 if isinstance(space, spaces.Discrete) else space.dtype
            out[a] = np.zeros((self.num_envs, *(space.shape or ())), dtype=dtype)
        return out

    def _blank_masks(self) -> dict[str, np.ndarray | None]:
        return {a: None if w is None else np.ones((self.num_envs, w), dtype=bool) for a, w in self._masks.items()}

    def _write_obs(self, i: int, o: dict, infos: dict, obs: AgentArrays, masks: dict) -> None:
        """Copy i's observations (an agent done in this step still reports its last one) and masks; an
        agent is alive when the env still lists it."""
        for a, value in o.items():
            if a not in obs:
                raise ValueError(f"agent {a!r} is not among the env's possible_agents {self.agents}")
            obs[a][i] = value
            mask = (infos.get(a) or {}).get("action_mask")
            if mask is not None and masks[a] is not None:
                masks[a][i] = np.asarray(mask, dtype=bool)
        live = set(self._live_agents(i))
        for a in self.agents:
            self._alive[a][i] = a in live

    def _live_agents(self, i: int) -> list[str]:
        return list(self._envs[i].agents)


def _step_one(env, act: dict[str, Any]) -> tuple:
    live = list(env.agents)
    o, r, te, tr, inf = env.step({a: act[a] for a in live})
    return o, dict(r), dict(te), dict(tr), inf, live, not env.agents, list(env.agents)


def _worker(conn, env_fn, count: int) -> None:
    """A worker process hosting `count` copies: resets and steps them on request. An exception in an env is
    sent back as ("error", its traceback) and ends the worker."""
    import traceback

    try:
        envs = [env_fn() for _ in range(count)]
        while True:
            cmd, arg = conn.recv()
            if cmd == "reset":  # [(local index, seed)]
                out = []
                for j, seed in arg:
                    o, infos = envs[j].reset(seed=seed)
                    out.append((o, infos, list(envs[j].agents)))
                conn.send(("ok", out))
            elif cmd == "step":  # one action dict per hosted copy
                conn.send(("ok", [_step_one(env, act) for env, act in zip(envs, arg, strict=True)]))
            elif cmd == "close":
                for env in envs:
                    env.close()
                conn.send(("ok", None))
                return
    except (EOFError, KeyboardInterrupt):
        return
    except Exception:
        conn.send(("error", traceback.format_exc()))


class ProcessParallelVectorEnv(ParallelVectorEnv):
    """:class:`ParallelVectorEnv` with its copies in `workers` worker processes (contiguous blocks, stepping
    at the same time). The env function must be importable by name (workers are spawned)."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None, num_envs: int, workers: int) -> None:
        self.env_id = env_id
        fn = _EnvFactory(env_id, env_kwargs)
        probe = fn()
        self.agents = list(probe.possible_agents)
        self.observation_spaces = {a: probe.observation_space(a) for a in self.agents}
        self.action_spaces = {a: probe.action_space(a) for a in self.agents}
        probe.close()
        self.num_envs = num_envs
        workers = max(1, min(workers, num_envs))
        bounds = np.linspace(0, num_envs, workers + 1).round().astype(int)
        self._blocks = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        ctx = mp.get_context("spawn")
        self._conns, self._procs = [], []
        for lo, hi in self._blocks:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, fn, hi - lo), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._live: list[list[str]] = [[] for _ in range(num_envs)]
        self._alive = {a: np.zeros(num_envs, dtype=bool) for a in self.agents}
        self._masks = {a: self._mask_width(a) for a in self.agents}
        self._pending = None

    def _reset_copies(self, seeds: list[int | None], rows: list[int]) -> list[tuple[dict, dict]]:
        asks: list[list[tuple[int, int | None]]] = [[] for _ in self._blocks]
        for i, s in zip(rows, seeds, strict=True):
            w = next(k for k, (lo, hi) in enumerate(self._blocks) if lo <= i < hi)
            asks[w].append((i - self._blocks[w][0], s))
        for conn, ask in zip(self._conns, asks, strict=True):
            if ask:
                conn.send(("reset", ask))
        got: dict[int, tuple[dict, dict]] = {}
        for w, ask in enumerate(asks):
            if ask:
                for (j, _), (o, infos, live) in zip(ask, self._receive(w), strict=True):
                    i = self._blocks[w][0] + j
                    self._live[i] = live
                    got[i] = (o, infos)
        return [got[i] for i in rows]

    def _send_steps(self, actions: dict[str, np.ndarray]) -> None:
        for conn, (lo, hi) in zip(self._conns, self._blocks, strict=True):
            conn.send(("step", [{a: actions[a][i] for a in self.agents} for i in range(lo, hi)]))

    def _recv_steps(self, actions: dict[str, np.ndarray]) -> list[tuple]:
        out = []
        for w, (lo, _) in enumerate(self._blocks):
            for j, (o, r, te, tr, inf, live, over, now_live) in enumerate(self._receive(w)):
                self._live[lo + j] = now_live
                out.append((o, r, te, tr, inf, live, over))
        return out

    def _receive(self, w: int) -> Any:
        """Worker `w`'s answer; a RuntimeError naming the env and the worker's traceback if it failed or died."""
        try:
            status, payload = self._conns[w].recv()
        except (EOFError, ConnectionError) as err:
            raise RuntimeError(f"env worker {w} of {self.env_id} died ({err!r}, exit code "
                               f"{self._procs[w].exitcode})") from None
        if status == "error":
            raise RuntimeError(f"env worker {w} of {self.env_id} failed:\n{payload}")
        return payload

    def _live_agents(self, i: int) -> list[str]:
        return self._live[i]

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(EOFError, ConnectionError):  # a worker that failed has exited already
                conn.send(("close", None))
                conn.recv()
        for proc in self._procs:
            proc.join(timeout=5)


class _EnvFactory:
    """A picklable env builder (by name), for spawned workers."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None) -> None:
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})

    def __call__(self):
        return make_parallel_env(self.env_id, self.env_kwargs)


def make_parallel_vector_env(env_id: str, num_envs: int, env_kwargs: dict[str, Any] | None = None,
                             workers: int = 0) -> ParallelVectorEnv:
    """`num_envs` copies of `env_id`, stepped in this process (`workers` 0) or in `workers` worker processes. mpe2's
    speaker-listener and spread in this process step all copies at once, bit for bit as mpe2 steps each
    (:mod:`agilerl_core.envs.mpe_batched`), unless an option asks for what only mpe2 does (rendering, benchmark
    data, spread's curriculum or partial observability)."""
    if workers:
        return ProcessParallelVectorEnv(env_id, env_kwargs, num_envs, workers)
    kwargs = dict(env_kwargs or {})
    batched = mpe_batched.batched_class(resolve_env_fn(env_id)) if env_factory(env_id) is None else None
    if batched is not None and set(kwargs) <= batched.options:
        return batched(num_envs, **kwargs)
    factory = _EnvFactory(env_id, env_kwargs)
    return ParallelVectorEnv([factory] * num_envs)
