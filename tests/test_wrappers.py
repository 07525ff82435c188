"""Env wrappers in the config: applied in order to every env copy (training, evaluation with its own kwargs,
dataset collection), vector wrappers to training only, recorded in checkpoints as data, checked up front."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import agilerl_core as ac
from agilerl_core.config import check_code_allowed, code_references
from agilerl_core.data.collect import collect_episodes
from agilerl_core.envs.make import EnvRecipe
from agilerl_core.errors import ConfigError
from agilerl_core.experiment import build_evolution
from tests.conftest import tiny_config

STACK = [{"wrapper": "gymnasium.wrappers.FrameStackObservation", "kwargs": {"stack_size": 3}},
         {"wrapper": "gymnasium.wrappers.FlattenObservation"}]


def test_wrappers_apply_in_order_everywhere_and_the_checkpoint_records_them(tmp_path):
    import gymnasium as gym

    cfg = tiny_config(env_wrappers=[*STACK, {"wrapper": "gymnasium.wrappers.TimeLimit",
                                             "kwargs": {"max_episode_steps": 30},
                                             "eval_kwargs": {"max_episode_steps": 4}}],
                      vector_wrappers=[{"wrapper": "gymnasium.wrappers.vector.NormalizeReward",
                                        "kwargs": {"gamma": 0.99}}],
                      output_dir=str(tmp_path), max_env_steps=800)
    evo = build_evolution(cfg)
    arena = evo.arena
    assert arena.obs_space.shape == (12,)  # 3 stacked CartPole observations, flattened
    training = arena.recipe.for_training(arena.envs)
    assert isinstance(training[0], gym.wrappers.vector.NormalizeReward)  # training: the vector wrapper, fresh
    assert training[0].env is arena.envs[0] and arena.recipe.for_training(arena.envs)[0] is not training[0]
    assert not isinstance(arena.eval_env, gym.wrappers.vector.NormalizeReward)  # evaluation: the env's own return
    limits = [e._max_episode_steps for e in (arena.envs[0].envs[0], arena.eval_env.envs[0])]
    assert limits == [30, 4]  # eval_kwargs only in evaluation
    res = ac.evolve(cfg, progress=False)
    assert all(f <= 4 for h in res.history for f in h.fitnesses)  # evaluation episodes end after 4 steps
    assert res.elite.env["env_wrappers"][0] == STACK[0] and res.elite.env["vector_wrappers"][0]["kwargs"] == {"gamma": 0.99}
    loaded = ac.load(res.run_dir / "elite")
    assert loaded.observation_space.shape == (12,)
    env = gym.wrappers.FlattenObservation(gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 3))
    obs, _ = env.reset(seed=0)
    assert loaded.predict(obs) == res.elite.predict(obs)
    with pytest.raises(ValueError, match=r"shape \(4,\).*\(12,\).*inside gymnasium.wrappers.FrameStackObservation"):
        loaded.predict(obs[:4])


def test_dataset_collection_records_in_the_wrapped_env():
    eps = collect_episodes("CartPole-v1", "random", 2, num_envs=2, wrappers=tiny_config(env_wrappers=STACK).env_wrappers)
    assert eps[0]["observations"].shape[1:] == (12,)


@pytest.mark.parametrize(("wrappers", "field", "match"), [
    ([{"wrapper": "no_such_module.Wrap"}], "env_wrappers[0].wrapper", "cannot be imported"),
    ([{"wrapper": "gymnasium.wrappers.NoSuchWrapper"}], "env_wrappers[0].wrapper", "not found"),
    ([{"wrapper": "gymnasium.make"}], "env_wrappers[0].wrapper", "a function, not a gymnasium.core.Wrapper"),
    ([{"wrapper": "gymnasium.wrappers.vector.NormalizeReward"}], "env_wrappers[0].wrapper", "vector_wrappers those of"),
    ([{"wrapper": "gymnasium.wrappers.FrameStackObservation", "kwargs": {"stack_sise": 3}}],
     "env_wrappers[0].kwargs", "failed"),
])
def test_bad_wrappers_are_named_before_any_work(wrappers, field, match):
    cfg = tiny_config(env_wrappers=wrappers)
    with pytest.raises(ConfigError, match=rf"^{re.escape(field)}: .*{match}"):
        cfg.check_env() if "kwargs" not in field else build_evolution(cfg)


def test_wrapper_names_and_kinds_are_checked_by_the_config():
    with pytest.raises(ConfigError, match=r"env_wrappers\.0\.wrapper"):
        tiny_config(env_wrappers=[{"wrapper": "not a name"}])
    with pytest.raises(ConfigError, match="env_wrappers: Gymnasium wrappers do not apply to PettingZoo"):
        tiny_config(kind="multi_agent", env_id="tests.ma_envs:cue_team", algorithm="matd3", env_wrappers=STACK,
                    num_envs=2)


def test_wrappers_are_code_a_flow_run_parameter_may_not_name_unless_allowed():
    cfg = tiny_config(env_wrappers=STACK, vector_wrappers=[{"wrapper": "my_pkg.vec:Norm"}])
    refs = code_references(cfg)
    assert refs == {"env_wrappers[0].wrapper": "gymnasium.wrappers", "env_wrappers[1].wrapper": "gymnasium.wrappers",
                    "vector_wrappers[0].wrapper": "my_pkg.vec"}
    with pytest.raises(ConfigError, match=r"^vector_wrappers\[0\]\.wrapper: .*'my_pkg.vec'"):
        check_code_allowed(cfg, {"gymnasium"})
    check_code_allowed(cfg, {"gymnasium", "my_pkg"})


def test_an_env_factory_takes_the_wrappers_too(tmp_path):
    from examples.own_env import Corridor

    res = ac.evolve({"population_size": 2, "num_envs": 2, "evo_steps": 100, "max_env_steps": 200, "eval_episodes": 1,
                     "output_dir": str(tmp_path), "env_wrappers": STACK}, env=Corridor, progress=False)
    assert res.elite.observation_space.shape == (18,)
    assert np.asarray(res.elite.predict(np.zeros((5, 18), np.float32))).shape == (5,)



def test_the_atari_configs_preprocess_as_the_standard_says():
    """84x84 grayscale, 4 stacked frames, frame skip 4 by the wrapper over ALE v5's sticky actions, a lost life
    ending training episodes but not evaluation ones."""
    import gymnasium as gym

    from tasks.config import load_config

    root = Path(__file__).resolve().parents[1] / "deployments" / "configs"
    for name in ("pong_dqn.yaml", "breakout_ppo.yaml"):
        cfg = load_config(root / name, {"num_envs": 1, "eval_episodes": 1})
        recipe = EnvRecipe.of(cfg)
        obs_space, _ = recipe.spaces()
        assert obs_space.shape == (4, 84, 84) and obs_space.dtype == np.uint8
        train, evaluation = recipe.make(), recipe.make(evaluation=True)
        pre = [e.env for e in (train, evaluation)]  # FrameStackObservation(AtariPreprocessing(...))
        assert all(isinstance(p, gym.wrappers.AtariPreprocessing) for p in pre)
        assert [p.terminal_on_life_loss for p in pre] == [True, False]
        assert pre[0].frame_skip == 4 and pre[0].noop_max == 30 and pre[0].grayscale_obs
        ale = pre[0].env.unwrapped
        assert ale._frameskip == 1 and ale.ale.getFloat("repeat_action_probability") == 0.25
        train.close()
        evaluation.close()


class _Branches(gym.Env):
    """Observations a Tuple (a vector and a Discrete), actions MultiDiscrete([3, 2]); reward 1 for the combination
    (2, 1)."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(3)))
        self.action_space = gym.spaces.MultiDiscrete([3, 2])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return (np.zeros(2, np.float32), 0), {}

    def step(self, action):
        self.t += 1
        assert self.action_space.contains(np.asarray(action))
        return (np.full(2, 0.1 * self.t, np.float32), self.t % 3), float(tuple(action) == (2, 1)), False, self.t >= 5, {}


