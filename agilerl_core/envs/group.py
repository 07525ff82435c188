"""A group's envs as one vector: the K members' N sub-envs each stepped by one call and seen by the training
loop as tensors on the group's device, member-major ([K * N, ...]: member k's sub-envs are rows k*N..k*N+N-1).

Two kinds behind one interface (:class:`GroupEnv`):

* :class:`HostGroupEnv`: every member's own Gymnasium (or envpool) vector env, stepped together: the actions
  reach the host once per step for the whole group, the results are checked for NaN and inf on the host and
  become the group's tensors in one conversion. Async vector envs are stepped all at once (``step_async`` for
  every member before any ``step_wait``). Member k's envs are reset with its own seed, so its episodes are those
  it would see alone.
* :class:`TorchGroupEnv`: the on-device classic-control envs (``env_backend: torch``,
  :mod:`agilerl_core.envs.torch_classic`) of all K x N sub-envs as one tensor program: nothing leaves the
  device; NaN checks fold on the device and are read once per phase.

Both autoreset in the step that ends an episode; ``final_obs`` holds the true last observation of those
sub-envs (and equals ``obs`` elsewhere).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv

from agilerl_core.envs.spaces import ActionSpec, Obs, ObsSpec
from agilerl_core.envs.vector import action_masks, real_next_obs
from agilerl_core.errors import NonFiniteError
from agilerl_core.finite import FirstBad, _bad


@dataclass
class GroupStep:
    """One step of a group's envs, every tensor [K * N, ...] on the group's device."""

    obs: Obs  # the observation to act on next (a fresh episode's first where `done`)
    reward: torch.Tensor  # float64 from host envs (as they give it), float32 from on-device ones
    terminated: torch.Tensor  # bool
    truncated: torch.Tensor  # bool
    final_obs: Obs  # the true next observation (equals obs where not done)
    mask: torch.Tensor | None = None  # action masks for `obs` [K * N, A] (None: the env gives none)
    next_mask: torch.Tensor | None = None  # ... for `final_obs`
    # host envs: which episodes ended [K * N] and whether any was cut by a time limit, known on the host (no
    # device read); None from on-device envs (the loops then never ask)
    host_done: np.ndarray | None = None
    any_cut: bool | None = None


class GroupEnv(ABC):
    """The interface the population-major loops step: `k` members x `n` sub-envs."""

    k: int
    n: int
    on_device: bool  # True: nothing reaches the host per step (no host checks, no host sync)

    @abstractmethod
    def reset(self, seeds: list[int]) -> tuple[Obs, torch.Tensor | None]:
        """Every member's envs anew, member k's from seed ``seeds[k]`` (sub-env i: seed + i): (obs, masks)."""

    @abstractmethod
    def step(self, actions: torch.Tensor) -> GroupStep:
        """Step with `actions` [K, N, ...] (agent scale)."""

    def check(self, slots: list[int]) -> None:
        """Raise the NonFiniteError an on-device check found (a no-op for host envs, checked at each step)."""
        return None


def _cat(parts: list[Any]) -> Any:
    if isinstance(parts[0], dict):
        return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    return np.concatenate(parts)


class HostGroupEnv(GroupEnv):
    """K members' own vector envs (Gymnasium, async or envpool: anything with the VectorEnv interface and
    same-step autoreset) stepped as one group."""

    on_device = False

    def __init__(self, envs: list[Any], slots: list[int], obs_spec: ObsSpec, action_spec: ActionSpec,
                 device: torch.device | str) -> None:
        self.envs, self.slots = envs, list(slots)
        self.k, self.n = len(envs), envs[0].num_envs
        self.obs_spec, self.action_spec, self.device = obs_spec, action_spec, torch.device(device)
        self.action_dim = action_spec.dim
        self.t = 0
        self._async = all(isinstance(e, AsyncVectorEnv) for e in envs)  # (a wrapped one steps in turn)

    def _tensors(self, obs: Any) -> Obs:
        return self.obs_spec.to_tensors(obs, self.device)

    def _check(self, value: Any, parts: list[Any], what: str) -> None:
        if _bad(value):  # which member: only once something is wrong
            for slot, part in zip(self.slots, parts, strict=True):
                if _bad(part):
                    raise NonFiniteError(None, slot, what, self.t, "env step")

    def reset(self, seeds: list[int]) -> tuple[Obs, torch.Tensor | None]:
        self.t = 0
        outs = [e.reset(seed=int(s)) for e, s in zip(self.envs, seeds, strict=True)]
        obs_parts = [o for o, _ in outs]
        obs = _cat(obs_parts)
        self._check(obs, obs_parts, "observation (after reset)")
        masks = [action_masks(info, self.n, self.action_dim)[0] for _, info in outs]
        return self._tensors(obs), self._mask(masks)

    def _mask(self, masks: list[np.ndarray | None]) -> torch.Tensor | None:
        if masks[0] is None:
            return None
        return torch.as_tensor(np.concatenate(masks), dtype=torch.bool, device=self.device)

    def step(self, actions: torch.Tensor) -> GroupStep:
        self.t += 1
        env_actions = self.action_spec.to_env(actions.reshape(self.k * self.n, *actions.shape[2:]).cpu().numpy())
        n = self.n
        pieces = [env_actions[i * n: (i + 1) * n] for i in range(self.k)]
        if self._async:
            for e, a in zip(self.envs, pieces, strict=True):
                e.step_async(a)
            results = [e.step_wait() for e in self.envs]
        else:
            results = [e.step(a) for e, a in zip(self.envs, pieces, strict=True)]
        obs_parts = [r[0] for r in results]
        rewards = [np.asarray(r[1]) for r in results]
        reward = np.concatenate(rewards)
        self._check(reward, rewards, "reward")
        obs = _cat(obs_parts)
        self._check(obs, obs_parts, "observation")
        terminated = np.concatenate([np.asarray(r[2], dtype=bool) for r in results])
        truncated = np.concatenate([np.asarray(r[3], dtype=bool) for r in results])
        finals = [real_next_obs(o, r[4], np.asarray(r[2], bool) | np.asarray(r[3], bool))
                  for o, r in zip(obs_parts, results, strict=True)]
        done = terminated | truncated
        any_done = bool(done.any())
        final = _cat(finals) if any_done else obs
        if any_done:
            self._check(final, finals, "final observation")
        masks = [action_masks(r[4], n, self.action_dim) for r in results]
        dev = self.device
        obs_t = self._tensors(obs)
        return GroupStep(obs_t, torch.as_tensor(reward, dtype=torch.float64, device=dev),
                         torch.as_tensor(terminated, device=dev), torch.as_tensor(truncated, device=dev),
                         obs_t if not any_done else self._tensors(final),
                         self._mask([m[0] for m in masks]), self._mask([m[1] for m in masks]),
                         done, bool((truncated & ~terminated).any()))


class TorchGroupEnv(GroupEnv):
    """K x N on-device classic-control envs (one :class:`~agilerl_core.envs.torch_classic.TorchClassicVector`)."""

    on_device = True

    def __init__(self, recipe: Any, k: int, n: int, action_spec: ActionSpec, device: torch.device | str,
                 check_chunk: int = 256) -> None:
        self.k, self.n, self.action_spec = k, n, action_spec
        self.device = torch.device(device)
        self.env = recipe.torch_vector(k * n, self.device)
        low = torch.tensor(action_spec.low, dtype=torch.float32, device=self.device) if not action_spec.discrete else None
        high = torch.tensor(action_spec.high, dtype=torch.float32, device=self.device) if not action_spec.discrete else None
        self._low, self._high = low, high
        self.bad = FirstBad(k, self.device, check_chunk)
        self.t = 0

    def reset(self, seeds: list[int]) -> tuple[Obs, torch.Tensor | None]:
        self.t = 0
        self.bad = FirstBad(self.k, self.device, self.bad.chunk)
        sub = torch.tensor([int(s) + i for s in seeds for i in range(self.n)], dtype=torch.int64, device=self.device)
        return {"obs": self.env.reset(sub)}, None

    def step(self, actions: torch.Tensor) -> GroupStep:
        self.t += 1
        a = actions.reshape(self.k * self.n, *actions.shape[2:])
        if not self.action_spec.discrete:  # agent scale [-1, 1] -> the Box's bounds, as ActionSpec.to_env
            a = self._low + (a.clamp(-1.0, 1.0) + 1.0) * 0.5 * (self._high - self._low)
        obs, reward, terminated, truncated, final = self.env.step(a)
        self.bad.see(reward.view(self.k, self.n).sum(1), self.t)  # NaN or inf anywhere makes the sum non-finite
        return GroupStep({"obs": obs}, reward, terminated, truncated, {"obs": final})

    def check(self, slots: list[int]) -> None:
        self.bad.check(slots, "reward", "env step")
