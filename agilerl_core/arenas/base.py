"""What every Gymnasium arena shares: the env's spaces checked against the algorithm, the members' shared
architecture and hyperparameter space, evaluation episodes, and the helpers their training loops use.

An arena is built from its config and checks everything on the way (device, env id, spaces, hyperparameter
bounds), so a bad input fails before any work; a subclass adds how its members train.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.registry import algorithms_for
from agilerl_core.arenas.experience import OwnExperience
from agilerl_core.envs.group import GroupEnv, HostGroupEnv, TorchGroupEnv
from agilerl_core.envs.make import EnvRecipe
from agilerl_core.envs.spaces import CODE_RANGE, ActionSpec, ObsSpec, action_spec, observed_highs
from agilerl_core.errors import ConfigError
from agilerl_core.hpo.space import HyperparameterSpace, merge_space
from agilerl_core.networks.evolvable import ArchBounds, initial_arch
from agilerl_core.results import TrainResult


def evaluate_member(agent: RLAlgorithm, env: VectorEnv, seed: int, max_steps: int | None = None) -> float:
    """Fitness: mean return of one greedy episode per sub-env of `env`, after a reset with `seed`; the member acts
    as a group of one (:func:`evaluate_group`: the one evaluation loop there is)."""
    group = type(agent).group([agent])
    return evaluate_group(group, HostGroupEnv([env], [-1], agent.obs_spec, agent.action_spec, group.device), seed,
                          max_steps)[0]


@torch.no_grad()
def evaluate_group(group: Any, envs: GroupEnv, seed: int, max_steps: int | None = None, check_every: int = 16
                   ) -> list[float]:
    """Every member's fitness [K] from one greedy episode per sub-env of its envs (all reset with `seed`):
    the group's envs step as one and `group.greedy` chooses every member's actions in one forward. On-device
    envs are asked whether any episode is still running only every `check_every` steps (one host read; on a
    CPU, where the read costs nothing, at every step)."""
    k, n = envs.k, envs.n
    if torch.device(group.device).type == "cpu":
        check_every = 1
    obs, mask = envs.reset([seed] * k)
    returns = torch.zeros(k, n, dtype=torch.float64, device=group.device)
    active = torch.ones(k, n, dtype=torch.bool, device=group.device)
    starts = torch.ones(k, n, dtype=torch.bool, device=group.device)
    group.begin_acting(n)
    steps = 0
    host_active = np.ones(k * n, dtype=bool) if not envs.on_device else None  # host envs: known without a read
    while max_steps is None or steps < max_steps:
        step = envs.step(group.greedy(obs, mask, starts))
        done = (step.terminated | step.truncated).view(k, n)
        returns += step.reward.view(k, n) * active
        active &= ~done
        starts, obs, mask = done, step.obs, step.mask
        steps += 1
        if host_active is not None:
            host_active &= ~step.host_done
            if not host_active.any():
                break
        elif steps % check_every == 0 and not bool(active.any()):
            break
    return returns.mean(1).cpu().tolist()


PROBE_STEPS = 64  # random steps probe_image_tops takes after its reset, at most


def probe_image_tops(recipe: EnvRecipe, obs_spec: ObsSpec, steps: int = PROBE_STEPS) -> dict[str, tuple[float, ...]]:
    """Per image key of `obs_spec` scaled as ``pixels`` (a uint8 Box declared 0-255) whose env shows only small
    codes: each channel's top (:func:`~agilerl_core.envs.spaces.observed_highs`), from one fresh env reset with
    seed 0 and up to `steps` random actions (action space seeded 0; a step the env refuses ends the probe).
    The probe stops as soon as every such image has shown a value above CODE_RANGE (real pixels: Atari and
    CarRacing frames at their first reset), so they cost one reset. Empty when no image is scaled as pixels
    (nothing is built then) or the backend is ``torch`` (classic control: no images)."""
    parts = [p for p in obs_spec.image_parts if p.scale == "pixels"]
    if not parts or recipe.backend == "torch":
        return {}
    vector = recipe.backend == "envpool"  # envpool builds vector envs only
    env = recipe.vector(1) if vector else recipe.make()
    seen: dict[str, np.ndarray] = {}

    def look(obs: Any) -> bool:
        """Merge `obs` into the maxima seen; whether every image already looks like pixels."""
        for p in parts:
            frame = np.asarray(obs[p.key] if obs_spec.is_dict else obs).reshape(-1, *p.shape).max(axis=0)
            seen[p.key] = frame if p.key not in seen else np.maximum(seen[p.key], frame)
        return all(float(seen[p.key].max()) > CODE_RANGE for p in parts)

    try:
        obs, _ = env.reset(seed=0)
        env.action_space.seed(0)
        done = look(obs)
        for _ in range(steps if not done else 0):
            try:
                obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
            except Exception:  # an env that refuses a random action: judge from what it showed
                break
            if look(obs):
                break
            if not vector and (terminated or truncated):
                obs, _ = env.reset()
                look(obs)
    finally:
        env.close()
    tops = {p.key: observed_highs(p, seen[p.key][None]) for p in parts}
    return {k: t for k, t in tops.items() if t is not None}


def probe_action_mask(env: VectorEnv) -> int | None:
    """Width of the env's ``info["action_mask"]`` (None when it has none)."""
    _, info = env.reset(seed=0)
    mask = info.get("action_mask")
    return None if mask is None else int(np.asarray(mask).reshape(env.num_envs, -1).shape[1])


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


