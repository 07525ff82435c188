"""Operations (issue 26): what an operator sees when a run is resumed after it ended, and what the CI gate reads."""

from __future__ import annotations

import json

import mlflow

from tests.conftest import cli_env, cli_summary, flow_cli


def test_resuming_a_finished_run_does_nothing_and_says_so(tmp_path):
    """A finished run resumes to its stored summary: no generation, no second model version, the champion alias
    where it was, the summary marked already_finished."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: done-test\nenv_id: CartPole-v1\nnum_envs: 4\npopulation_size: 2\nevo_steps: 200\n"
                   "max_env_steps: 400\neval_episodes: 2\nhyperparameters: {batch_size: 32, learning_delay: 64}\n")
    env = cli_env(tmp_path)
    out = tmp_path / "out"
    first = cli_summary(flow_cli("run", str(cfg), "--set", f"output_dir={out}", "--run-id", "done", "--no-progress",
                                 cwd=tmp_path, env=env))
    client = mlflow.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    versions = client.search_model_versions("name='done-test'")
    assert len(versions) == 1
    stored = json.loads((out / "done" / "summary.json").read_text())
    again = flow_cli("resume", "done", "--storage", str(out), "--no-progress", cwd=tmp_path, env=env)
    summary = cli_summary(again)
    assert summary["already_finished"] is True and "finished already" in again.stderr
    assert {k: summary[k] for k in first} == first  # the stored summary, not a new ending
    assert json.loads((out / "done" / "summary.json").read_text()) == stored
    assert len(client.search_model_versions("name='done-test'")) == 1
    assert len(list((out / "done" / "generations").iterdir())) == first["generations"]  # none added


def test_member_runs_lead_with_their_slot_and_the_resolved_storage_uri_is_logged(tmp_path, monkeypatch):
    from tasks.tracking import Tracker
    from tests.conftest import tiny_config

    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    cfg = tiny_config(population_size=2, **{"tracking.uri": f"sqlite:///{tmp_path / 'm.db'}"})
    assert cfg.storage.uri is None
    tracker = Tracker(cfg, "names-run", str(tmp_path / "runs" / "names-run"))
    client = mlflow.MlflowClient(cfg.tracking.uri)
    assert [client.get_run(c).info.run_name for c in tracker.child_ids] == ["slot-0 · names-run", "slot-1 · names-run"]
    assert client.get_run(tracker.parent_id).data.params["storage.uri"] == str(tmp_path / "runs" / "names-run")
