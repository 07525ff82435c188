"""mpe2's speaker-listener and spread (``simple_speaker_listener_v4``, ``simple_spread_v3``) stepped for all copies
of a vector env at once.

mpe2 steps one world at a time in Python (an agent cycle, a world step with a loop over pairs of entities, one
observation per agent: 35-90 us a copy, the larger part of a MATD3 generation on them). A vector env here keeps
every copy's world as float64 arrays and steps them together with mpe2's operations in mpe2's order, so it is *bit
for bit* mpe2 behind :class:`~agilerl_core.envs.multi_agent.ParallelVectorEnv`: the same observations, rewards,
truncations and autoresets for the same seeds and actions (each copy keeps its own generator, seeded as mpe2 seeds
it and drawn in mpe2's order at every reset; tests/test_mpe_batched.py compares them step by step).
:func:`~agilerl_core.envs.multi_agent.make_parallel_vector_env` builds one for these envs in the learner's process
when every option is one it reproduces (:attr:`BatchedMPE.options`); anything else (``render_mode``,
``benchmark_data``, spread's curriculum and partial observability) steps mpe2 itself.

The physics (mpe2's core): a movable agent's force is its action (continuous: 5 inputs, (a2 - a1, a4 - a3); discrete:
no-op, -x, +x, -y, +y) times 5; colliding agents push apart by 100 x softplus penetration (margin 1e-3); then
position += velocity x 0.1, velocity x 0.75, velocity += force x 0.1 (mass 1, no speed limit).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces

AgentArrays = dict[str, np.ndarray]

_DT, _DAMPING, _SENSITIVITY, _CONTACT_FORCE, _CONTACT_MARGIN = 0.1, 0.25, 5.0, 1e2, 1e-3


def batched_class(fn: Any) -> type[BatchedMPE] | None:
    """The batched vector env of the parallel_env function `fn`, None when it is not one of mpe2's reproduced
    here (or mpe2 is not installed)."""
    try:
        import mpe2.simple_speaker_listener_v4 as listener
        import mpe2.simple_spread_v3 as spread
    except ImportError:
        return None
    return {listener.parallel_env: SpeakerListenerVector, spread.parallel_env: SpreadVector}.get(fn)


class BatchedMPE(ABC):
    """`num_envs` copies of one MPE scenario as arrays, with :class:`~agilerl_core.envs.multi_agent.
    ParallelVectorEnv`'s API and results (same-step autoreset, ``info`` keys, action checks). A scenario says its
    agents, observation widths, how a world resets (one copy, mpe2's draws), steps (all copies) and is seen."""

    options: ClassVar[frozenset[str]] = frozenset({"continuous_actions", "max_cycles", "dynamic_rescaling"})
    words: ClassVar[dict[str, int]] = {}  # a speaking agent's vocabulary (its actions beyond moving)

    def __init__(self, num_envs: int, agents: list[str], obs_dims: dict[str, int], movable: set[str],
                 continuous_actions: bool, max_cycles: int) -> None:
        if num_envs < 1:
            raise ValueError("a vector env needs at least one env")
        self.num_envs, self.continuous, self.max_cycles = int(num_envs), bool(continuous_actions), int(max_cycles)
        self.agents = list(agents)
        inf = np.float32(np.inf)  # the spaces as mpe2 declares them
        self.observation_spaces = {a: spaces.Box(-inf, inf, (obs_dims[a],), np.float32) for a in self.agents}
        sizes = {a: (5 if a in movable else 0) + self.words.get(a, 0) for a in self.agents}
        self.action_spaces = {a: spaces.Box(0, 1, (size,)) if self.continuous else spaces.Discrete(size)
                              for a, size in sizes.items()}
        self._rngs = [np.random.default_rng() for _ in range(self.num_envs)]  # mpe2 seeds from entropy at first
        self._steps = np.zeros(self.num_envs, dtype=np.int64)
        self._alive = {a: np.ones(self.num_envs, dtype=bool) for a in self.agents}
        self._pending: AgentArrays | None = None

    # ---- a scenario's part -------------------------------------------------------------------------------------
    @abstractmethod
    def _reset_world(self, i: int) -> None:
        """Copy `i`'s world anew from its own generator, drawn in mpe2's order."""

    @abstractmethod
    def _world_step(self, actions: AgentArrays) -> dict[str, np.ndarray]:
        """Every copy's world one step on (checked actions); each agent's reward [N] (float64)."""

    @abstractmethod
    def _observations(self) -> AgentArrays:
        """Every agent's observation [N, dim] (float32) of every copy's world."""

    # ---- mpe2's mechanics for all copies --------------------------------------------------------------------------
    def _force(self, action: np.ndarray) -> np.ndarray:
        """A movable agent's force [N, 2] from its actions (its first 5 columns, or its discrete choice)."""
        u = np.zeros((self.num_envs, 2))
        if self.continuous:  # float32 differences, as mpe2 takes them, added to float64 zeros
            u[:, 0] += action[:, 2] - action[:, 1]
            u[:, 1] += action[:, 4] - action[:, 3]
        else:
            u[:, 0] = np.where(action == 1, -1.0, np.where(action == 2, 1.0, 0.0))
            u[:, 1] = np.where(action == 3, -1.0, np.where(action == 4, 1.0, 0.0))
        u *= _SENSITIVITY
        return u + 0.0  # mpe2 adds the (absent) action noise

    @staticmethod
    def _integrate(pos: np.ndarray, vel: np.ndarray, force: np.ndarray) -> np.ndarray:
        """Positions moved in place; the new velocities (mass 1, no speed limit)."""
        pos += vel * _DT
        vel = vel * (1 - _DAMPING)
        vel += (force / 1.0) * _DT
        return vel

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
        rewards = {a: r.astype(np.float32) for a, r in self._world_step(self._checked(actions)).items()}
        self._steps += 1
        done = self._steps >= self.max_cycles
        obs, masks = self._observations(), self._masks()
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
        return obs, rewards, {a: np.zeros(self.num_envs, dtype=bool) for a in self.agents}, \
            {a: done.copy() for a in self.agents}, info

    def _masks(self) -> dict[str, np.ndarray | None]:
        if self.continuous:
            return {a: None for a in self.agents}
        return {a: np.ones((self.num_envs, int(s.n)), dtype=bool) for a, s in self.action_spaces.items()}

    def close(self) -> None:
        """Drop a started step's actions (no process or handle to release: the worlds are arrays)."""
        self._pending = None


SPEAKER, LISTENER = "speaker_0", "listener_0"
_LANDMARK_COLORS = np.array([[0.65, 0.15, 0.15], [0.15, 0.65, 0.15], [0.15, 0.15, 0.65]])


class SpeakerListenerVector(BatchedMPE):
    """``simple_speaker_listener_v4``: a speaker that cannot move says one of 3 words (continuous: any vector in
    [0, 1]^3) about the goal landmark's colour; the listener, which hears it and sees the three landmarks relative
    to itself, moves; both are rewarded -|listener - goal|^2 after each step."""

    words: ClassVar[dict[str, int]] = {SPEAKER: 3}

    def __init__(self, num_envs: int, continuous_actions: bool = False, max_cycles: int = 25,
                 dynamic_rescaling: bool = True) -> None:
        super().__init__(num_envs, [SPEAKER, LISTENER], {SPEAKER: 3, LISTENER: 11}, {LISTENER},
                         continuous_actions, max_cycles)
        n = self.num_envs
        self._pos, self._vel = np.zeros((n, 2)), np.zeros((n, 2))  # the listener's (the speaker's is never seen)
        self._landmarks = np.zeros((n, 3, 2))
        self._goal = np.zeros(n, dtype=np.int64)
        self._word = np.zeros((n, 3))  # the speaker's communication state
        for i in range(n):
            self._reset_world(i)  # as mpe2's constructor does

    def _reset_world(self, i: int) -> None:
        rng = self._rngs[i]
        self._goal[i] = int(rng.integers(3))
        rng.uniform(-1, +1, 2)  # the speaker's position: drawn (mpe2's order), never used
        self._pos[i] = rng.uniform(-1, +1, 2)
        for j in range(3):
            self._landmarks[i, j] = rng.uniform(-1, +1, 2)
        self._vel[i] = 0.0
        self._word[i] = 0.0
        self._steps[i] = 0

    def _world_step(self, actions: AgentArrays) -> dict[str, np.ndarray]:
        n = self.num_envs
        force = self._force(actions[LISTENER])
        if self.continuous:
            self._word = actions[SPEAKER] + 0.0  # the speaker's word is its action (no noise)
        else:
            self._word = np.zeros((n, 3))
            self._word[np.arange(n), actions[SPEAKER]] = 1.0
        self._vel = self._integrate(self._pos, self._vel, force)
        reward = -np.sum(np.square(self._pos - self._landmarks[np.arange(n), self._goal]), axis=1)
        return {SPEAKER: reward, LISTENER: reward}

    def _observations(self) -> AgentArrays:
        rel = self._landmarks - self._pos[:, None, :]
        listener = np.concatenate([self._vel, rel.reshape(self.num_envs, -1), self._word], axis=1)
        return {SPEAKER: _LANDMARK_COLORS[self._goal].astype(np.float32), LISTENER: listener.astype(np.float32)}


class SpreadVector(BatchedMPE):
    """``simple_spread_v3`` (full observability, no curriculum, no early termination): N agents of radius 0.15
    cover N landmarks; each is rewarded ``local_ratio`` x -(other agents it overlaps) plus ``1 - local_ratio`` x
    the team's -(sum over landmarks of the nearest agent's distance); each sees its velocity, position, the
    landmarks and the other agents relative to it, and their (silent, zero) words."""

    options: ClassVar[frozenset[str]] = BatchedMPE.options | {"N", "local_ratio"}
    _SIZE = 0.15

    def __init__(self, num_envs: int, N: int = 3, local_ratio: float = 0.5,  # N: mpe2's keyword
                 continuous_actions: bool = False, max_cycles: int = 25, dynamic_rescaling: bool = True) -> None:
        if not 0.0 <= local_ratio <= 1.0:
            raise ValueError(f"local_ratio is a proportion in [0, 1], got {local_ratio}")
        self.n_agents, self.local_ratio = int(N), float(local_ratio)
        names = [f"agent_{i}" for i in range(self.n_agents)]
        width = 4 + 2 * self.n_agents + 4 * (self.n_agents - 1)
        super().__init__(num_envs, names, dict.fromkeys(names, width), set(names), continuous_actions, max_cycles)
        n, m = self.num_envs, self.n_agents
        self._pos, self._vel, self._landmarks = np.zeros((n, m, 2)), np.zeros((n, m, 2)), np.zeros((n, m, 2))
        for i in range(n):
            self._reset_world(i)

    def _reset_world(self, i: int) -> None:
        rng = self._rngs[i]
        for j in range(self.n_agents):
            self._pos[i, j] = rng.uniform(-1, +1, 2)
        for j in range(self.n_agents):
            self._landmarks[i, j] = rng.uniform(-1, +1, 2)
        self._vel[i] = 0.0
        self._steps[i] = 0

    def _world_step(self, actions: AgentArrays) -> dict[str, np.ndarray]:
        m, pos = self.n_agents, self._pos
        force = np.stack([self._force(actions[a]) for a in self.agents], axis=1)
        reach = self._SIZE + self._SIZE
        for a in range(m):  # mpe2's pair loop: every pair once, each force added in front of what was there
            for b in range(a + 1, m):
                delta = pos[:, a] - pos[:, b]
                dist = np.sqrt(np.sum(np.square(delta), axis=1))
                penetration = np.logaddexp(0, -(dist - reach) / _CONTACT_MARGIN) * _CONTACT_MARGIN
                push = _CONTACT_FORCE * delta / dist[:, None] * penetration[:, None]
                force[:, a] = push + force[:, a]
                force[:, b] = -push + force[:, b]
        self._vel = self._integrate(pos, self._vel, force)
        team = np.zeros(self.num_envs)
        for j in range(m):
            team -= np.min(np.sqrt(np.sum(np.square(pos - self._landmarks[:, j: j + 1]), axis=2)), axis=1)
        apart = np.sqrt(np.sum(np.square(pos[:, :, None] - pos[:, None, :]), axis=3))  # [N, m, m]
        overlaps = ((apart < reach) & ~np.eye(m, dtype=bool)).sum(axis=1)  # per agent: the others it overlaps
        own = -1.0 * overlaps
        return {a: team * (1 - self.local_ratio) + own[:, i] * self.local_ratio for i, a in enumerate(self.agents)}

    def _observations(self) -> AgentArrays:
        n, m = self.num_envs, self.n_agents
        out = {}
        for i, a in enumerate(self.agents):
            here = self._pos[:, i: i + 1]
            others = [j for j in range(m) if j != i]
            parts = [self._vel[:, i], self._pos[:, i], (self._landmarks - here).reshape(n, -1),
                     (self._pos[:, others] - here).reshape(n, -1), np.zeros((n, 2 * (m - 1)))]
            out[a] = np.concatenate(parts, axis=1).astype(np.float32)
        return out
