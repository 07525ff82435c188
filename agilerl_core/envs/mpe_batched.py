"""MPE's speaker-listener (mpe2 ``simple_speaker_listener_v4``) stepped for all copies of a vector env at once.

mpe2 steps one world at a time in Python (an agent cycle, a world step, two observations: ~35 us a copy, the
larger part of a MATD3 generation on it). :class:`SpeakerListenerVector` keeps every copy's world as arrays and
steps them together with the same float64 operations in the same order, so it is *bit for bit* mpe2 behind
:class:`~agilerl_core.envs.multi_agent.ParallelVectorEnv`: the same observations, rewards, truncations and
autoresets for the same seeds and actions (each copy keeps its own generator, seeded as mpe2 seeds it and drawn
in mpe2's order at every reset; tests/test_mpe_batched.py compares them step by step). It is what
:func:`~agilerl_core.envs.multi_agent.make_parallel_vector_env` builds for that env in the learner's process
when its options are ones it reproduces (``continuous_actions``, ``max_cycles``, ``dynamic_rescaling``);
anything else (``render_mode``, ``benchmark_data``) steps mpe2 itself.

The world (mpe2's scenario and core): a speaker that cannot move says one of 3 words (continuous: any vector in
[0, 1]^3), a listener moves (continuous: 5 inputs, force (a2 - a1, a4 - a3) x 5; discrete: no-op, -x, +x, -y,
+y at 5) with damping 0.25 and dt 0.1, no collisions; both are rewarded -|listener - goal landmark|^2 after the
step; the speaker sees the goal's colour, the listener its velocity, the three landmarks relative to it and the
speaker's word; episodes are truncated after ``max_cycles`` steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

AgentArrays = dict[str, np.ndarray]

SPEAKER, LISTENER = "speaker_0", "listener_0"
_LANDMARK_COLORS = np.array([[0.65, 0.15, 0.15], [0.15, 0.65, 0.15], [0.15, 0.15, 0.65]])
_DT, _DAMPING, _SENSITIVITY, _LANDMARKS, _WORDS = 0.1, 0.25, 5.0, 3, 3
OPTIONS = frozenset({"continuous_actions", "max_cycles", "dynamic_rescaling"})  # dynamic_rescaling: rendering only


def speaker_listener_fn() -> Any:
    """mpe2's speaker-listener parallel_env function, None when mpe2 is not installed."""
    try:
        import mpe2.simple_speaker_listener_v4 as module
    except ImportError:
        return None
    return module.parallel_env


