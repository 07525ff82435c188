"""mpe2's speaker-listener stepped for all copies at once equals mpe2 stepping each copy, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from agilerl_core.envs.mpe_batched import SpeakerListenerVector
from agilerl_core.envs.multi_agent import (
    ParallelVectorEnv,
    ProcessParallelVectorEnv,
    _EnvFactory,
    make_parallel_vector_env,
)

ENV = "mpe2:simple_speaker_listener_v4"


def _equal(a, b, what):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _equal(x, y, f"{what}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            _equal(a[k], b[k], f"{what}.{k}")
    elif a is None:
        assert b is None, what
    else:
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, what
        assert np.array_equal(a, b), what


def _actions(rng, vec, continuous):
    if continuous:  # some outside [0, 1]: both clip them
        return {a: rng.uniform(-0.3, 1.3, (vec.num_envs, *s.shape)).astype(np.float32)
                for a, s in vec.action_spaces.items()}
    return {a: rng.integers(0, s.n, vec.num_envs) for a, s in vec.action_spaces.items()}


@pytest.mark.parametrize(("kwargs", "steps"), [({"continuous_actions": True}, 80), ({}, 60),
                                               ({"continuous_actions": True, "max_cycles": 7}, 30)],
                         ids=["continuous", "discrete", "max_cycles-7"])
def test_every_step_equals_mpe2s_own(kwargs, steps):
    """Seeded resets, clipped actions, rewards, truncations, same-step autoresets (final observations and the
    next episode's first), masks and the alive flags: equal to the bit, episode after episode."""
    n = 5
    theirs = ParallelVectorEnv([_EnvFactory(ENV, kwargs)] * n)
    ours = SpeakerListenerVector(n, **kwargs)
    assert ours.agents == theirs.agents
    for a in ours.agents:
        assert ours.observation_spaces[a] == theirs.observation_spaces[a]
        assert ours.action_spaces[a] == theirs.action_spaces[a]
    continuous = kwargs.get("continuous_actions", False)
    _equal(ours.reset(seed=3), theirs.reset(seed=3), "reset")
    rng = np.random.default_rng(0)
    ended = 0
    for t in range(steps):
        act = _actions(rng, ours, continuous)
        mine, want = ours.step({a: x.copy() for a, x in act.items()}), theirs.step(act)
        _equal(mine, want, f"step {t}")
        ended += int(mine[4]["env_done"].sum())
    assert ended >= 2 * n  # episodes ended and restarted from each copy's own generator
    _equal(ours.reset(seed=11), theirs.reset(seed=11), "reseeded")
    theirs.close()


def test_the_learners_vector_env_is_the_batched_one_where_it_reproduces_mpe2():
    assert isinstance(make_parallel_vector_env(ENV, 2, {"continuous_actions": True}), SpeakerListenerVector)
    assert isinstance(make_parallel_vector_env(ENV, 2, {"max_cycles": 10, "dynamic_rescaling": False}),
                      SpeakerListenerVector)
    other = make_parallel_vector_env(ENV, 2, {"benchmark_data": True})  # only mpe2 fills benchmark data
    assert type(other) is ParallelVectorEnv
    other.close()
    workers = make_parallel_vector_env(ENV, 2, None, workers=1)
    assert isinstance(workers, ProcessParallelVectorEnv)
    workers.close()


def test_bad_actions_are_refused_as_mpe2s_vector_refuses_them():
    ours = SpeakerListenerVector(2, continuous_actions=True)
    ours.reset(seed=0)
    with pytest.raises(ValueError, match="action for 'speaker_0' has shape"):
        ours.step({"speaker_0": np.zeros((2, 4), np.float32), "listener_0": np.zeros((2, 5), np.float32)})
    discrete = SpeakerListenerVector(2)
    discrete.reset(seed=0)
    with pytest.raises(ValueError, match=r"action \S*7\S* for 'listener_0' is not in its space"):
        discrete.step({"speaker_0": np.array([0, 1]), "listener_0": np.array([7, 0])})
    with pytest.raises(ValueError, match="a vector env needs at least one env"):
        SpeakerListenerVector(0)
