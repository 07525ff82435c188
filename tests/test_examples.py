"""Every script in examples/ runs as a user runs it (its own process), at a tiny budget."""

from __future__ import annotations

import json
from pathlib import Path

import agilerl_core as ac

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(cli, *args) -> dict:
    proc = cli.python(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_example_has_a_test():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == ["grpo_custom_reward.py", "load_champion.py", "own_env.py"]


def test_own_env_example(tmp_path, cli):
    out = _run(cli, EXAMPLES / "own_env.py", "--steps", "1200")
    assert out["generations"] >= 1 and isinstance(out["episode_return"], float)
    assert (tmp_path / out["elite"] / "member.json").is_file()


def test_grpo_custom_reward_example(cli):
    out = _run(cli, EXAMPLES / "grpo_custom_reward.py", "--steps", "1024")
    assert 0.0 <= out["elite_fitness"] <= 1.0 and isinstance(out["sample"]["3+4="], str)


def test_load_champion_example(tmp_path, cli):
    res = ac.evolve({"env_id": "CartPole-v1", "population_size": 2, "num_envs": 2, "evo_steps": 128,
                     "max_env_steps": 256, "eval_episodes": 1, "output_dir": str(tmp_path)}, progress=False)
    out = _run(cli, EXAMPLES / "load_champion.py", res.run_dir / "elite", "--episodes", "2")
    assert out["env_id"] == "CartPole-v1" and len(out["returns"]) == 2 and out["member"] == res.elite.member_id
