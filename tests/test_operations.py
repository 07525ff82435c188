"""Operations (issue 26): what an operator sees when a run is resumed after it ended, and what the CI gate reads."""

from __future__ import annotations

import json

import mlflow
import pytest

from tests.conftest import cli_summary


def test_resuming_a_finished_run_does_nothing_and_says_so(tmp_path, cli):
    """A finished run resumes to its stored summary: no generation, no second model version, the champion alias
    where it was, the summary marked already_finished."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: done-test\nenv_id: CartPole-v1\nnum_envs: 4\npopulation_size: 2\nevo_steps: 200\n"
                   "max_env_steps: 400\neval_episodes: 2\nhyperparameters: {batch_size: 32, learning_delay: 64}\n")
    env = cli.env
    out = tmp_path / "out"
    first = cli_summary(cli.run("run", str(cfg), "--set", f"output_dir={out}", "--run-id", "done", "--no-progress",
                                 cwd=tmp_path, env=env))
    client = mlflow.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    versions = client.search_model_versions("name='done-test'")
    assert len(versions) == 1
    stored = json.loads((out / "done" / "summary.json").read_text())
    again = cli.run("resume", "done", "--storage", str(out), "--no-progress", cwd=tmp_path, env=env)
    summary = cli_summary(again)
    assert summary["already_finished"] is True and "finished already" in again.stderr
    assert {k: summary[k] for k in first} == first  # the stored summary, not a new ending
    assert json.loads((out / "done" / "summary.json").read_text()) == stored
    assert len(client.search_model_versions("name='done-test'")) == 1
    assert len(list((out / "done" / "generations").iterdir())) == first["generations"]  # none added


def test_member_runs_lead_with_their_slot_and_the_resolved_storage_uri_is_logged(tmp_path, monkeypatch):
    from tasks.tracker import Tracker
    from tests.conftest import tiny_config

    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    cfg = tiny_config(population_size=2, **{"tracking.uri": f"sqlite:///{tmp_path / 'm.db'}"})
    assert cfg.storage.uri is None
    tracker = Tracker(cfg, "names-run", str(tmp_path / "runs" / "names-run"))
    client = mlflow.MlflowClient(cfg.tracking.uri)
    assert [client.get_run(c).info.run_name for c in tracker.child_ids] == ["slot-0 · names-run", "slot-1 · names-run"]
    assert client.get_run(tracker.parent_id).data.params["storage.uri"] == str(tmp_path / "runs" / "names-run")


# ---- the champion: which member, re-scored on fresh seeds --------------------------------------------------
def test_the_champion_is_the_better_of_the_final_elite_and_the_best_member_ever_on_fresh_seeds(tmp_path):
    """An elite that collapses later loses to the run's best member: both are candidates (the best generation's
    elite is read back from storage, kept through retention), re-scored on seeds no generation used."""
    from agilerl_core.champion import choose_champion, eval_rounds
    from agilerl_core.experiment import build_evolution
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import LocalStorage
    from tests.conftest import tiny_config
    from tests.test_run_store import _run

    cfg = tiny_config(**{"storage.keep_generations": 1, "champion.eval_episodes": 3})
    assert eval_rounds(cfg) == 2  # 3 episodes in evaluations of eval_episodes=2: two rounds
    evo = build_evolution(cfg)
    store = RunStore(LocalStorage(tmp_path), "champ")
    _run(evo, store, 3)
    store.prune(1)
    assert store.manifest(0)["pruned"]  # generation 0's members are gone but its elite
    evo.history[0].best_fitness = 1e9  # generation 0's elite "scored" the run's best: it must be a candidate
    elite0 = store.load_elite(0, rebuild=evo.arena.member_from_state)
    choice = choose_champion(evo, store, 2)
    roles = {c.role: c for c in choice.candidates}
    assert set(roles) == {"final_elite", "best_ever"}
    assert roles["best_ever"].member_id == elite0.member_id and roles["best_ever"].generation == 0
    assert roles["best_ever"].fitness == 1e9 and roles["final_elite"].member_id == evo.elite().member_id
    fresh = {"final_elite": evo.fresh_fitness(evo.elite().agent, 2), "best_ever": evo.fresh_fitness(elite0.agent, 2)}
    assert {r: c.fresh_fitness for r, c in roles.items()} == fresh  # fresh seeds: deterministic
    winner = "best_ever" if fresh["best_ever"] > fresh["final_elite"] else "final_elite"
    assert choice.chosen.role == winner and choice.member.member_id == roles[winner].member_id
    assert choice.summary()["candidates"][1]["fresh_fitness"] == fresh["best_ever"]
    # with the final generation the best one, the final elite is the only candidate
    evo.history[0].best_fitness = -1.0
    evo.history[-1].best_fitness = 1e9
    assert [c.role for c in choose_champion(evo, store, 1).candidates] == ["final_elite"]


def _registered_run(cli, tmp_path, env, name: str, seed: int, steps: int, promote: str) -> dict:
    cfg = tmp_path / f"{name}-{seed}-{promote}.yaml"
    cfg.write_text(f"name: {name}\nenv_id: CartPole-v1\nnum_envs: 4\npopulation_size: 2\nevo_steps: 200\n"
                   f"max_env_steps: {steps}\neval_episodes: 2\nseed: {seed}\nchampion: {{promote: {promote}}}\n"
                   "hyperparameters: {batch_size: 32, learning_delay: 64}\n")
    return cli_summary(cli.run("run", str(cfg), "--no-progress", "--storage", str(tmp_path / "runs"),
                                cwd=tmp_path, env=env))


@pytest.mark.integration
def test_the_champion_alias_moves_only_by_the_stated_policy(servers, tmp_path, cli):
    """Against the MLflow server: every version carries its fitness, run id, config digest and seed; if_better
    moves NAME@champion only to a version whose fitness beats the alias holder's, never does not move it,
    always does; each summary says whether it was promoted."""
    env = {**cli.env, "MLFLOW_TRACKING_URI": servers.mlflow_url}
    name = f"promote-{tmp_path.name[-12:].lower().replace('_', '-')}"
    client = mlflow.MlflowClient(servers.mlflow_url)
    runs = [_registered_run(cli, tmp_path, env, name, seed, steps, "if_better")
            for seed, steps in ((0, 800), (1, 400), (2, 800))]
    best = None
    for s in runs:
        v = client.get_model_version(name, s["version"])
        assert v.tags["agilerl.run_id"] == s["run_id"] and float(v.tags["agilerl.fitness"]) == s["champion"]["fitness"]
        assert len(v.tags["agilerl.config_digest"]) == 64 and v.tags["agilerl.seed"] in ("0", "1", "2")
        should = best is None or s["champion"]["fitness"] > best["champion"]["fitness"]
        assert s["promoted"] is should, (s["promotion"], best and best["champion"])
        best = s if should else best
        assert s["champion_version"] == best["version"]
    assert client.get_model_version_by_alias(name, "champion").version == best["version"]
    digests = {client.get_model_version(name, s["version"]).tags["agilerl.config_digest"] for s in runs}
    assert len(digests) == 3  # seed and budget differ: three configs
    never = _registered_run(cli, tmp_path, env, name, 3, 400, "never")
    assert never["promoted"] is False and "champion.promote is never" in never["promotion"]
    assert client.get_model_version_by_alias(name, "champion").version == best["version"]
    always = _registered_run(cli, tmp_path, env, name, 4, 400, "always")
    assert always["promoted"] is True and always["champion_uri"] == f"models:/{name}@champion"
    assert client.get_model_version_by_alias(name, "champion").version == always["version"]
    assert len(client.search_model_versions(f"name='{name}'")) == 5


def test_free_ports_come_from_below_the_ephemeral_range_once_each_and_are_bindable(monkeypatch):
    """A server port drawn from the ephemeral range can be taken by any outgoing connection before the
    server binds it (CI saw MLflow fail with EADDRINUSE); ports come from below it, each once."""
    import random
    import socket

    from agilerl_core.net import _ephemeral_range, free_port

    low, _ = _ephemeral_range()
    random.seed(0)
    ports = [free_port() for _ in range(64)]
    assert len(set(ports)) == 64
    if low > 21000:
        assert all(1024 <= p < low for p in ports), ports
    for p in ports[:8]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
    import agilerl_core.net as net

    with socket.socket() as taken:  # a port in use (or handed out before) is skipped
        taken.bind(("127.0.0.1", ports[8]))
        taken.listen()
        floor = 20000 if low > 21000 else 1024
        draws = iter([ports[8] - floor, ports[9] - floor, ports[10] - floor, 7])
        monkeypatch.setattr(net.secrets, "randbelow", lambda n: next(draws))
        net._HANDED_OUT.discard(ports[10])
        assert free_port() == ports[10]
