"""Stepping an AEC-backed PettingZoo parallel env directly, without its wrapper chain.

Most PettingZoo parallel envs (MPE, SISL) are AEC envs behind ``aec_to_parallel_wrapper`` and a chain of
checking wrappers (order enforcing, out-of-bounds clipping or assertion). Each attribute the conversion
reads walks that chain through ``__getattr__``, and every agent's turn computes an observation that is
thrown away (``last()``): for MPE this bookkeeping costs about twice the simulation itself (16 copies of
simple_speaker_listener: 1.5 ms per step through PettingZoo, 0.54 ms directly, measured here).

:class:`DirectAECParallel` does the conversion's work on the innermost env: the same agent cycle, reward
sums, flags and dead-agent steps, with the wrappers' checks done inline (Box actions clipped to the space,
which leaves in-bounds actions unchanged; Discrete actions checked). It assumes what PettingZoo's API
states: ``observe`` has no side effects. :func:`direct_parallel` uses it only when every wrapper in the
chain is one of those three; any other env is returned as it is.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.conversions import aec_to_parallel_wrapper
from pettingzoo.utils.wrappers import (
    AssertOutOfBoundsWrapper,
    BaseWrapper,
    ClipOutOfBoundsWrapper,
    OrderEnforcingWrapper,
)

_CHECKING_WRAPPERS = (OrderEnforcingWrapper, ClipOutOfBoundsWrapper, AssertOutOfBoundsWrapper)


def direct_parallel(env: Any) -> Any:
    """`env` stepped through :class:`DirectAECParallel` when it is an AEC env converted to parallel behind
    checking wrappers only; `env` itself otherwise."""
    if type(env) is not aec_to_parallel_wrapper:
        return env
    inner, chain = env.aec_env, set()
    while isinstance(inner, BaseWrapper):
        if type(inner) not in _CHECKING_WRAPPERS:
            return env
        chain.add(type(inner))
        inner = inner.env
    return DirectAECParallel(env, inner, clip=ClipOutOfBoundsWrapper in chain,
                             check=AssertOutOfBoundsWrapper in chain)


class DirectAECParallel:
    """The parallel API of `wrapped` (an ``aec_to_parallel_wrapper``), stepping its innermost AEC env `raw`;
    Box actions are clipped to their space when `clip` (ClipOutOfBoundsWrapper's work), Discrete ones checked
    when `check` (AssertOutOfBoundsWrapper's), and passed on unchanged otherwise."""

    def __init__(self, wrapped: aec_to_parallel_wrapper, raw: Any, clip: bool, check: bool) -> None:
        self._wrapped = wrapped
        self._raw = raw
        self.possible_agents = list(wrapped.possible_agents)
        self.metadata = wrapped.metadata
        self._spaces = {a: wrapped.action_space(a) for a in self.possible_agents}
        self._clip = {a: (s.low, s.high, s.shape) for a, s in self._spaces.items()
                      if clip and isinstance(s, spaces.Box)}
        self._check = {a for a, s in self._spaces.items() if check and isinstance(s, spaces.Discrete)}

    @property
    def agents(self) -> list[str]:
        return self._raw.agents

    @property
    def unwrapped(self) -> Any:
        return self._raw

    def observation_space(self, agent: str) -> spaces.Space:
        return self._wrapped.observation_space(agent)

    def action_space(self, agent: str) -> spaces.Space:
        return self._spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        raw = self._raw
        raw.reset(seed=seed, options=options)
        obs = {a: raw.observe(a) for a in raw.agents if not (raw.terminations[a] or raw.truncations[a])}
        return obs, dict(**raw.infos)

    def _checked(self, agent: str, action: Any) -> Any:
        box = self._clip.get(agent)
        if box is not None:
            low, high, shape = box
            action = np.asarray(action)
            if action.shape != shape:
                raise ValueError(f"action for {agent!r} has shape {action.shape}, the env's space {shape}")
            return np.minimum(np.maximum(action, low), high)  # np.clip, at a quarter of its cost
        if agent in self._check and not self._spaces[agent].contains(action):
            raise ValueError(f"action {action!r} for {agent!r} is not in its space {self._spaces[agent]}")
        return action

    def checked_batch(self, actions: dict[str, np.ndarray], acting: dict[str, np.ndarray] | None = None
                      ) -> dict[str, np.ndarray]:
        """The checks :meth:`step` does, for a batch of actions of many copies of this env at once (every agent's
        [N, ...]): Box actions clipped, Discrete ones checked (only the rows where `acting` [N] is set, when
        given). Their rows then step with ``checked=True``."""
        out = dict(actions)
        for agent, (low, high, shape) in self._clip.items():
            action = np.asarray(actions[agent])
            if action.shape[1:] != shape:
                raise ValueError(f"action for {agent!r} has shape {action.shape[1:]}, the env's space {shape}")
            out[agent] = np.minimum(np.maximum(action, low), high)
        for agent in self._check:
            space, action = self._spaces[agent], np.asarray(actions[agent]).reshape(-1)
            bad = np.ones(action.shape, dtype=bool) if action.dtype.kind not in "iu" else \
                (action < space.start) | (action >= space.start + space.n)
            if acting is not None:  # an agent out of its episode does not act: its rows are not looked at
                bad &= acting[agent]
            if bad.any():
                raise ValueError(f"action {action[bad][0]!r} for {agent!r} is not in its space {space}")
        return out

    def step(self, actions: dict[str, Any], checked: bool = False) -> tuple[dict, dict, dict, dict, dict]:
        """One parallel step; `checked`: the actions passed :meth:`checked_batch` already."""
        raw = self._raw
        rewards: dict[str, float] = defaultdict(int)
        for agent in raw.agents:
            if agent != raw.agent_selection:
                raise AssertionError(f"expected agent {agent}, got {raw.agent_selection}: a parallel env's "
                                     f"agents must step in one cycle and die only at its end")
            raw.step(actions[agent] if checked else self._checked(agent, actions[agent]))
            step_rewards = raw.rewards
            for a in raw.agents:
                rewards[a] += step_rewards[a]
        terminations = dict(**raw.terminations)
        truncations = dict(**raw.truncations)
        infos = dict(**raw.infos)
        observations = {a: raw.observe(a) for a in raw.agents}
        while raw.agents and (raw.terminations[raw.agent_selection] or raw.truncations[raw.agent_selection]):
            raw.step(None)
        return observations, rewards, terminations, truncations, infos

    def close(self) -> None:
        self._wrapped.close()
