"""envpool (C++ vector envs: classic control, Atari, MuJoCo...) behind the vector-env interface the training loops
use, with Gymnasium's same-step autoreset: a finished episode's sub-env is reset within the step that ended it,
its true last observation goes to ``info["final_obs"]`` (``info["_final_obs"]`` marks which), and the
terminated/truncated flags are the step's own. envpool itself resets on the step *after* an episode ends; the
adapter resets the finished sub-envs at once instead (envpool's partial reset), so the next step acts from the
new episode's first observation exactly as the Python path does.

envpool seeds its envs when the pool is made, so ``reset(seed=S)`` makes a fresh pool seeded S: the same seed
gives the same episodes, as with Gymnasium's envs.
"""

from __future__ import annotations

import difflib
import warnings
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space

from agilerl_core.errors import ConfigError


def _envpool() -> Any:
    try:
        import envpool
    except ImportError:
        raise ConfigError("env_backend: envpool is not installed; pip install -c constraints.txt -e \".[envpool]\", "
                          "or use env_backend: gymnasium") from None
    return envpool


def check_envpool_id(env_id: str) -> None:
    """A ConfigError naming env_id (and close envpool ids) when envpool has no such task."""
    known = _envpool().list_all_envs()
    if env_id not in known:
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"env_id: {env_id!r} is not an envpool task.{hint} envpool names its own tasks "
                          f"(e.g. CartPole-v1, Pong-v5, HalfCheetah-v4); or use env_backend: gymnasium")


class EnvpoolVector:
    """`num_envs` copies of envpool task `env_id` (its options in `kwargs`, e.g. ``num_threads``), stepped in C++
    and presented with same-step autoreset."""

    is_vector_env = True

    def __init__(self, env_id: str, num_envs: int, kwargs: dict[str, Any] | None = None) -> None:
        check_envpool_id(env_id)
        self.env_id, self.num_envs, self.kwargs = env_id, num_envs, dict(kwargs or {})
        self._pool = self._make(0)
        self.single_observation_space = self._pool.observation_space
        self.single_action_space = self._pool.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": "SameStep"}

    def _make(self, seed: int) -> Any:
        try:
            with warnings.catch_warnings():  # envpool's float64 Box bounds cast to float32: its own business
                warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
                return _envpool().make_gymnasium(self.env_id, num_envs=self.num_envs, seed=int(seed), **self.kwargs)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ConfigError(f"env_kwargs: envpool.make_gymnasium({self.env_id!r}, **env_kwargs) failed: {err}") \
                from None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if seed is not None:
            self._pool.close()
            self._pool = self._make(seed)
        obs, info = self._pool.reset()
        return obs, self._info(info)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, reward, terminated, truncated, info = self._pool.step(np.asarray(actions))
        info = self._info(info)
        done = np.logical_or(terminated, truncated)
        if done.any():
            idx = np.flatnonzero(done)
            final = np.empty(self.num_envs, dtype=object)
            for i in idx:
                final[i] = np.array(obs[i], copy=True)
            first, _ = self._pool.reset(idx)
            obs = np.array(obs, copy=True)
            obs[idx] = first
            info["final_obs"], info["_final_obs"] = final, done
        return obs, np.asarray(reward, dtype=np.float64), np.asarray(terminated, bool), np.asarray(truncated, bool), info

    @staticmethod
    def _info(info: dict) -> dict:
        """envpool's bookkeeping (env ids, step counters, players) is not the env's info: dropped."""
        return {k: v for k, v in info.items() if k not in ("env_id", "players", "elapsed_step")}

    def close(self) -> None:
        self._pool.close()