@pytest.mark.parametrize("algorithm", ["dqn", "ppo"])
def test_tuple_observations_and_multidiscrete_actions_through_wrappers(algorithm, tmp_path):
    data = {"algorithm": algorithm, "population_size": 2, "num_envs": 2, "evo_steps": 64, "max_env_steps": 128,
            "eval_episodes": 1, "output_dir": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"^env_id: observation space is Tuple.*FlattenObservation"):
        ac.evolve(data, env=_Branches, progress=False)
    flat = [{"wrapper": "gymnasium.wrappers.FlattenObservation"}]
    with pytest.raises(ConfigError, match=r"^env_id: action space MultiDiscrete.*MultiDiscreteAsDiscrete"):
        ac.evolve({**data, "env_wrappers": flat}, env=_Branches, progress=False)
    res = ac.evolve({**data, "env_wrappers": [*flat, {"wrapper": "agilerl_core.envs.wrappers.MultiDiscreteAsDiscrete"}]},
                    env=_Branches, progress=False)
    assert res.elite.observation_space.shape == (5,) and res.elite.agent.action_spec.dim == 6
    assert 0 <= int(res.elite.predict(np.zeros(5, np.float32))) < 6


def test_multidiscrete_as_discrete_maps_every_combination_once():
    from agilerl_core.envs.wrappers import MultiDiscreteAsDiscrete

    env = MultiDiscreteAsDiscrete(_Branches())
    combos = {tuple(env.action(a)) for a in range(env.action_space.n)}
    assert env.action_space.n == 6 and combos == {(i, j) for i in range(3) for j in range(2)}
    with pytest.raises(ValueError, match="more than max_actions=4"):
        MultiDiscreteAsDiscrete(_Branches(), max_actions=4)
