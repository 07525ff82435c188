"""The pipeline end to end against the real local stack (SeaweedFS S3 with credentials enforced, an
MLflow server on SQLite with artifacts on S3, a Prefect server and, for deployments, a process worker),
started once per session by the fixtures in conftest.py. Every run goes through the `agilerl-flow` CLI in
a subprocess, as a user or CI would run it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import greedy, wait_for_commit

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
CONFIG = """\
name: pipeline-test
env_id: CartPole-v1
num_envs: 4
population_size: 3
evo_steps: {evo_steps}
eval_episodes: 2
max_env_steps: {budget}
seed: 5
hyperparameters: {{batch_size: 32, learning_delay: 64, buffer_size: 1000}}
network: {{hidden_sizes: [32, 32], min_nodes: 8}}
storage: {{keep_generations: 2}}
"""
_CLEAN = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "AGILERL_STORAGE_URI", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
          "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE")


def _env(stack, tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _CLEAN}
    env.update(stack.client_env(), PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    env.update(extra)
    return env


def _cli(*args, env, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _summary(p) -> dict:
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _config(tmp_path, evo_steps=200, budget=2400) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.format(evo_steps=evo_steps, budget=budget))
    return path


def _store(stack, run_id):
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import S3Options, S3Storage

    c = stack.credentials()
    return RunStore(S3Storage("s3://agilerl/runs", S3Options(stack.s3_url, None, c["access_key_id"],
                                                             c["secret_access_key"])), run_id)


def _final(stack, run_id) -> dict:
    """What must match between runs: lineage, fitness history, and every final member's weights."""
    store = _store(stack, run_id)
    g = store.latest_generation()
    pop = json.loads(store.storage.get_bytes(store.key(store.gen_dir(g), "population", "population.json")))
    manifest = store.manifest(g)
    weights = {k.split("/population/")[1]: v for k, v in manifest["files"].items() if k.endswith(".safetensors")}
    return {"generation": g, "lineage": pop["lineage"], "weights": weights,
            "fitness": [h["fitnesses"] for h in pop["extra"]["history"]], "rng": pop["rng"]}


