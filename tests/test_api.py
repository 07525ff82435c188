"""The Python API: agilerl_core.evolve / load / Policy / Callback and flows.run, as a user calls them."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

import agilerl_core as ac
from agilerl_core.errors import CheckpointError, ConfigError
from examples.own_env import Corridor  # as the quickstart imports it: one class object, one label <Corridor>
from tests.test_llm import TINY_MODEL

ROOT = Path(__file__).resolve().parents[1]


def corridor_config(**extra) -> dict:
    return {"name": "corridor", "algorithm": "dqn", "population_size": 3, "num_envs": 2, "evo_steps": 300,
            "max_env_steps": 1800, "eval_episodes": 2, "seed": 0,
            "hyperparameters": {"batch_size": 32, "learning_delay": 64, "buffer_size": 5000},
            "network": {"hidden_sizes": [16, 16], "min_nodes": 8}, **extra}


def test_the_progress_bar_turns_into_lines_where_stderr_is_not_a_terminal(tmp_path, capsys):
    """progress=True (the default) on a log file or CI: one line per generation, no carriage-return updates."""
    ac.evolve(corridor_config(output_dir=str(tmp_path)), env=Corridor)
    err = capsys.readouterr().err
    assert "\r" not in err and re.search(r"^generation 1: best", err, re.M), err

def test_the_quickstart_runs_as_written(tmp_path, monkeypatch):
    """The Python block of docs/index.md (under ten lines: an own env object to an evolved policy acting)."""
    text = (ROOT / "docs" / "index.md").read_text()
    block = re.search(r"```python\n(.*?)```", text.split("## From Python", 1)[1], re.S).group(1)
    assert len([line for line in block.splitlines() if line.strip()]) < 10
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "docs/index.md", "exec"), scope)
    env = scope["env"]
    assert env.action_space.contains(int(scope["action"]))
    assert (tmp_path / "runs").is_dir()


def test_evolve_with_an_env_class_is_deterministic_and_its_elite_acts_as_loaded(tmp_path):
    a = ac.evolve(corridor_config(output_dir=str(tmp_path / "a")), env=Corridor, progress=False)
    b = ac.evolve(corridor_config(output_dir=str(tmp_path / "b")), env=lambda: Corridor(), progress=False)
    assert [h.fitnesses for h in a.history] == [h.fitnesses for h in b.history]
    assert a.config.env_id == "<Corridor>" and b.config.env_id == "<lambda>"
    # what the run found, as a study's best_params: the champion's values and the config that re-runs from them
    assert a.best_params == a.found["values"] and set(a.best_params) >= {"lr", "batch_size"}
    assert a.found["member_id"] == a.best.member_id and a.found_config == a.run_dir / "found_config.yaml"
    assert a.found_config.read_text().startswith("# What run")
    assert len(a.population) == 3 and a.elite.fitness == max(p.fitness for p in a.population)
    obs = np.eye(6, dtype=np.float32)
    batch = a.elite.predict(obs)
    assert batch.shape == (6,) and int(a.elite.predict(obs[2])) == int(batch[2])
    loaded = ac.load(a.run_dir / "elite")
    assert loaded.member_id == a.elite.member_id and loaded.fitness == a.elite.fitness
    assert np.array_equal(loaded.predict(obs), batch)
    assert np.array_equal(ac.load(a.run_dir / "population" / "members" / "0").predict(obs),
                          a.population[0].predict(obs))
    with pytest.raises(ValueError, match=r"shape \(3,\).*trained on observations of shape \(6,\)"):
        loaded.predict(np.zeros(3))
    with pytest.raises(TypeError, match="generate"):
        loaded.generate("hi")
    with pytest.raises(CheckpointError, match="elite"):
        ac.load(a.run_dir)  # a run directory: the error points at its elite
    with pytest.raises(CheckpointError, match="members/0"):
        ac.load(a.run_dir / "population")


def test_callbacks_see_each_member_and_generation_and_can_stop_the_run(tmp_path):
    class Recorder(ac.Callback):
        def __init__(self) -> None:
            self.trained: list[tuple[int, int, int]] = []

        def on_member_trained(self, slot, member, result):
            self.trained.append((slot, member.member_id, result.env_steps))

    rec, generations = Recorder(), []

    def stop_after_two(stats, population):
        generations.append((stats.generation, [p.fitness for p in population]))
        return stats.generation >= 1

    res = ac.evolve(corridor_config(output_dir=str(tmp_path)), env=Corridor, callbacks=[rec, stop_after_two],
                    progress=False)
    assert res.stopped_by == "stop_after_two" and len(res.history) == 2 < 3
    assert [g for g, _ in generations] == [0, 1]
    assert generations[-1][1] == res.history[-1].fitnesses
    assert [s for s, _, _ in rec.trained] == [0, 1, 2, 0, 1, 2]
    assert sum(steps for _, _, steps in rec.trained) == res.run.global_steps
    assert res.run_dir.parent == tmp_path and res.run_dir.name.startswith("corridor-s0-")  # named after the env
    assert (res.run_dir / "elite" / "member.json").is_file()  # saved as at a normal end
    assert (tmp_path / "corridor-latest").resolve() == res.run_dir.resolve()
    with pytest.raises(ConfigError, match=r"callbacks\[0\]"):
        ac.evolve(corridor_config(output_dir=str(tmp_path)), env=Corridor, callbacks=[42], progress=False)


def test_env_factories_are_refused_where_they_cannot_go_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"^env: got an env object"):
        ac.evolve(corridor_config(), env=Corridor(), progress=False)
    with pytest.raises(ConfigError, match=r"^env: an LLM config takes no env"):
        ac.evolve({"kind": "llm", "model": TINY_MODEL, "dataset": {"uri": str(tmp_path / "x.jsonl")}}, env=Corridor)
    with pytest.raises(ConfigError, match=r"^vector_workers"):
        ac.evolve({"kind": "multi_agent", "algorithm": "matd3", "vector_workers": 1}, env=_cue_team)
    import flows

    with pytest.raises(ConfigError, match=r"^runner.kind: 'dask'"):
        flows.run({**corridor_config(), "runner": {"kind": "dask"}}, env=Corridor, progress=False)
    from agilerl_core.envs.make import check_env_id

    with pytest.raises(ConfigError, match="another process"):
        check_env_id("<NotBoundHere>")  # a label written by another process (a stored config, a worker)


def test_a_pipeline_configs_own_sections_are_left_out_quietly_unless_they_ask_for_in_process_options(tmp_path):
    import warnings

    small = {"population_size": 2, "max_env_steps": 768, "evo_steps": 128, "num_envs": 2, "eval_episodes": 1,
             "output_dir": str(tmp_path)}  # three generations: no budget warning either
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a shipped config (tracking, schedule sections) runs without a warning
        res = ac.evolve(ROOT / "deployments" / "configs" / "cartpole_dqn.yaml", progress=False, overrides=small)
    assert res.config.env_id == "CartPole-v1" and res.run.global_steps >= 768
    with pytest.warns(UserWarning, match=r"runner.batch_members are read by the pipeline .* pass batch_members= to"):
        ac.evolve({**corridor_config(**small), "runner": {"batch_members": False}}, env=Corridor, progress=False)


def _cue_team():
    from tests.ma_envs import cue_team

    return cue_team()


def test_a_multi_agent_env_factory_trains_and_the_team_acts_on_a_dict(tmp_path):
    res = ac.evolve({"kind": "multi_agent", "algorithm": "matd3", "num_envs": 2, "population_size": 2,
                     "evo_steps": 100, "max_env_steps": 200, "eval_episodes": 2, "output_dir": str(tmp_path),
                     "hyperparameters": {"batch_size": 32, "learning_delay": 32}}, env=_cue_team, progress=False)
    env = _cue_team()
    obs, _ = env.reset(seed=0)
    actions = res.elite.predict(obs)
    assert set(actions) == {"pointer_0", "chooser_0"}
    assert all(env.action_space(a).contains(np.asarray(v, dtype=env.action_space(a).dtype)) for a, v in actions.items())
    assert np.array_equal(ac.load(res.run_dir / "elite").predict(obs)["chooser_0"], actions["chooser_0"])


def test_an_llm_member_generates_and_loads_back(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "answer": "7"}) + "\n" for a in range(30)))
    res = ac.evolve({"kind": "llm", "name": "llm-api", "population_size": 1, "model": TINY_MODEL,
                     "dataset": {"uri": str(data), "held_out": 8}, "output_dir": str(tmp_path),
                     "hyperparameters": {"batch_size": 8, "group_size": 4, "max_new_tokens": 2},
                     "evo_steps": 64, "max_env_steps": 64}, progress=False)
    text = res.elite.generate("3+1=")
    assert isinstance(text, str) and res.elite.generate(["3+1=", "4+1="])[0] == text
    loaded = ac.load(res.run_dir / "elite")
    assert loaded.kind == "llm" and loaded.generate("3+1=") == text
    with pytest.raises(TypeError, match="generate"):
        loaded.predict(np.zeros(3))


@pytest.mark.integration
def test_load_reads_a_member_from_s3(s3, tmp_path, monkeypatch):
    from agilerl_core.io.storage import S3Options, S3Storage

    res = ac.evolve(corridor_config(output_dir=str(tmp_path), max_env_steps=600), env=Corridor, progress=False)
    c = s3.credentials()
    opts = S3Options(s3.s3_url, None, c["access_key_id"], c["secret_access_key"])
    S3Storage("s3://agilerl/api-test", opts).upload_dir(res.run_dir / "elite", "elite")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", c["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", c["secret_access_key"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.s3_url)
    obs = np.eye(6, dtype=np.float32)
    assert np.array_equal(ac.load("s3://agilerl/api-test/elite").predict(obs), res.elite.predict(obs))
    with pytest.raises(Exception, match="nothing stored there"):
        ac.load("s3://agilerl/api-test/missing")


def test_flows_run_takes_an_env_class_and_callbacks(tmp_path, cli):
    """The tracked flow from Python (embedded Prefect and MLflow), in a process of its own like a user's."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT / "examples")!r})
        import agilerl_core as ac, flows
        from own_env import Corridor
        trained = []
        class Stop(ac.Callback):
            def on_member_trained(self, slot, member, result):
                trained.append(slot)
            def on_generation(self, stats, population):
                return stats.generation >= 1
        cfg = {json.dumps(corridor_config(output_dir=str(tmp_path / "runs")))}
        summary = flows.run(cfg, env=Corridor, callbacks=[Stop()], progress=False)
        elite = ac.load(summary["elite_uri"])
        print(json.dumps({{"summary": summary, "trained": trained, "fitness": elite.fitness}}))
    """))
    proc = cli.python(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["summary"]["stopped_by"] == "Stop" and out["summary"]["generations"] == 2
    assert out["trained"] == [0, 1, 2, 0, 1, 2]
    assert out["summary"]["mlflow_run_id"] and out["fitness"] is not None
    assert "stopped by callback Stop" in proc.stderr
