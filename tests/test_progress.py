"""Progress a user can read: the bar moves while members step, shows the run's best, lets callbacks print
above it, and --no-progress prints one line per generation."""

from __future__ import annotations

import sys

import pytest

import agilerl_core as ac
from agilerl_core import progress
from agilerl_core.experiment import build_evolution
from tasks.config import GymPipelineConfig


@pytest.mark.parametrize("algorithm", ["dqn", "ppo"])
def test_training_loops_report_their_steps_as_they_go(algorithm):
    hp = {"learning_delay": 32, "batch_size": 32} if algorithm == "dqn" else {"rollout_steps": 16}
    cfg = GymPipelineConfig(env_id="CartPole-v1", algorithm=algorithm, population_size=2, num_envs=2, evo_steps=64,
                            max_env_steps=128, hyperparameters=hp, network={"hidden_sizes": [16]})
    evo = build_evolution(cfg)
    reports = []
    with progress.reporting(reports.append):
        stats = evo.run_generation()
    assert len(reports) == 32 and sum(reports) == stats.global_steps == 128  # one report per group step
    evo.run_generation()  # nobody listening: nothing is reported, nothing fails
    assert len(reports) == 32


def test_no_progress_prints_a_line_per_generation_and_callbacks_print_as_lines(tmp_path, capsys, monkeypatch):
    from tests.test_api import Corridor, corridor_config

    def shout(stats, population):
        print(f"callback saw generation {stats.generation}")

    ac.evolve(corridor_config(output_dir=str(tmp_path)), env=Corridor, callbacks=[shout], progress=False)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("generation ")]
    assert [line.split(":")[0] for line in lines] == ["generation 0", "generation 1"]
    assert "run best" in lines[-1] and "1,800/1,800 steps" in lines[-1]
    assert out.splitlines() == ["callback saw generation 0", "callback saw generation 1"]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar (elsewhere lines, as above)
    ac.evolve(corridor_config(output_dir=str(tmp_path)), env=Corridor, callbacks=[shout], progress=True)
    out, err = capsys.readouterr()
    assert "callback saw generation 0\n" in out and "callback saw generation 1\n" in out  # whole lines, above the bar
    assert "evolution" in err and "best=" in err and not [line for line in err.splitlines()
                                                           if line.startswith("generation ")]