@pytest.fixture(scope="module")
def threads_run(servers, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("threads")
    env = _env(servers, tmp)
    p = _cli("run", str(_config(tmp)), "--run-id", "threads-run", "--no-progress", env=env, cwd=tmp)
    return {"summary": _summary(p), "stderr": p.stderr, "stdout": p.stdout, "env": env, "tmp": tmp}


def test_flow_stores_tracks_and_matches_the_local_loop(servers, threads_run):
    s = threads_run["summary"]
    assert threads_run["stdout"].strip().splitlines() == [json.dumps(s)]  # stdout is the JSON summary alone
    assert s["run_id"] == "threads-run" and s["storage_uri"] == "s3://agilerl/runs/threads-run"
    assert s["generations"] == 4 and s["global_steps"] == 2400 and s["mlflow_run_id"]
    assert s["elite_uri"] == "s3://agilerl/runs/threads-run/elite"
    store = _store(servers, "threads-run")
    assert store.committed_generations() == [0, 1, 2, 3]
    assert [store.manifest(g)["pruned"] for g in range(4)] == [True, True, False, False]  # keep_generations 2

    tmp = threads_run["tmp"]
    local = _summary(_cli("run", str(_config(tmp)), "--local", "--no-progress", "--run-dir", str(tmp / "local"),
                          env=threads_run["env"], cwd=tmp))
    assert (local["best_fitness"], local["global_steps"]) == (s["best_fitness"], s["global_steps"])
    local_pop = json.loads((tmp / "local" / "population" / "population.json").read_text())
    assert local_pop["lineage"] == _final(servers, "threads-run")["lineage"]


def test_mlflow_has_params_metrics_lineage_and_no_secret(servers, threads_run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(servers.mlflow_url)
    parent = client.get_run(threads_run["summary"]["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["hyperparameters.lr"] == "0.001" and parent.data.params["env_id"] == "CartPole-v1"
    assert [m.step for m in client.get_metric_history(parent.info.run_id, "best_fitness")] == [0, 1, 2, 3]
    assert client.get_metric_history(parent.info.run_id, "global_env_steps")[-1].value == 2400
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(r.data.tags["agilerl.slot"] for r in children) == ["0", "1", "2"]
    for child in children:
        for metric in ("fitness", "hp.lr", "hp.batch_size", "param_count"):
            assert [m.step for m in client.get_metric_history(child.info.run_id, metric)] == [0, 1, 2, 3], metric
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "lineage")}
    assert {"lineage/family_tree.png", "lineage/hp_schedules.png", "lineage/lineage.json"} <= arts
    secret = servers.credentials()["secret_access_key"]
    everything = json.dumps([parent.data.params, parent.data.tags] + [c.data.tags for c in children])
    assert secret not in everything
    assert secret not in threads_run["stdout"] + threads_run["stderr"]
    for log in (servers.data_dir / "logs").glob("*.log"):
        assert secret not in log.read_text(errors="replace"), log


def test_the_run_hands_over_what_it_found(servers, threads_run):
    """Issue 67 item 6: the summary, the MLflow parent run and the CLI's last lines give the champion's
    hyperparameters, and the run stores the config that re-runs from them (no secret in it)."""
    import yaml
    from mlflow.tracking import MlflowClient

    from agilerl_core.algorithms.saved import load_member
    from tasks.config import validate_config

    s = threads_run["summary"]
    found = s["found"]
    assert found["member_id"] == s["champion"]["member_id"] and set(found["values"]) == {"lr", "batch_size", "learn_step"}
    assert s["found_config_uri"] == "s3://agilerl/runs/threads-run/found_config.yaml"
    store = _store(servers, "threads-run")
    text = store.storage.get_bytes(store.key("found_config.yaml")).decode()
    assert servers.credentials()["secret_access_key"] not in text and "access_key" not in text
    again = validate_config(yaml.safe_load(text))
    assert {n: getattr(again.hyperparameters, n) for n in found["values"]} == found["values"]
    assert again.hp_init.method == "config" and again.seed == 5
    elite_dir = Path(threads_run["tmp"]) / "found-elite"
    store.storage.download_dir(store.key("elite"), elite_dir)
    elite, _ = load_member(elite_dir)  # the registered champion is the member whose values these are
    assert {n: getattr(elite.agent.hp, n) for n in found["values"]} == found["values"]
    client = MlflowClient(servers.mlflow_url)
    parent = client.get_run(s["mlflow_run_id"])
    assert {k: v for k, v in parent.data.params.items() if k.startswith("found.")} == \
        {f"found.{n}": str(v) for n, v in found["values"].items()}
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "found")}
    assert arts == {"found/found_hyperparameters.json", "found/found_config.yaml"}
    assert "Found: member" in parent.data.tags["mlflow.note.content"]
    assert f"found: member {found['member_id']}'s hyperparameters" in threads_run["stderr"]
    assert s["found_config_uri"] in threads_run["stderr"]


def test_registered_champion_loads_and_acts(servers, threads_run, monkeypatch):
    import gymnasium as gym
    import mlflow

    from agilerl_core.algorithms.saved import load_member

    monkeypatch.setenv("MLFLOW_TRACKING_URI", servers.mlflow_url)
    mlflow.set_tracking_uri(servers.mlflow_url)
    assert threads_run["summary"]["champion_uri"] == "models:/pipeline-test@champion"
    model = mlflow.pyfunc.load_model("models:/pipeline-test@champion")
    env = gym.make("CartPole-v1")
    obs = np.stack([env.reset(seed=i)[0] for i in range(6)])
    actions = model.predict(obs)
    assert actions.shape == (6,) and set(actions.tolist()) <= {0, 1}
    store = _store(servers, "threads-run")
    local = Path(threads_run["tmp"]) / "elite"
    store.storage.download_dir(store.key("elite"), local)
    elite, _ = load_member(local)
    from agilerl_core.envs.spaces import ObsSpec

    best = greedy(elite.agent, ObsSpec(env.observation_space).to_tensors(obs))
    assert actions.tolist() == best.tolist()
    # the champion plays a whole episode
    o, _ = env.reset(seed=123)
    for _ in range(20):
        o, _, term, trunc, _ = env.step(int(model.predict(o[None])[0]))
        if term or trunc:
            break


def test_lineage_command_draws_the_family_tree(servers, threads_run):
    out = Path(threads_run["tmp"]) / "tree.png"
    s = _summary(_cli("lineage", "threads-run", "--out", str(out), "--storage", "s3://agilerl/runs",
                      env=threads_run["env"], cwd=threads_run["tmp"]))
    assert s["members"] == 12 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dask_runner_gives_the_thread_runner_result(servers, threads_run, tmp_path):
    p = _cli("run", str(_config(tmp_path)), "--run-id", "dask-run", "--no-progress", "--set", "runner.kind=dask",
             "--set", "runner.workers=2", env=_env(servers, tmp_path), cwd=tmp_path)
    s = _summary(p)
    assert s["best_fitness"] == threads_run["summary"]["best_fitness"]
    assert _final(servers, "dask-run") == _final(servers, "threads-run")


