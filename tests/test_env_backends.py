"""The envpool backend keeps the Python path's transition semantics: same-step autoreset, the true last observation
in final_obs, the step's own terminated/truncated flags, seeded episodes; and it trains through the pipeline."""

from __future__ import annotations

import numpy as np
import pytest

import agilerl_core as ac
from agilerl_core.envs.envpool_backend import EnvpoolVector
from agilerl_core.envs.make import EnvRecipe
from agilerl_core.errors import ConfigError
from tests.conftest import tiny_config


def _contract(env, steps: int = 400, limit: int | None = None) -> dict:
    """Step `env` (CartPole, 4 sub-envs) with a fixed pattern and check each step against same-step autoreset;
    returns counts of what it saw."""
    obs, _ = env.reset(seed=3)
    seen = {"terminated": 0, "truncated": 0}
    length = np.zeros(env.num_envs, int)
    for t in range(steps):
        actions = np.array([0, 1, t % 2, (t // 2) % 2])  # two fall fast, two balance until the time limit
        nxt, reward, terminated, truncated, info = env.step(actions)
        length += 1
        assert reward.shape == (env.num_envs,) and np.all(reward == 1.0)
        done = terminated | truncated
        for i in np.flatnonzero(done):
            final = info["final_obs"][i]
            assert info["_final_obs"][i] and final.shape == (4,)
            if terminated[i]:  # CartPole ends when the pole falls or the cart leaves the track
                assert abs(final[2]) > 0.2094 or abs(final[0]) > 2.4
                seen["terminated"] += 1
            else:
                assert limit is not None and length[i] == limit and not terminated[i]
                seen["truncated"] += 1
            assert np.all(np.abs(nxt[i]) <= 0.05)  # the next episode's first observation, returned at once
            length[i] = 0
        for i in np.flatnonzero(~done):
            assert not np.allclose(nxt[i], obs[i])  # a sub-env that goes on moved from where it was
        obs = nxt
    return seen


@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium_async", "envpool"])
def test_every_backend_autoreset_in_the_same_step_with_the_true_last_observation(backend):
    env = EnvRecipe("CartPole-v1", {"max_episode_steps": 30} if backend == "envpool" else {}, backend=backend,
                    wrappers=() if backend == "envpool" else tiny_config(env_wrappers=[{
                        "wrapper": "gymnasium.wrappers.TimeLimit", "kwargs": {"max_episode_steps": 30}}]).env_wrappers
                    ).vector(4)
    try:
        seen = _contract(env, limit=30)
    finally:
        env.close()
    assert seen["terminated"] > 10 and seen["truncated"] > 0  # both endings happened and were told apart


def test_envpool_episodes_follow_the_seed():
    def first_steps(seed: int) -> np.ndarray:
        env = EnvpoolVector("CartPole-v1", 3)
        obs, _ = env.reset(seed=seed)
        out = [obs]
        for _ in range(5):
            obs = env.step(np.ones(3, dtype=np.int64))[0]
            out.append(obs)
        return np.stack(out)

    assert np.array_equal(first_steps(7), first_steps(7))
    assert not np.array_equal(first_steps(7), first_steps(8))


@pytest.mark.parametrize("backend", ["envpool", "gymnasium_async"])
def test_a_population_trains_deterministically_on_other_backends(backend, tmp_path):
    def run(out: str):
        return ac.evolve(tiny_config(env_backend=backend, output_dir=out, population_size=2, max_env_steps=800,
                                     num_envs=2, eval_episodes=2), progress=False)

    a, b = run(str(tmp_path / "a")), run(str(tmp_path / "b"))
    assert [h.fitnesses for h in a.history] == [h.fitnesses for h in b.history]
    assert a.elite.observation_space.shape == (4,) and a.elite.env["env_id"] == "CartPole-v1"
    assert ac.load(a.run_dir / "elite").predict(np.zeros(4, np.float32)) in (0, 1)


def test_envpool_misuse_is_named_before_any_work():
    with pytest.raises(ConfigError, match=r"^env_id: 'CartPol-v1' is not an envpool task\. Did you mean 'CartPole-v1'"):
        tiny_config(env_backend="envpool", env_id="CartPol-v1").check_env()
    with pytest.raises(ConfigError, match=r"env_wrappers: the envpool backend"):
        tiny_config(env_backend="envpool", env_wrappers=[{"wrapper": "gymnasium.wrappers.FlattenObservation"}])
    with pytest.raises(ConfigError, match=r"env_backend: multi-agent envs"):
        tiny_config(kind="multi_agent", env_id="tests.ma_envs:cue_team", algorithm="matd3", env_backend="envpool")
    with pytest.raises(ConfigError, match=r"^env_backend: envpool builds its envs by task id"):
        ac.evolve(tiny_config(env_backend="envpool"), env=lambda: None, progress=False)
