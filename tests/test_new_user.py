"""What a new user hit on a fresh machine, each fixed and kept fixed: custom envs, errors on resume and on
damaged files, masked actions when recording datasets, budgets, the summary's fitness, fast config errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from agilerl_core.algorithms.acting import Acting
from agilerl_core.algorithms.registry import get_algorithm
from agilerl_core.errors import ConfigError
from agilerl_core.experiment import build_evolution, train_local
from tests.conftest import tiny_config

GRID_MODULE = '''
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class GridWorld(gym.Env):
    """A 1-d corridor: reach cell 4 (reward 1) by stepping right."""

    observation_space = spaces.Box(0, 4, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([self.pos], np.float32), {}

    def step(self, action):
        self.pos = max(0, min(4, self.pos + (1 if action == 1 else -1)))
        done = self.pos == 4
        return np.array([self.pos], np.float32), float(done), done, False, {}


if "{env_id}" not in gym.registry:
    gym.register("{env_id}", entry_point=GridWorld, max_episode_steps=20)
'''


def _write_module(tmp_path, name: str, env_id: str) -> None:
    (tmp_path / f"{name}.py").write_text(GRID_MODULE.replace("{env_id}", env_id))


def test_own_env_by_module_colon_id(tmp_path, monkeypatch):
    """Gymnasium's module:EnvId form: the module is imported (it registers its env), then the id is checked."""
    _write_module(tmp_path, "usergrid_a", "UserGridA-v0")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tiny_config(env_id="usergrid_a:UserGridA-v0", max_env_steps=600)
    res = train_local(cfg, progress=False, run_dir=tmp_path / "run")
    assert res.generations == 1 and res.global_steps == 600
    with pytest.raises(ConfigError, match=r"env_id: 'no_such_pkg_x:Grid-v0' names module 'no_such_pkg_x'"):
        build_evolution(tiny_config(env_id="no_such_pkg_x:Grid-v0"))
    with pytest.raises(ConfigError, match=r"env_id: 'usergrid_a:Nope-v0' is not a registered"):
        build_evolution(tiny_config(env_id="usergrid_a:Nope-v0"))


def test_own_env_by_entry_point(tmp_path, monkeypatch):
    """env_entry_point registers an unregistered id with the user's class (module:Class)."""
    (tmp_path / "usergrid_b.py").write_text(GRID_MODULE.split("\n\nif ")[0])  # the class, no registration
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tiny_config(env_id="UserGridB-v0", env_entry_point="usergrid_b:GridWorld", max_env_steps=600,
                      eval_max_steps=50)  # registered without a time limit: a greedy episode may never end
    evo = build_evolution(cfg)
    assert evo.arena.env_desc["env_entry_point"] == "usergrid_b:GridWorld"
    assert evo.run_generation().global_steps == 600
    with pytest.raises(ConfigError, match=r"env_entry_point: 'usergrid_b:Missing' must name a class"):
        build_evolution(tiny_config(env_id="UserGridC-v0", env_entry_point="usergrid_b:Missing"))


def test_the_flow_runs_an_own_env_through_the_cli(tmp_path, cli):
    _write_module(tmp_path, "usergrid_cli", "UserGridCli-v0")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env_id: usergrid_cli:UserGridCli-v0\nnum_envs: 2\npopulation_size: 2\nevo_steps: 100\n"
                   "eval_episodes: 2\nmax_env_steps: 200\nhyperparameters: {batch_size: 32, learning_delay: 40}\n"
                   f"output_dir: {tmp_path / 'out'}\ntracking: {{enabled: false}}\n")
    p = cli.run("run", str(cfg), "--run-id", "grid", "--no-progress")  # cwd is on sys.path (-m)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["global_steps"] == 200


def test_resume_refuses_a_tampered_checkpoint_in_one_paragraph_naming_the_stored_file(tmp_path, cli):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env_id: CartPole-v1\nnum_envs: 4\npopulation_size: 2\nevo_steps: 100\neval_episodes: 2\n"
                   f"max_env_steps: 200\nhyperparameters: {{batch_size: 32, learning_delay: 40}}\n"
                   f"output_dir: {tmp_path / 'out'}\ntracking: {{enabled: false}}\n")
    p = cli.run("run", str(cfg), "--run-id", "t", "--no-progress")
    assert p.returncode == 0, p.stderr[-3000:]
    weights = tmp_path / "out" / "t" / "generations" / "000000" / "population" / "members" / "1" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    for args in (("resume", "t", "--storage", str(tmp_path / "out")), ("run", str(cfg), "--run-id", "t")):
        p = cli.run(*args, "--no-progress")
        assert p.returncode == 1, p.stderr[-3000:]
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
        assert lines[0].startswith("agilerl-flow: checkpoint error:") and str(weights) in lines[0], lines[0]
        assert "agilerl-load-" not in lines[0]  # never the temp copy's path


