"""reasoning-gym as a prompt source and a reward: a task generated seeded, scored by its own scorer and trained
on; bad input refused before any work."""

from __future__ import annotations

import json

import pytest

from agilerl_core.errors import ConfigError, DatasetError
from agilerl_core.experiment import build_evolution
from tasks.config import validate_config
from tests.conftest import with_overrides
from tests.test_llm import TINY_MODEL, llm_config, llm_data


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return llm_data(tmp_path_factory)


# ---- reasoning-gym as a prompt source and a reward ---------------------------------------------------------------
def _rg_config(**overrides):
    import string

    model = json.loads(json.dumps(TINY_MODEL))
    model["config"]["n_positions"] = 96
    model["tokenizer_chars"] = string.digits + string.ascii_letters + " +-=:.?<>/"
    data = {"name": "rg-test", "kind": "llm", "algorithm": "reinforce", "population_size": 2, "seed": 0, "model": model,
            "dataset": {"source": "reasoning_gym", "task": "chain_sum", "size": 60, "seed": 3, "held_out": 10,
                        "options": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
            "rewards": [{"kind": "reasoning_gym"}],
            "hyperparameters": {"lr": 0.01, "batch_size": 8, "group_size": 4, "max_new_tokens": 2,
                                "micro_batch_size": 64},
            "evo_steps": 64, "max_env_steps": 256}
    return validate_config(with_overrides(data, overrides))


def test_a_reasoning_gym_task_is_generated_seeded_scored_by_its_own_scorer_and_trained_on():
    evo = build_evolution(_rg_config())
    arena = evo.arena
    again = build_evolution(_rg_config()).arena
    assert arena.dataset.sha256 == again.dataset.sha256 and arena.dataset.prompts == again.dataset.prompts
    assert build_evolution(_rg_config(**{"dataset.seed": 4})).arena.dataset.sha256 != arena.dataset.sha256
    assert arena.env_desc["dataset"]["task"] == "chain_sum" and arena.env_desc["dataset"]["reasoning_gym"]
    prompts, answers = arena.eval_data.prompts[:4], arena.eval_data.answers[:4]
    assert all(p.startswith("State the final answer") for p in prompts)
    completions = [f"<answer>{answers[0]}</answer>", f"so it is {answers[1]}", answers[2], "<answer>no</answer>"]
    assert arena.rewards(completions, answers, prompts).tolist() == [1.0, 1.0, 1.0, 0.0]
    first = evo.run_generation()
    evo.evolve()
    second = evo.run_generation()
    assert len(first.fitnesses) == 2 and second.global_steps == 256
    assert all(0.0 <= f <= 1.0 for f in first.fitnesses + second.fitnesses)


@pytest.mark.parametrize("overrides, error, match", [
    ({"dataset.task": "chain_summ"}, ConfigError, "dataset.task: 'chain_summ' is not a reasoning-gym task.*chain_sum"),
    ({"dataset.options": {"no_such_option": 1}}, ConfigError, "dataset.options: reasoning_gym.create_dataset"),
    ({"dataset.sha256": "0" * 64}, DatasetError, "dataset.uri 'reasoning_gym:chain_sum': content hash .* differs"),
    ({"dataset.seed": 1, "model.config.n_positions": 32}, DatasetError, "outruns the model's context of 32"),
])
def test_bad_reasoning_gym_input_is_refused_before_any_work(overrides, error, match):
    with pytest.raises(error, match=match):
        build_evolution(_rg_config(**overrides))


def test_llm_ppo_refuses_data_parallel_training(data_dir):
    with pytest.raises(ConfigError, match="model.data_parallel: llm_ppo whitens advantages"):
        llm_config(data_dir, algorithm="llm_ppo", **{"model.data_parallel": 2})


def test_reasoning_gym_config_fields_are_checked(data_dir):
    with pytest.raises(ConfigError, match="task: a reasoning_gym dataset needs a task"):
        _rg_config(**{"dataset.task": None})
    with pytest.raises(ConfigError, match="uri: a reasoning_gym dataset is generated"):
        _rg_config(**{"dataset.uri": str(data_dir / "const.jsonl")})
    with pytest.raises(ConfigError, match="rewards\\[0\\].kind: reasoning_gym scores with the dataset's"):
        build_evolution(llm_config(data_dir, rewards=[{"kind": "reasoning_gym"}]))
