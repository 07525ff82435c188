"""Every script in examples/ runs as a user runs it (its own process), at a tiny budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import agilerl_core as ac
from tests.conftest import cli_env

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(tmp_path, *args) -> dict:
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=tmp_path, env=cli_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_example_has_a_test():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == ["grpo_custom_reward.py", "load_champion.py", "own_env.py"]


def test_own_env_example(tmp_path):
    out = _run(tmp_path, EXAMPLES / "own_env.py", "--steps", "1200")
    assert out["generations"] >= 1 and isinstance(out["episode_return"], float)
    assert (tmp_path / out["elite"] / "member.json").is_file()


def test_grpo_custom_reward_example(tmp_path):
    out = _run(tmp_path, EXAMPLES / "grpo_custom_reward.py", "--steps", "1024")
    assert 0.0 <= out["elite_fitness"] <= 1.0 and isinstance(out["sample"]["3+4="], str)


def test_load_champion_example(tmp_path):
    res = ac.evolve({"env_id": "CartPole-v1", "population_size": 2, "num_envs": 2, "evo_steps": 128,
                     "max_env_steps": 256, "eval_episodes": 1, "output_dir": str(tmp_path)}, progress=False)
    out = _run(tmp_path, EXAMPLES / "load_champion.py", res.run_dir / "elite", "--episodes", "2")
    assert out["env_id"] == "CartPole-v1" and len(out["returns"]) == 2 and out["member"] == res.elite.member_id