class SpeakerListenerVector:
    """`num_envs` speaker-listener worlds stepped as arrays, with :class:`~agilerl_core.envs.multi_agent.
    ParallelVectorEnv`'s API and results (same-step autoreset, ``info`` keys, action checks)."""

    def __init__(self, num_envs: int, continuous_actions: bool = False, max_cycles: int = 25,
                 dynamic_rescaling: bool = True) -> None:
        if num_envs < 1:
            raise ValueError("a vector env needs at least one env")
        self.agents: list[str] = [SPEAKER, LISTENER]
        inf = np.float32(np.inf)  # the spaces as mpe2 declares them
        self.observation_spaces = {a: spaces.Box(-inf, inf, (dim,), np.float32)
                                   for a, dim in ((SPEAKER, 3), (LISTENER, 2 + 2 * _LANDMARKS + _WORDS))}
        self.action_spaces = {SPEAKER: spaces.Box(0, 1, (_WORDS,)), LISTENER: spaces.Box(0, 1, (5,))} \
            if continuous_actions else {SPEAKER: spaces.Discrete(_WORDS), LISTENER: spaces.Discrete(5)}
        self.num_envs, self.continuous, self.max_cycles = int(num_envs), bool(continuous_actions), int(max_cycles)
        n = self.num_envs
        self._rngs = [np.random.default_rng() for _ in range(n)]  # mpe2 seeds an unseeded copy from entropy
        self._pos = np.zeros((n, 2))  # the listener's position (the speaker's never enters anything)
        self._vel = np.zeros((n, 2))
        self._landmarks = np.zeros((n, _LANDMARKS, 2))
        self._goal = np.zeros(n, dtype=np.int64)
        self._word = np.zeros((n, _WORDS))  # the speaker's communication state
        self._steps = np.zeros(n, dtype=np.int64)
        self._alive = {a: np.ones(n, dtype=bool) for a in self.agents}
        self._pending: AgentArrays | None = None
        for i in range(n):
            self._reset_world(i)  # as mpe2's constructor does

    # ---- mpe2's scenario, per copy (resets) and for all copies at once (steps) ---------------------------------
    def _reset_world(self, i: int) -> None:
        rng = self._rngs[i]
        self._goal[i] = int(rng.integers(_LANDMARKS))
        rng.uniform(-1, +1, 2)  # the speaker's position: drawn (mpe2's order), never used
        self._pos[i] = rng.uniform(-1, +1, 2)
        for j in range(_LANDMARKS):
            self._landmarks[i, j] = rng.uniform(-1, +1, 2)
        self._vel[i] = 0.0
        self._word[i] = 0.0
        self._steps[i] = 0

    def _observations(self) -> AgentArrays:
        rel = self._landmarks - self._pos[:, None, :]
        listener = np.concatenate([self._vel, rel.reshape(self.num_envs, -1), self._word], axis=1)
        return {SPEAKER: _LANDMARK_COLORS[self._goal].astype(np.float32),
                LISTENER: listener.astype(np.float32)}

    def _checked(self, actions: AgentArrays) -> AgentArrays:
        """The checks ParallelVectorEnv's copies do: Box actions clipped to their space, Discrete ones in range."""
        out = {}
        for a in self.agents:
            space, x = self.action_spaces[a], np.asarray(actions[a])
            if self.continuous:
                if x.shape[1:] != space.shape:
                    raise ValueError(f"action for {a!r} has shape {x.shape[1:]}, the env's space {space.shape}")
                out[a] = np.minimum(np.maximum(x, space.low), space.high)
            else:
                x = x.reshape(-1)
                bad = np.ones(x.shape, dtype=bool) if x.dtype.kind not in "iu" else (x < 0) | (x >= space.n)
                if bad.any():
                    raise ValueError(f"action {x[bad][0]!r} for {a!r} is not in its space {space}")
                out[a] = x
        return out

    def _world_step(self, actions: AgentArrays) -> np.ndarray:
        """Every copy's world one step on; each copy's reward (float64)."""
        n = self.num_envs
        force = np.zeros((n, 2))
        if self.continuous:
            move = actions[LISTENER]  # float32, as mpe2 takes it: the difference in float32, the rest in float64
            force[:, 0] += move[:, 2] - move[:, 1]
            force[:, 1] += move[:, 4] - move[:, 3]
            self._word = actions[SPEAKER] + 0.0  # the speaker's word is its action (no noise)
        else:
            move = actions[LISTENER]
            force[:, 0] = np.where(move == 1, -1.0, np.where(move == 2, 1.0, 0.0))
            force[:, 1] = np.where(move == 3, -1.0, np.where(move == 4, 1.0, 0.0))
            self._word = np.zeros((n, _WORDS))
            self._word[np.arange(n), actions[SPEAKER]] = 1.0
        force *= _SENSITIVITY
        self._pos += self._vel * _DT
        self._vel = self._vel * (1 - _DAMPING)
        self._vel += (force / 1.0) * _DT  # mass 1
        gap = self._pos - self._landmarks[np.arange(n), self._goal]
        return -np.sum(np.square(gap), axis=1)

    # ---- the vector API ----------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[AgentArrays, dict[str, Any]]:
        """Reset every copy (copy i with seed + i when a seed is given, as mpe2 seeds it)."""
        for i in range(self.num_envs):
            if seed is not None:
                self._rngs[i] = np.random.default_rng(seed + i)  # gymnasium's seeding.np_random
            self._reset_world(i)
        for alive in self._alive.values():
            alive[:] = True
        return self._observations(), {"alive": {a: v.copy() for a, v in self._alive.items()},
                                      "action_mask": self._masks()}

    def step(self, actions: AgentArrays) -> tuple[AgentArrays, AgentArrays, AgentArrays, AgentArrays, dict]:
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: AgentArrays) -> None:
        self._pending = actions

    def step_wait(self) -> tuple[AgentArrays, AgentArrays, AgentArrays, AgentArrays, dict[str, Any]]:
        actions, self._pending = self._pending, None
        reward = self._world_step(self._checked(actions)).astype(np.float32)
        self._steps += 1
        done = self._steps >= self.max_cycles
        obs = self._observations()
        masks = self._masks()
        final_obs, final_masks = obs, masks
        if done.any():
            final_obs = {a: v.copy() for a, v in obs.items()}
            final_masks = {a: None if m is None else m.copy() for a, m in masks.items()}
            for i in np.flatnonzero(done).tolist():
                self._reset_world(i)
            fresh = self._observations()
            for a in self.agents:
                obs[a][done] = fresh[a][done]
        alive = {a: v.copy() for a, v in self._alive.items()}
        info = {"acted": {a: v.copy() for a, v in alive.items()}, "alive": alive, "action_mask": masks,
                "env_done": done, "final_obs": final_obs, "final_action_mask": final_masks}
        no = np.zeros(self.num_envs, dtype=bool)
        return obs, {a: reward.copy() for a in self.agents}, {a: no.copy() for a in self.agents}, \
            {a: done.copy() for a in self.agents}, info

    def _masks(self) -> dict[str, np.ndarray | None]:
        if self.continuous:
            return {a: None for a in self.agents}
        return {a: np.ones((self.num_envs, int(self.action_spaces[a].n)), dtype=bool) for a in self.agents}

    def close(self) -> None:
        """Nothing to release (arrays only)."""