@functools.cache
def keep_freed_memory() -> bool:
    """Let this process's allocator (glibc malloc) keep freed memory for reuse, once per process: blocks up to
    32 MiB come from the heap, which keeps up to 256 MiB free at its top instead of returning it to the
    kernel. A training loop frees and allocates the same few hundred-KiB to MiB tensors at every step; with
    glibc's defaults (a threshold that adapts, then trims) many of them were fresh pages, faulted in and
    zeroed again each time: measured a third of a population-16 PPO update on a 2-core VM. Returns whether
    it applied (False off glibc: nothing changes)."""
    try:
        os.confstr("CS_GNU_LIBC_VERSION")
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 256 << 20))


def torch_device(requested: str, tf32: bool = False) -> str:
    """The torch device for the config's `device` field (cpu, auto, cuda, cuda:N); a ConfigError when the
    GPU it names is not visible to this process. `tf32` switches CUDA float32 matmuls to TF32."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cpu":
        return "cpu"
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(requested.partition(":")[2] or 0)
    if index >= visible:
        seen = "no CUDA device is visible" if not visible else f"only {visible} CUDA device(s) are visible"
        raise ConfigError(f"device: {requested!r} was requested but {seen} to this process "
                          f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); use 'cpu', 'auto' "
                          f"or a visible index")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return requested


def checked_space(cfg, algo_cls) -> HyperparameterSpace:
    """The members' mutable hyperparameters (the algorithm's space with the config's overrides); a
    ConfigError when an initial value lies outside bounds the config declared. An algorithm's default entry
    stretches to hold the config's value (or is left out where its kind cannot: a log scale at zero, an
    option switched off with None), so a config needs no hp_space to run."""
    space = merge_space(algo_cls.hp_model.preset_space(getattr(cfg, "hp_space_preset", "default")), cfg.hp_space)
    for name, spec in list(space.items()):
        value = getattr(cfg.hyperparameters, name)
        if name not in cfg.hp_space:
            widened = None if value is None else spec.widened_to(float(value))
            if widened is None:
                del space[name]
            else:
                space[name] = widened
            continue
        if not spec.min <= value <= spec.max:
            raise ConfigError(f"hyperparameters.{name}: initial value {value} lies outside hp_space.{name} "
                              f"bounds [{spec.min}, {spec.max}]; change one of them")
    return space


class GymArena(OwnExperience, ABC):
    """Members are RL agents of one algorithm acting in a Gymnasium env; evaluation is greedy episodes.

    Subclasses say how members train (:meth:`train`) and whether they share experience."""

    kind: ClassVar[str] = "gym"
    evaluation_notes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg, algo_cls: type[RLAlgorithm]) -> None:
        self.cfg = cfg
        self.algo_cls = algo_cls
        self.device = torch_device(cfg.device, cfg.tf32)
        torch.set_num_threads(cfg.torch_threads)
        if self.device == "cpu":
            keep_freed_memory()
        self.recipe = self.env_recipe(cfg)
        obs_space, act_space = self.recipe.spaces()
        self.obs_space, self.act_space = obs_space, act_space
        self.obs_spec = ObsSpec(obs_space, cfg.network.cnn.channels_last)
        self.action_spec: ActionSpec = action_spec(act_space)
        self._check_action_space()
        if cfg.hyperparameters.normalize_obs and not self.obs_spec.vector_dim:
            raise ConfigError(f"hyperparameters.normalize_obs: {cfg.env_id}'s observations have no vector part "
                              f"to normalise (images are scaled to [0, 1] already); set normalize_obs: false")
        self.env_desc: dict[str, Any] = {"env_id": cfg.env_id, "env_kwargs": cfg.env_kwargs,
                                         "channels_last": cfg.network.cnn.channels_last}
        if cfg.env_entry_point is not None:
            self.env_desc["env_entry_point"] = cfg.env_entry_point
        self.env_desc.update(self.recipe.describe())
        self.space = checked_space(cfg, algo_cls)
        self.arch_bounds = ArchBounds.from_config(cfg.network)
        # a uint8 image declared 0-255 that holds small codes is scaled by the tops its env shows (recorded in
        # the arch); the config's explicit input_scale, and real pixels, keep / 255
        observed = probe_image_tops(self.recipe, self.obs_spec) if cfg.network.cnn.input_scale == "auto" else {}
        self.arch = initial_arch(self.obs_spec, self.action_spec.dim, cfg.network, observed)
        if getattr(cfg, "compile_learn", False) and (self.arch.cnns or self.arch.encoders):
            raise ConfigError(f"compile_learn: compiles the step of plain-MLP Q-networks, and {cfg.env_id}'s "
                              f"observations ({self.obs_space}) need conv or per-key encoders; drop compile_learn")
        self.eval_env = self.recipe.vector(cfg.eval_episodes, evaluation=True)
        self._eval_envs: dict[int, VectorEnv] = {}  # per slot, so that slots evaluate concurrently in threads
        self._lock = threading.Lock()

    def env_recipe(self, cfg) -> EnvRecipe:
        """How this arena's envs are built: the config's env (an arena with an env of its own overrides it)."""
        return EnvRecipe.of(cfg)

    def _check_action_space(self) -> None:
        """A ConfigError naming the algorithms that fit when the algorithm cannot act in the env's actions."""
        spec, algo = self.action_spec, self.algo_cls
        if spec.kind in algo.action_kinds:
            return
        kinds = " or ".join("Discrete" if k == "discrete" else "Box" for k in algo.action_kinds)
        fits = algorithms_for(spec.kind, self.kind)
        raise ConfigError(f"algorithm: {self.cfg.algorithm} needs {kinds} actions, but {self.cfg.env_id} has "
                          f"{self.act_space}; use one of {', '.join(fits)}")

    def learning_group(self, members: list[RLAlgorithm]) -> Any:
        """The group that trains `members` (equal batch keys), its step compiled where the config asks
        (compile_learn; a group whose networks the compiled step does not cover learns eagerly)."""
        group = self.algo_cls.group(members)
        if getattr(self.cfg, "compile_learn", False):
            group.compile_learn()
        return group

    # ---- members ---------------------------------------------------------------------------------------
    def build_members(self, seeds: list[int]) -> list[RLAlgorithm]:
        return [self.algo_cls(self.obs_spec, self.action_spec, self.arch, self.cfg.hyperparameters, s, self.device)
                for s in seeds]

    def member_from_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> RLAlgorithm:
        return self.algo_cls.from_state(self.obs_spec, tensors, meta, self.device)

    # ---- a generation ----------------------------------------------------------------------------------
    @abstractmethod
    def train_group(self, members: list[RLAlgorithm], slots: list[int], seeds: list[int], steps: int
                    ) -> list[TrainResult]:
        """Train `members` (in `slots`, one batch key) for `steps` budget units each (rounded up to whole vector
        steps), member i's envs reset with ``seeds[i]``; a member alone is a group of one."""

    def batch_key(self, member: RLAlgorithm) -> Any:
        return member.batch_key()

    def evaluate(self, member: RLAlgorithm, seed: int, slot: int | None = None) -> float:
        """`member`'s fitness as a group of one: in slot `slot`'s evaluation envs (None: the arena's own)."""
        if slot is not None:
            return self.evaluate_group([member], seed, [slot])[0]
        group = self.algo_cls.group([member])
        envs = TorchGroupEnv(self.recipe, 1, self.cfg.eval_episodes, self.action_spec, group.device) \
            if self.recipe.backend == "torch" else \
            HostGroupEnv([self.eval_env], [-1], self.obs_spec, self.action_spec, group.device)
        return evaluate_group(group, envs, seed, self.cfg.eval_max_steps)[0]

    def group_env(self, slots: list[int], device: torch.device | str, evaluation: bool = False) -> GroupEnv:
        """The envs of the members in `slots` as one group vector: on-device envs for ``env_backend: torch``,
        else the slots' own vector envs (training: inside fresh vector wrappers; evaluation: each slot's
        evaluation env) stepped together."""
        n = self.cfg.eval_episodes if evaluation else self.cfg.num_envs
        if self.recipe.backend == "torch":
            return TorchGroupEnv(self.recipe, len(slots), n, self.action_spec, device)
        envs = [self.slot_eval_env(s) for s in slots] if evaluation else \
            self.recipe.for_training([self.envs[s] for s in slots])
        return HostGroupEnv(envs, list(slots), self.obs_spec, self.action_spec, device)

    def evaluate_group(self, members: list[RLAlgorithm], seed: int, slots: list[int]) -> list[float]:
        """Fitness of every member at once (members of one batch key; others one by one): all members'
        evaluation episodes as one [K, E] vector, greedy actions from one batched forward, each member's envs
        reset with `seed` as :meth:`evaluate` does, so a member's fitness does not depend on its group."""
        keys = [m.batch_key() for m in members]
        if len(members) > 1 and any(key != keys[0] for key in keys):
            return [self.evaluate_group([m], seed, [s])[0] for m, s in zip(members, slots, strict=True)]
        group = self.algo_cls.group(members)  # every Gymnasium algorithm's group acts greedily (group.greedy)
        return evaluate_group(group, self.group_env(slots, group.device, evaluation=True), seed,
                              self.cfg.eval_max_steps)

    def slot_eval_env(self, slot: int) -> VectorEnv:
        """Slot `slot`'s own evaluation env (a keyed cache: built once per slot)."""
        with self._lock:
            if slot not in self._eval_envs:
                self._eval_envs[slot] = self.recipe.vector(self.cfg.eval_episodes, evaluation=True)
            return self._eval_envs[slot]
