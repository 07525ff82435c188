"""Config validation: every bad input gets an error naming the field and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from agilerl_core.config import parse_overrides
from agilerl_core.errors import ConfigError
from agilerl_core.experiment import build_evolution
from tasks.config import load_config, validate_config
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[1]

SHIPPED = Path(__file__).resolve().parents[1] / "deployments" / "configs" / "cartpole_dqn.yaml"


def test_shipped_config_is_valid():
    cfg = load_config(SHIPPED)
    assert cfg.env_id == "CartPole-v1" and cfg.population_size == 4 and cfg.target_fitness == 475


@pytest.mark.parametrize("data, pattern", [
    ({"env_id": "CartPole-v1", "hyperparameters": {"lr": -1}}, r"hyperparameters\.lr: Input should be greater than 0"),
    ({"env_id": "CartPole-v1", "hyperparameters": {"lr": "fast"}}, r"hyperparameters\.lr: .*number"),
    ({"env_id": "CartPole-v1", "algorithm": "dqnn"}, r"algorithm: Input should be 'dqn'"),
    ({"env_id": "CartPole-v1", "netwrk": {}}, r"netwrk: unknown field \(did you mean 'network'\?\)"),
    ({"env_id": "CartPole-v1", "hyperparameters": {"batchsize": 3}},
     r"hyperparameters\.batchsize: unknown field \(did you mean 'batch_size'\?\)"),
    ({}, r"env_id: Field required"),
    ({"env_id": "CartPole-v1", "population_size": 0}, r"population_size: .*greater than or equal to 1"),
    ({"env_id": "CartPole-v1", "network": {"activation": "gelu"}},
     r"network\.activation: Input should be 'relu', 'leaky_relu', 'elu' or 'tanh'"),
    ({"env_id": "CartPole-v1", "network": {"hidden_sizes": [8]}}, r"network: .*outside \[min_nodes, max_nodes\]"),
    ({"env_id": "CartPole-v1", "network": {"hidden_sizes": [32] * 5}}, r"network: .*max_hidden_layers"),
    ({"env_id": "CartPole-v1", "hp_space": {"momentum": {"min": 0, "max": 1}}},
     r"hp_space.momentum: not a mutable hyperparameter of dqn"),
    ({"env_id": "CartPole-v1", "hp_space": {"lr": {"min": 1, "max": 0.1}}}, r"hp_space\.lr: min \(1.0\) must not exceed max"),
    ({"env_id": "CartPole-v1", "mutation": {"no_mutation": 0, "architecture": 0, "parameters": 0, "rl_hp": 0}},
     r"mutation: .*at least one mutation weight"),
    ({"env_id": "CartPole-v1", "device": "tpu"}, r"device: .*'tpu' is not a device: use cpu, cuda, cuda:N"),
    ({"env_id": "CartPole-v1", "network": {"cnn": {"channels": [8], "kernel_sizes": [3, 3], "strides": [1]}}},
     r"network\.cnn: .*same length"),
])
def test_bad_fields_are_named(data, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate_config(data)


@pytest.mark.parametrize("overrides, pattern", [
    ({"env_id": "CartPol-v1"}, r"env_id: 'CartPol-v1' is not a registered .*Did you mean 'CartPole-v1'"),
    ({"env_id": "Pendulum-v1"},
     r"algorithm: dqn needs Discrete actions, but Pendulum-v1 has Box.*; use one of ddpg, ppo, sac, td3"),
    ({"env_id": "CartPole-v1", "algorithm": "td3"}, r"algorithm: td3 needs Box actions, but CartPole-v1 has "
                                                     r"Discrete\(2\); use one of dqn, ppo, rainbow"),
    ({"env_kwargs": {"no_such_arg": 1}}, r"env_kwargs: gymnasium\.make\('CartPole-v1', \*\*env_kwargs\) failed"),
    ({"hyperparameters.lr": 0.5, "hp_space": {"lr": {"min": 1e-4, "max": 1e-2}}},
     r"hyperparameters\.lr: initial value 0\.5 lies outside hp_space\.lr bounds"),
    ({"network.cnn.kernel_sizes": [9], "network.cnn.channels": [8], "network.cnn.strides": [1],
      "env_id": "agilerl_test/Image-v0"}, r"network\.cnn: kernels \[9\] .* leave no output"),
])
def test_env_and_cross_field_errors_come_before_any_work(overrides, pattern):
    cfg = tiny_config(**overrides)
    with pytest.raises(ConfigError, match=pattern):
        build_evolution(cfg)


def test_yaml_file_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"config file '.*missing\.yaml' does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env_id: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml' is not valid YAML"):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


def test_overrides_are_typed_and_dotted():
    assert parse_overrides(["hyperparameters.lr=3e-4", "hyperparameters.double=false", "name=x"]) == {
        "hyperparameters.lr": 3e-4, "hyperparameters.double": False, "name": "x"}
    cfg = load_config(SHIPPED, parse_overrides(["hyperparameters.lr=3e-4", "seed=5"]))
    assert cfg.hyperparameters.lr == 3e-4 and cfg.seed == 5
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_overrides(["lr"])
    with pytest.raises(ConfigError, match="not a section"):
        load_config(SHIPPED, {"seed.x": 1})


def test_the_engine_config_holds_no_pipeline_sections():
    """runner, tracking and schedule are the pipeline's (tasks.config); the engine's config refuses them, builds
    and groups without them (the group size an argument), and takes a pipeline config as the kind it extends."""
    from agilerl_core import config as engine
    from tasks.config import grouping

    for section in ("runner", "tracking", "schedule"):
        assert section not in engine.GymExperimentConfig.model_fields
    cfg = engine.validate_config({"env_id": "CartPole-v1", "population_size": 3})
    assert build_evolution(cfg, group_cap=2).groups() == [(0, 1), (2,)]
    assert build_evolution(cfg, batch_members=False).groups() == [(0,), (1,), (2,)]
    with pytest.raises(ConfigError, match="runner: unknown field"):
        engine.validate_config({"env_id": "CartPole-v1", "runner": {"group_size": 1}})
    piped = validate_config({"env_id": "CartPole-v1", "runner": {"group_size": 1}, "tracking": {"enabled": False}})
    assert isinstance(piped, engine.GymExperimentConfig)
    assert grouping(piped) == {"batch_members": True, "group_cap": 1}
    assert "runner" not in engine.engine_data(piped) and engine.validate_config(engine.engine_data(piped)).seed == 0


def test_a_hyperparameter_section_of_another_algorithm_is_named_as_such():
    """`--set algorithm=dqn` on a SAC config: one line says the section is another algorithm's, not three lines of
    unknown fields; a genuine typo still gets its did-you-mean."""
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "deployments/configs/pendulum_sac.yaml", {"algorithm": "dqn"})
    text = str(err.value)
    assert "hyperparameters: lr_actor, lr_critic, random_steps are not dqn's but" in text and "sac" in text
    assert "written for another algorithm" in text and "unknown field" not in text
    with pytest.raises(ConfigError, match=r"hyperparameters.lrr: unknown field \(did you mean 'lr'\?\)"):
        load_config(ROOT / "deployments/configs/cartpole_dqn.yaml", {"hyperparameters.lrr": 1e-3})
