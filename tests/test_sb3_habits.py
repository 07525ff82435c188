"""A Stable-Baselines3 user's habits: predict(deterministic=...), algorithm names in any case, SB3 field names
answered with ours, an env id string as evolve's env, and the guide page's snippets running as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import agilerl_core as ac
from agilerl_core.algorithms.hyperparameters.ppo import PPOHyperparameters
from agilerl_core.api import Policy
from agilerl_core.config import load_config, parse_overrides, validate_config
from agilerl_core.errors import ConfigError
from agilerl_core.experiment import build_evolution
from tests.conftest import greedy
from tests.test_multi_agent import ma_config

ROOT = Path(__file__).resolve().parents[1]
PYDANTIC_WORDS = ("discriminator", "union_tag", "_hp_tag", "Unable to extract tag", "literal_error")


def _member(data: dict):
    """The first member of a freshly built population (nothing trained) and its env description."""
    evo = build_evolution(validate_config(data) if isinstance(data, dict) else data)
    return evo.population.members[0], evo.arena.env_desc


def _gym(algorithm: str, env_id: str, **hp) -> dict:
    return {"algorithm": algorithm, "env_id": env_id, "population_size": 1, "num_envs": 1, "hyperparameters": hp,
            "network": {"hidden_sizes": [16], "min_nodes": 8}}


def _generators(agent) -> tuple:
    return agent.np_rng.bit_generator.state, agent.torch_gen.get_state().clone()


# ---- 1. predict(deterministic=...) ------------------------------------------------------------------------------
@pytest.mark.parametrize(("algorithm", "env_id", "hp"), [
    ("PPO", "CartPole-v1", {}), ("PPO", "Pendulum-v1", {}), ("SAC", "Pendulum-v1", {}), ("TD3", "Pendulum-v1", {}),
    ("TD3", "Pendulum-v1", {"noise_type": "ou"}), ("DQN", "CartPole-v1", {}), ("Rainbow", "CartPole-v1", {})])
def test_predict_deterministic_is_greedy_and_false_draws_reproducibly_from_the_exploration_policy(algorithm, env_id,
                                                                                                   hp):
    member, env = _member(_gym(algorithm, env_id, **hp))
    agent = member.agent
    dim = agent.obs_spec.space.shape[0]
    obs = np.random.default_rng(0).uniform(-1, 1, (400, dim)).astype(np.float32)
    policy = Policy(member, env)
    best = policy.predict(obs, deterministic=True)
    with torch.no_grad():
        own = agent.action_spec.to_env(greedy(agent, agent.obs_spec.to_tensors(obs)))
    assert np.array_equal(best, own) and np.array_equal(policy.predict(obs), best)  # True: today's default

    before = _generators(agent)
    sampled = policy.predict(obs, deterministic=False)
    assert sampled.shape == best.shape and sampled.dtype == best.dtype
    # a fresh Policy of the same member draws the same actions: the draws are a copy of the member's stream...
    assert np.array_equal(Policy(member, env).predict(obs, deterministic=False), sampled)
    # ...which is left as it was (what the member's training draws next does not depend on predict)
    after = _generators(agent)
    assert before[0] == after[0] and torch.equal(before[1], after[1])
    # the Policy's stream goes on (a noisy net's draw moves all rows together: a few calls to see it)
    assert any(not np.array_equal(policy.predict(obs, deterministic=False), sampled) for _ in range(5))
    differs = np.any(np.asarray(sampled != best).reshape(len(obs), -1), axis=1).mean()
    if algorithm == "Rainbow":  # epsilon 0: one noisy-net weight draw per call moves every row's Q-values together
        assert any((policy.predict(obs, deterministic=False) != best).any() for _ in range(5))
    elif agent.action_spec.discrete:  # a fresh member: PPO's near-uniform softmax, DQN at epsilon 1
        assert set(np.unique(sampled)) == {0, 1} and 0.2 < differs < 0.8
    else:
        space = agent.action_spec
        assert differs == 1.0 and sampled.min() >= space.low[0] and sampled.max() <= space.high[0]
    assert np.asarray(policy.predict(obs[0], deterministic=False)).shape == np.asarray(best[0]).shape


@pytest.mark.parametrize("algorithm", ["PPO", "DQN"])
def test_sampled_actions_keep_to_the_action_mask(algorithm):
    member, env = _member(_gym(algorithm, "CartPole-v1"))
    obs = np.random.default_rng(1).uniform(-1, 1, (200, 4)).astype(np.float32)
    only_one = np.tile(np.array([False, True]), (200, 1))
    assert (Policy(member, env).predict(obs, only_one, deterministic=False) == 1).all()


def test_predict_refuses_a_deterministic_that_is_not_a_bool():
    member, env = _member(_gym("DQN", "CartPole-v1"))
    with pytest.raises(TypeError, match=r"deterministic='yes'; give True .* or False"):
        Policy(member, env).predict(np.zeros(4, np.float32), deterministic="yes")


@pytest.mark.parametrize("algorithm", ["MATD3", "IPPO", "MAPPO"])
def test_a_team_samples_per_agent_reproducibly(algorithm):
    extra = {"hyperparameters": {"rollout_steps": 8}} if algorithm.endswith("PPO") else {}
    member, env = _member(ma_config(algorithm=algorithm, population_size=1, **extra))
    rng = np.random.default_rng(0)
    obs = {"pointer_0": rng.uniform(-1, 1, (300, 1)).astype(np.float32), "chooser_0": rng.integers(0, 2, 300)}
    policy = Policy(member, env)
    greedy, sampled = policy.predict(obs), policy.predict(obs, deterministic=False)
    again = Policy(member, env).predict(obs, deterministic=False)
    assert all(np.array_equal(sampled[a], again[a]) for a in obs)
    assert sampled["pointer_0"].shape == (300, 1) and (sampled["pointer_0"] != greedy["pointer_0"]).all()
    assert set(np.unique(sampled["chooser_0"])) == {0, 1} and (sampled["chooser_0"] != greedy["chooser_0"]).any()
    assert policy.observation_space is not None


# ---- 2. algorithm names in any case ------------------------------------------------------------------------------
@pytest.mark.parametrize(("given", "name"), [("DQN", "dqn"), ("PPO", "ppo"), ("Rainbow", "rainbow"), (" Sac ", "sac")])
def test_algorithm_names_are_case_insensitive(given, name):
    cfg = validate_config({"algorithm": given, "env_id": "CartPole-v1"})
    assert cfg.algorithm == name and cfg.hyperparameters.algorithm_name == name
    team = ma_config(algorithm="MATD3")
    assert team.algorithm == "matd3"


def test_a_set_override_of_the_algorithm_in_any_case_works(tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text("name: sb3\nenv_id: CartPole-v1\npopulation_size: 2\nnum_envs: 2\nevo_steps: 128\n"
                    "max_env_steps: 256\neval_episodes: 1\neval_max_steps: 50\n"
                    f"output_dir: {tmp_path / 'runs'}\n")
    cfg = load_config(path, parse_overrides(["algorithm=PPO", "hyperparameters.rollout_steps=32"]))
    assert cfg.algorithm == "ppo" and isinstance(cfg.hyperparameters, PPOHyperparameters)
    assert cfg.hyperparameters.rollout_steps == 32

    from flows.cli import main

    assert main(["run", str(path), "--local", "--no-progress", "--set", "algorithm=PPO",
                 "--set", "hyperparameters.rollout_steps=32"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["global_steps"] == 256 and ac.load(summary["elite_uri"]).algorithm == "ppo"


@pytest.mark.parametrize(("data", "expect"), [
    ({"algorithm": "dqnn", "env_id": "CartPole-v1", "hyperparameters": {"lr": 1e-3}}, r"did you mean dqn\?"),
    ({"algorithm": "A2C", "env_id": "CartPole-v1", "hyperparameters": {"lr": 1e-3}}, r"nearest here is ppo"),
    ({"kind": "multi_agent", "algorithm": "mapo", "env_id": "tests.ma_envs:cue_team",
      "hyperparameters": {"lr_actor": 1e-3}}, r"did you mean mappo\?"),
])
def test_an_unknown_algorithm_lists_the_valid_names_without_pydantic_internals(data, expect):
    with pytest.raises(ConfigError) as err:
        validate_config(data)
    text = str(err.value)
    assert re.search(r"algorithm: Input should be '(dqn|maddpg)'", text) and re.search(expect, text)
    assert "case-insensitive" in text
    assert not any(word in text for word in PYDANTIC_WORDS), text
    assert "hyperparameters" not in text  # its fields depend on the algorithm: only the algorithm is named


def test_a_set_override_naming_an_unknown_algorithm_fails_cleanly_on_the_cli(tmp_path, capsys):
    from flows.cli import main

    path = tmp_path / "cfg.yaml"
    path.write_text("env_id: CartPole-v1\n")
    assert main(["run", str(path), "--local", "--set", "algorithm=A2C", "--set", "total_timesteps=1000"]) == 2
    err = capsys.readouterr().err
    assert "nearest here is ppo" in err and "here: max_env_steps" in err
    assert not any(word in err for word in PYDANTIC_WORDS)


# ---- 3. SB3's field names answered with ours ----------------------------------------------------------------------
def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config({"env_id": "CartPole-v1", **data})
    return str(err.value)


def _line(text: str, field: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"  - {field}:"))


def test_sb3_field_names_suggest_ours():
    text = _error({"total_timesteps": 10_000, "n_envs": 4, "learning_rate": 1e-3, "gamma": 0.9, "buffer_size": 100,
                   "policy_kwargs": {"net_arch": [64]}, "verbose": 1, "n_steps": 3})
    assert "here: max_env_steps" in _line(text, "total_timesteps")
    assert "eval_max_steps" not in _line(text, "total_timesteps").split("allowed fields")[0]
    assert "here: num_envs" in _line(text, "n_envs")
    assert "here: hyperparameters.lr)" in _line(text, "learning_rate")
    assert "hyperparameters.gamma" in _line(text, "gamma")
    assert "hyperparameters.buffer_size" in _line(text, "buffer_size")
    assert "here: network; net_arch -> network.hidden_sizes" in _line(text, "policy_kwargs")
    assert "progress=False" in _line(text, "verbose")
    assert "here: hyperparameters.n_step;" in _line(text, "n_steps")  # dqn: n-step returns


def test_sb3_names_follow_the_algorithm_and_the_section():
    ppo = _error({"algorithm": "PPO", "n_steps": 64, "batch_size": 64, "n_epochs": 3, "clip_range": 0.1})
    assert "here: hyperparameters.rollout_steps" in _line(ppo, "n_steps")
    assert "here: hyperparameters.num_minibatches" in _line(ppo, "batch_size")
    assert "here: hyperparameters.update_epochs" in _line(ppo, "n_epochs")
    assert "here: hyperparameters.clip_coef" in _line(ppo, "clip_range")
    sac = _error({"algorithm": "sac", "env_id": "Pendulum-v1", "learning_rate": 1e-3,
                  "hyperparameters": {"learning_rate": 1e-3, "total_timesteps": 5}})
    assert "here: hyperparameters.lr_actor" in _line(sac, "learning_rate")
    assert "here: lr_actor" in _line(sac, "hyperparameters.learning_rate")  # inside the section: its own names
    assert "here: max_env_steps, a top-level field" in _line(sac, "hyperparameters.total_timesteps")
    assert "did you mean 'network'" in _error({"netwrk": {}})  # other names: the closest one, as before


def test_an_sb3_name_in_evolves_overrides_is_answered_before_anything_trains():
    with pytest.raises(ConfigError, match=r"total_timesteps: unknown field \(Stable-Baselines3's total_timesteps; "
                                          r"here: max_env_steps"):
        ac.evolve({"algorithm": "DQN"}, env="CartPole-v1", overrides={"total_timesteps": 1000}, progress=False)


# ---- 4. evolve(..., env="CartPole-v1") ------------------------------------------------------------------------------
def test_evolve_takes_an_env_id_string_and_its_elite_samples_as_its_checkpoint_does(tmp_path):
    res = ac.evolve({"algorithm": "PPO", "population_size": 2, "num_envs": 2, "evo_steps": 128, "max_env_steps": 256,
                     "eval_episodes": 1, "eval_max_steps": 50, "output_dir": str(tmp_path),
                     "hyperparameters": {"rollout_steps": 32}}, env="CartPole-v1", progress=False)
    assert res.config.env_id == "CartPole-v1" and res.config.algorithm == "ppo" and res.run.global_steps == 256
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 4)).astype(np.float32)
    loaded = ac.load(res.run_dir / "elite")
    assert np.array_equal(loaded.predict(obs), res.elite.predict(obs))
    assert np.array_equal(loaded.predict(obs, deterministic=False), res.elite.predict(obs, deterministic=False))


@pytest.mark.parametrize(("env", "match"), [
    ("CartPol-v1", r"^env: 'CartPol-v1' is not a registered Gymnasium environment. Did you mean 'CartPole-v1'"),
    ("nomodule_sb3:Foo-v0", r"^env: 'nomodule_sb3:Foo-v0' names module 'nomodule_sb3', which cannot be imported"),
    ("  ", r"^env: an empty env id; pass a Gymnasium id"),
])
def test_a_bad_env_id_string_is_refused_naming_env(env, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        ac.evolve({"algorithm": "DQN", "output_dir": str(tmp_path)}, env=env, progress=False)
    assert not any(tmp_path.iterdir())  # refused before anything ran


# ---- 5. the guide page --------------------------------------------------------------------------------------------
def test_the_sb3_guide_snippets_run_as_written(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "guide" / "sb3.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 5
    assert "guide/sb3.md" in (ROOT / "mkdocs.yml").read_text()
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    for i, block in enumerate(blocks):  # one session, as a reader runs them in order
        exec(compile(block, f"docs/guide/sb3.md block {i}", "exec"), scope)
    assert scope["policy"].algorithm == "ppo"  # the elite saved was the PPO run's (the callback run came after)
    assert scope["env"].action_space.contains(int(scope["action"]))
    assert (tmp_path / "runs" / "my-elite" / "member.json").is_file()
