"""Small PettingZoo parallel envs for the multi-agent tests (named as tests.ma_envs:<function>)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class CueTeam(ParallelEnv):
    """Two agents, one team. ``pointer_0`` (Box obs: a cue in [-1, 1]; Box action in [-1, 1]) is rewarded
    -(action - cue)^2; ``chooser_0`` (Discrete obs: a bit; Discrete(2) action) gets 1 when its action equals
    the bit. Both receive the team's reward (the sum). Cues are redrawn every step; episodes last `length`
    steps. With `chooser_dies_at`, chooser_0 terminates after that many steps while pointer_0 plays on.
    Optimal return per agent: `length`; random play: about length * (0.5 - 0.67)."""

    metadata: ClassVar[dict] = {"name": "cue_team_v0"}

    def __init__(self, length: int = 5, chooser_dies_at: int | None = None, image_obs: bool = False,
                 masked: bool = False) -> None:
        self.possible_agents = ["pointer_0", "chooser_0"]
        self.length = length
        self.chooser_dies_at = chooser_dies_at
        self._obs_spaces = {"pointer_0": spaces.Box(-1.0, 1.0, (1,), np.float32),
                            "chooser_0": spaces.Discrete(2)}
        if image_obs:
            self._obs_spaces["pointer_0"] = spaces.Box(0, 255, (8, 8, 3), np.uint8)
        self._act_spaces = {"pointer_0": spaces.Box(-1.0, 1.0, (1,), np.float32),
                            "chooser_0": spaces.Discrete(3 if masked else 2)}
        self.masked = masked  # chooser_0 gets a third action, allowed only at even steps (info's action_mask)
        self.agents: list[str] = []
        self._rng = np.random.default_rng()

    def observation_space(self, agent):
        return self._obs_spaces[agent]

    def action_space(self, agent):
        return self._act_spaces[agent]

    def _draw(self):
        self.cue = float(self._rng.uniform(-1, 1))
        self.bit = int(self._rng.integers(2))
        return {"pointer_0": np.array([self.cue], np.float32), "chooser_0": self.bit}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        return self._draw(), self._infos(self.agents)

    def _infos(self, agents):
        infos = {a: {} for a in agents}
        if self.masked and "chooser_0" in infos:
            infos["chooser_0"]["action_mask"] = np.array([1, 1, int(self.t % 2 == 0)], dtype=np.int8)
        return infos

    def step(self, actions):
        live = list(self.agents)
        if self.masked and "chooser_0" in live and int(actions["chooser_0"]) == 2 and self.t % 2:
            raise AssertionError(f"chooser_0 took the masked action 2 at step {self.t}")
        team = 0.0
        if "pointer_0" in live:
            team += 1.0 - float(np.asarray(actions["pointer_0"]).reshape(-1)[0] - self.cue) ** 2
        if "chooser_0" in live:
            team += float(int(actions["chooser_0"]) == self.bit)
        self.t += 1
        obs = self._draw()
        obs = {a: obs[a] for a in live}
        rewards = {a: team for a in live}
        trunc = {a: self.t >= self.length for a in live}
        term = {a: False for a in live}
        if self.chooser_dies_at is not None and "chooser_0" in live and self.t >= self.chooser_dies_at:
            term["chooser_0"] = True
        self.agents = [a for a in live if not (term[a] or trunc[a])]
        return obs, rewards, term, trunc, self._infos(live)


def cue_team(**kwargs) -> CueTeam:
    return CueTeam(**kwargs)


def not_parallel():
    """Returns something that is not a parallel env."""
    return object()


class Solo(ParallelEnv):
    """A Gymnasium env as a one-agent parallel env (agent ``solo_0``): what IPPO must learn exactly as PPO."""

    metadata: ClassVar[dict] = {"name": "solo_v0"}

    def __init__(self, env_id: str = "CartPole-v1") -> None:
        import gymnasium as gym

        self.env = gym.make(env_id)
        self.possible_agents = ["solo_0"]
        self.agents: list[str] = []

    def observation_space(self, agent):
        return self.env.observation_space

    def action_space(self, agent):
        return self.env.action_space

    def reset(self, seed=None, options=None):
        obs, info = self.env.reset(seed=seed)
        self.agents = ["solo_0"]
        return {"solo_0": obs}, {"solo_0": info}

    def step(self, actions):
        obs, r, term, trunc, info = self.env.step(actions["solo_0"])
        if term or trunc:
            self.agents = []
        return {"solo_0": obs}, {"solo_0": r}, {"solo_0": term}, {"solo_0": trunc}, {"solo_0": info}

    def close(self):
        self.env.close()


def solo(env_id: str = "CartPole-v1") -> Solo:
    return Solo(env_id)


def cue_team_aec(**kwargs):
    """:class:`CueTeam` as an AEC env behind PettingZoo's parallel conversion and its order-enforcing wrapper
    (the shape of MPE's envs), so the direct stepping path (``envs.aec_direct``) runs on it."""
    from pettingzoo.utils.conversions import aec_to_parallel_wrapper, parallel_to_aec_wrapper
    from pettingzoo.utils.wrappers import OrderEnforcingWrapper

    return aec_to_parallel_wrapper(OrderEnforcingWrapper(parallel_to_aec_wrapper(CueTeam(**kwargs))))


class Pointers(ParallelEnv):
    """`n` identical agents ``pointer_0``.. (Box obs: each its own cue in [-1, 1]; Box action in [-1, 1]), each
    rewarded 1 - (action - cue)^2, plus a ``chooser_0`` of another kind (as :class:`CueTeam`'s): the identical
    pointers can share one policy (share_policy: group). Episodes last `length` steps; optimal return per agent
    `length`."""

    metadata: ClassVar[dict] = {"name": "pointers_v0"}

    def __init__(self, n: int = 2, length: int = 5) -> None:
        self.pointers = [f"pointer_{i}" for i in range(n)]
        self.possible_agents = [*self.pointers, "chooser_0"]
        self.length = length
        self.agents: list[str] = []
        self._rng = np.random.default_rng()

    def observation_space(self, agent):
        return spaces.Discrete(2) if agent == "chooser_0" else spaces.Box(-1.0, 1.0, (1,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2) if agent == "chooser_0" else spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _draw(self):
        self.cues = self._rng.uniform(-1, 1, len(self.pointers)).astype(np.float32)
        self.bit = int(self._rng.integers(2))
        return {**{a: self.cues[i: i + 1] for i, a in enumerate(self.pointers)}, "chooser_0": self.bit}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        return self._draw(), {a: {} for a in self.agents}

    def step(self, actions):
        rewards = {a: 1.0 - float(np.asarray(actions[a]).reshape(-1)[0] - self.cues[i]) ** 2
                   for i, a in enumerate(self.pointers)}
        rewards["chooser_0"] = float(int(actions["chooser_0"]) == self.bit)
        self.t += 1
        obs = self._draw()
        trunc = {a: self.t >= self.length for a in self.agents}
        term = {a: False for a in self.agents}
        live = list(self.agents)
        self.agents = [] if self.t >= self.length else live
        return obs, rewards, term, trunc, {a: {} for a in live}


def pointers(**kwargs) -> Pointers:
    return Pointers(**kwargs)
