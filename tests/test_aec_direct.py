"""Stepping AEC-backed parallel envs directly gives exactly what PettingZoo's conversion gives."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium import spaces

from agilerl_core.envs.aec_direct import DirectAECParallel, direct_parallel
from agilerl_core.envs.multi_agent import make_parallel_env
from tests.ma_envs import CueTeam, cue_team_aec


def _random_action(space: spaces.Space, rng: np.random.Generator):
    if isinstance(space, spaces.Discrete):
        return int(rng.integers(space.n))
    # sometimes out of bounds: both paths must clip alike
    return rng.uniform(space.low - 0.2, space.high + 0.2).astype(space.dtype)


def _same(a, b) -> None:
    assert type(a) is type(b) or (isinstance(a, (int, float, np.floating)) and isinstance(b, (int, float, np.floating)))
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a == b


def _trajectories_match(make, steps: int) -> None:
    wrapped, direct = make(), direct_parallel(make())
    assert isinstance(direct, DirectAECParallel)
    rng = np.random.default_rng(0)
    for episode in range(1000):
        _same(wrapped.reset(seed=episode), direct.reset(seed=episode))
        while wrapped.agents:
            assert list(direct.agents) == list(wrapped.agents)
            actions = {a: _random_action(wrapped.action_space(a), rng) for a in wrapped.agents}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # PettingZoo warns when it clips an out-of-bounds action
                got_w = wrapped.step(actions)
            got_d = direct.step(actions)
            _same(tuple(dict(x) for x in got_w), tuple(dict(x) for x in got_d))
            steps -= 1
        assert not direct.agents
        if steps <= 0:
            return


@pytest.mark.parametrize("kwargs", [{"continuous_actions": True}, {"continuous_actions": False}])
def test_speaker_listener_steps_identically(kwargs):
    from mpe2 import simple_speaker_listener_v4

    _trajectories_match(lambda: simple_speaker_listener_v4.parallel_env(max_cycles=10, **kwargs), 60)


def test_spread_steps_identically():
    from mpe2 import simple_spread_v3

    _trajectories_match(lambda: simple_spread_v3.parallel_env(N=3, max_cycles=8, continuous_actions=True), 40)


def test_agent_dying_mid_episode_steps_identically():
    """chooser_0 terminates after 2 steps while pointer_0 plays on: the dead agent's step(None) and its
    removal from `agents` match the conversion's."""
    _trajectories_match(lambda: cue_team_aec(length=5, chooser_dies_at=2), 60)


def test_only_checking_wrappers_are_bypassed():
    from pettingzoo.utils.conversions import aec_to_parallel_wrapper, parallel_to_aec_wrapper
    from pettingzoo.utils.wrappers import BaseWrapper, OrderEnforcingWrapper

    native = CueTeam()
    assert direct_parallel(native) is native  # a native parallel env: untouched

    class Recording(BaseWrapper):  # a wrapper with its own behaviour must keep running
        def step(self, action):
            self.steps = getattr(self, "steps", 0) + 1
            super().step(action)

    env = aec_to_parallel_wrapper(OrderEnforcingWrapper(Recording(parallel_to_aec_wrapper(CueTeam()))))
    assert direct_parallel(env) is env
    assert isinstance(make_parallel_env("mpe2:simple_speaker_listener_v4"), DirectAECParallel)


def test_bad_actions_are_refused():
    """The checks of the wrappers bypassed still run: a Box action of the wrong shape, a Discrete one out of range."""
    from mpe2 import simple_speaker_listener_v4

    env = direct_parallel(simple_speaker_listener_v4.parallel_env(continuous_actions=True))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="speaker_0.*shape"):
        env.step({"speaker_0": np.zeros(2, np.float32), "listener_0": np.zeros(5, np.float32)})
    env = direct_parallel(simple_speaker_listener_v4.parallel_env(continuous_actions=False))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="speaker_0.*not in its space"):
        env.step({"speaker_0": 7, "listener_0": 0})