def test_resume_after_kill_9_ends_as_an_uninterrupted_run(servers, tmp_path):
    cfg = _config(tmp_path, evo_steps=400, budget=8400)  # 7 generations
    env = _env(servers, tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(cfg), "--run-id", "crashed",
                             "--no-progress"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    store = _store(servers, "crashed")
    wait_for_commit(store, 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9 in the middle of generation 3
    proc.wait()
    committed = store.committed_generations()
    assert 2 in committed and committed[-1] < 6, committed

    resumed = _summary(_cli("resume", "crashed", "--storage", "s3://agilerl/runs", "--no-progress", env=env,
                            cwd=tmp_path))
    straight = _summary(_cli("run", str(cfg), "--run-id", "straight", "--no-progress", env=env, cwd=tmp_path))
    assert resumed["generations"] == straight["generations"] == 7
    assert resumed["best_fitness"] == straight["best_fitness"]
    assert _final(servers, "crashed") == _final(servers, "straight")

    from mlflow.tracking import MlflowClient

    client = MlflowClient(servers.mlflow_url)
    steps = [m.step for m in client.get_metric_history(resumed["mlflow_run_id"], "best_fitness")]
    assert sorted(set(steps)) == list(range(7))  # one parent run across the crash, every generation logged


def test_bad_credentials_and_unreachable_tracking_fail_before_training(servers, tmp_path):
    from infra.stack import free_port

    cfg = _config(tmp_path)
    p = _cli("run", str(cfg), "--run-id", "badsecret", env=_env(servers, tmp_path, AWS_SECRET_ACCESS_KEY="wrong"),
             cwd=tmp_path, timeout=120)
    assert p.returncode == 1 and "storage error" in p.stderr and "secret key is wrong" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "wrong" not in p.stdout
    assert not _store(servers, "badsecret").storage.list("badsecret/")

    dead = f"http://127.0.0.1:{free_port()}"
    p = _cli("run", str(cfg), "--run-id", "notracking", env=_env(servers, tmp_path, MLFLOW_TRACKING_URI=dead),
             cwd=tmp_path, timeout=120)
    assert p.returncode == 1 and "tracking error" in p.stderr and "MLFLOW_TRACKING_URI" in p.stderr, p.stderr
    assert not _store(servers, "notracking").storage.list("notracking/")


def test_deployment_trigger_waits_and_gates_on_fitness(servers, tmp_path):
    servers.start_worker()
    env = _env(servers, tmp_path)
    from infra.stack import _bin

    p = subprocess.run([_bin("prefect"), "--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert _deployed_schedules(servers) == {  # only the configs with a schedule: section have one
        "online-evolution/cartpole-dqn": [("0 2 * * *", "UTC", True)],
        "online-evolution/cartpole-ppo": [("0 2 * * *", "UTC", True)],
        "online-evolution/carracing-ppo": [("0 3 * * 0", "UTC", False)]}
    small = ["--param", "config.max_env_steps=1200", "--param", "config.evo_steps=300", "--param",
             "config.population_size=2", "--param", "config.hyperparameters.learning_delay=64", "--param",
             "config.eval_episodes=2"]
    s = _summary(_cli("trigger", "online-evolution/cartpole-dqn", *small, "--wait", "--min-fitness", "1",
                      "--timeout", "300", env=env, cwd=tmp_path))
    assert s["state"] == "COMPLETED" and s["generations"] == 2 and s["storage_uri"].startswith("s3://agilerl/runs/")
    # the deployment's run (on the worker) can be watched generation by generation: its log lines and tables
    logs = [e["message"] for e in _post_json(servers, "/logs/filter",
                                             {"logs": {"flow_run_id": {"any_": [s["prefect_flow_run_id"]]}}})]
    assert [m.split(":")[0] for m in logs if m.startswith("generation ")] == ["generation 0", "generation 1"], logs
    arts = _post_json(servers, "/artifacts/filter",
                      {"artifacts": {"flow_run_id": {"any_": [s["prefect_flow_run_id"]]}}})
    from tasks.artifacts import artifact_key

    assert sum(a["key"] == artifact_key(s["run_id"], "generation") for a in arts) == 2, \
        [a["key"] for a in arts]  # keyed by the run
    import urllib.request

    with urllib.request.urlopen(f"{servers.prefect_api}/flow_runs/{s['prefect_flow_run_id']}", timeout=10) as resp:
        assert json.loads(resp.read())["name"] == s["run_id"]  # renamed once the deployment's run made its id
    p = _cli("trigger", "online-evolution/cartpole-dqn", *small, "--wait", "--min-fitness", "1e9", "--timeout", "300",
             env=env, cwd=tmp_path)
    assert p.returncode == 1 and "below --min-fitness" in p.stderr
    failed = json.loads(p.stdout.strip().splitlines()[-1])  # what `... | tee summary.json` keeps when the gate fails
    assert failed["passed"] is False and failed["min_fitness"] == 1e9 and failed["best_fitness"] < 1e9
    p = _cli("trigger", "online-evolution/nope", "--wait", env=env, cwd=tmp_path)
    assert p.returncode == 2 and "not found" in p.stderr


def _post_json(stack, path: str, body: dict | None = None) -> list:
    """POST to the stack's Prefect API (the filter endpoints)."""
    import urllib.request

    req = urllib.request.Request(f"{stack.prefect_api}{path}", data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _deployed_schedules(stack) -> dict[str, list[tuple]]:
    """Every deployment on the server that has schedules: flow/deployment -> [(cron, timezone, active)]."""
    flows = {f["id"]: f["name"] for f in _post_json(stack, "/flows/filter")}
    return {f"{flows[d['flow_id']]}/{d['name']}": [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"])
                                                   for s in d["schedules"]]
            for d in _post_json(stack, "/deployments/filter") if d["schedules"]}


_ALGO_CONFIGS = {
    # continuous actions with observation normalisation, and the on-policy algorithm (no shared buffer)
    "td3": ("pendulum_td3.yaml", {"num_envs": 2, "evo_steps": 200, "max_env_steps": 1200, "eval_max_steps": 50,
                                  "hyperparameters.learning_delay": 64, "hyperparameters.random_steps": 64,
                                  "hyperparameters.batch_size": 32, "hyperparameters.buffer_size": 2000,
                                  "hyperparameters.normalize_obs": True}),
    "ppo": ("cartpole_ppo.yaml", {"num_envs": 2, "evo_steps": 256, "max_env_steps": 1536,
                                  "hyperparameters.rollout_steps": 32}),
}


@pytest.mark.parametrize("algo", sorted(_ALGO_CONFIGS))
def test_other_algorithms_run_through_the_flow_like_the_local_loop(servers, tmp_path, algo, monkeypatch):
    import gymnasium as gym
    import mlflow

    name, over = _ALGO_CONFIGS[algo]
    over = {**over, "population_size": 2, "eval_episodes": 2, "name": f"flow-{algo}", "target_fitness": None,
            "network.hidden_sizes": [32, 32], "network.min_nodes": 16}
    sets = [a for k, v in over.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    config = str(ROOT / "deployments" / "configs" / name)
    env = _env(servers, tmp_path)
    s = _summary(_cli("run", config, *sets, "--run-id", f"{algo}-run", "--no-progress", env=env, cwd=tmp_path))
    local = _summary(_cli("run", config, *sets, "--local", "--no-progress", "--run-dir", str(tmp_path / "local"),
                          env=env, cwd=tmp_path))
    assert (s["best_fitness"], s["global_steps"]) == (local["best_fitness"], local["global_steps"])
    local_pop = json.loads((tmp_path / "local" / "population" / "population.json").read_text())
    assert local_pop["lineage"] == _final(servers, f"{algo}-run")["lineage"]
    # the registered champion acts as the env takes actions (Pendulum: floats within [-2, 2])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", servers.mlflow_url)
    mlflow.set_tracking_uri(servers.mlflow_url)
    model = mlflow.pyfunc.load_model(s["champion_uri"])
    genv = gym.make("Pendulum-v1" if algo == "td3" else "CartPole-v1")
    obs = np.stack([genv.reset(seed=i)[0] for i in range(4)])
    actions = np.asarray(model.predict(obs))
    if algo == "td3":
        assert actions.shape == (4, 1) and np.all(np.abs(actions) <= 2.0)
    else:
        assert actions.shape == (4,) and set(actions.tolist()) <= {0, 1}
