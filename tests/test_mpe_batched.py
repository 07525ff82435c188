"""mpe2's speaker-listener and spread stepped for all copies at once equal mpe2 stepping each copy, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from agilerl_core.envs.mpe_batched import SpeakerListenerVector, SpreadVector
from agilerl_core.envs.multi_agent import (
    ParallelVectorEnv,
    ProcessParallelVectorEnv,
    _EnvFactory,
    make_parallel_vector_env,
)

ENV = "mpe2:simple_speaker_listener_v4"
SPREAD = "mpe2:simple_spread_v3"


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


@pytest.mark.parametrize(("env", "kwargs", "steps"), [
    (ENV, {"continuous_actions": True}, 80), (ENV, {}, 60), (ENV, {"continuous_actions": True, "max_cycles": 7}, 30),
    (SPREAD, {"continuous_actions": True}, 80), (SPREAD, {}, 60),
    (SPREAD, {"continuous_actions": True, "N": 4, "local_ratio": 0.3, "max_cycles": 9}, 40)],
    ids=["listener-continuous", "listener-discrete", "listener-max_cycles-7", "spread-continuous", "spread-discrete",
         "spread-4-agents"])
def test_every_step_equals_mpe2s_own(env, kwargs, steps):
    """Seeded resets, clipped actions, rewards (spread's collisions and team term included), truncations,
    same-step autoresets (final observations and the next episode's first), masks and the alive flags: equal to
    the bit, episode after episode."""
    n = 5
    theirs = ParallelVectorEnv([_EnvFactory(env, kwargs)] * n)
    ours = make_parallel_vector_env(env, n, kwargs)
    assert type(ours) is (SpeakerListenerVector if env == ENV else SpreadVector)
    assert ours.agents == theirs.agents
    for a in ours.agents:
        assert ours.observation_spaces[a] == theirs.observation_spaces[a]
        assert ours.action_spaces[a] == theirs.action_spaces[a]
    continuous = kwargs.get("continuous_actions", False)
    _equal(ours.reset(seed=3), theirs.reset(seed=3), "reset")
    rng = np.random.default_rng(0)
    ended = hits = 0
    for t in range(steps):
        act = _actions(rng, ours, continuous)
        mine, want = ours.step({a: x.copy() for a, x in act.items()}), theirs.step(act)
        _equal(mine, want, f"step {t}")
        ended += int(mine[4]["env_done"].sum())
        if env == SPREAD:
            apart = np.linalg.norm(ours._pos[:, :, None] - ours._pos[:, None, :], axis=3)
            hits += int(((apart < 0.3) & ~np.eye(apart.shape[1], dtype=bool)).sum())
    assert ended >= 2 * n  # episodes ended and restarted from each copy's own generator
    if env == SPREAD:  # agents overlapped (the collision forces and penalties were exercised)
        assert hits > 0
    _equal(ours.reset(seed=11), theirs.reset(seed=11), "reseeded")
    theirs.close()


def test_the_learners_vector_env_is_the_batched_one_where_it_reproduces_mpe2():
    assert isinstance(make_parallel_vector_env(ENV, 2, {"continuous_actions": True}), SpeakerListenerVector)
    assert isinstance(make_parallel_vector_env(ENV, 2, {"max_cycles": 10, "dynamic_rescaling": False}),
                      SpeakerListenerVector)
    assert isinstance(make_parallel_vector_env(SPREAD, 2, {"N": 2, "local_ratio": 0.1}), SpreadVector)
    for env, kwargs in [(ENV, {"benchmark_data": True}), (SPREAD, {"curriculum": True}),  # only mpe2 does these
                        (SPREAD, {"num_agent_neighbors": 1})]:
        other = make_parallel_vector_env(env, 2, kwargs)
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
    with pytest.raises(ValueError, match="local_ratio is a proportion"):
        SpreadVector(2, local_ratio=1.5)