def test_lineage_of_a_damaged_population_file_names_it(tmp_path, cli):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env_id: CartPole-v1\nnum_envs: 4\npopulation_size: 2\nevo_steps: 100\neval_episodes: 2\n"
                   f"max_env_steps: 200\nhyperparameters: {{batch_size: 32, learning_delay: 40}}\n"
                   f"output_dir: {tmp_path / 'out'}\ntracking: {{enabled: false}}\n")
    assert cli.run("run", str(cfg), "--run-id", "l", "--no-progress").returncode == 0
    pop = tmp_path / "out" / "l" / "generations" / "000000" / "population" / "population.json"
    pop.write_bytes(b"\xff\xfe" + pop.read_bytes()[:40])
    p = cli.run("lineage", "l", "--out", str(tmp_path / "t.png"), "--storage", str(tmp_path / "out"))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "checkpoint error" in p.stderr and str(pop) in p.stderr and "checksum mismatch" in p.stderr, p.stderr


def test_dataset_collect_respects_action_masks():
    """MaskedLine raises on a forbidden action: random and epsilon actions must come from the allowed ones."""
    from agilerl_core.data.collect import collect_episodes

    episodes = collect_episodes("agilerl_test/MaskedLine-v0", "random", 20, seed=0, num_envs=4)
    assert len(episodes) == 20
    actions = np.concatenate([ep["actions"] for ep in episodes])
    assert (actions == 2).any()  # the masked action is still taken where it is allowed
    again = collect_episodes("agilerl_test/MaskedLine-v0", "random", 20, seed=0, num_envs=4)
    assert all(np.array_equal(a["actions"], b["actions"]) for a, b in zip(episodes, again, strict=True))


def test_dataset_collect_with_a_policy_and_epsilon_respects_action_masks(tmp_path):
    from agilerl_core.data.collect import collect_episodes

    cfg = tiny_config(env_id="agilerl_test/MaskedLine-v0", max_env_steps=600)
    train_local(cfg, progress=False, run_dir=tmp_path)
    episodes = collect_episodes("agilerl_test/MaskedLine-v0", str(tmp_path / "elite"), 10, seed=1, num_envs=4,
                                epsilon=0.5, algorithms=get_algorithm, acting=Acting)
    assert len(episodes) == 10


def test_the_budget_is_a_budget(tmp_path):
    """10,000 steps with generations of 3 x 1,200 used to run 12,000: the last generation now shrinks."""
    cfg = tiny_config(max_env_steps=10_000, evo_steps=1200, population_size=3, **{"eval_episodes": 1})
    res = train_local(cfg, progress=False, run_dir=tmp_path)
    assert 10_000 <= res.global_steps < 10_000 + 3 * cfg.num_envs, res.global_steps
    assert res.summary()["max_env_steps"] == 10_000 and res.generations == 3


def test_summary_reports_the_best_ever_and_the_elites_fitness(tmp_path):
    """best_fitness is the best evaluation of the run; elite_fitness the returned elite's (last) one."""
    cfg = tiny_config(max_env_steps=2400)
    res = train_local(cfg, progress=False, run_dir=tmp_path)
    every = [f for h in res.history for f in h.fitnesses]
    assert res.best_fitness == max(every)
    assert res.elite_fitness == max(res.history[-1].fitnesses)
    summary = res.summary()
    assert summary["best_fitness"] == max(every) and summary["elite_fitness"] == res.elite_fitness
    member = json.loads((tmp_path / "elite" / "member.json").read_text())
    assert member["record"]["fitness_history"][-1] == res.elite_fitness


def test_a_config_error_prints_fast(tmp_path):
    """The CLI reads and checks the config before importing the engine, Prefect or MLflow."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env_id: CartPole-v1\nhyperparameters: {lrr: 0.1}\n")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(cfg)], capture_output=True, text=True,
                       check=False, timeout=60)
    wall = time.perf_counter() - t0
    assert p.returncode == 2 and "hyperparameters.lrr: unknown field (did you mean 'lr'?)" in p.stderr
    code = textwrap.dedent(f"""
        import sys
        from flows.cli import main
        main(["run", {str(cfg)!r}])
        heavy = [m for m in ("torch", "prefect", "mlflow", "gymnasium") if m in sys.modules]
        print(",".join(heavy))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert p.stdout.strip() == "", f"a config error imported {p.stdout.strip()} ({wall:.1f} s)"
