"""Trust: a checkpoint is data. Every loader is given tampered JSON naming code (a multi-agent env function, a
Gymnasium entry point, a ``module:EnvId``, an LLM base that would run code): nothing runs, and what cannot load
is refused naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agilerl_core.algorithms.acting import Acting
from agilerl_core.algorithms.registry import get_algorithm
from agilerl_core.algorithms.saved import load_member, load_population
from agilerl_core.errors import CheckpointError
from agilerl_core.experiment import build_evolution
from tests.conftest import greedy, tiny_config

# A module that leaves a marker when it is imported, and functions that leave one when called.
EVIL = '''
import pathlib, os
pathlib.Path(os.environ["AGILERL_TEST_MARKER"]).write_text("imported")

def run(*args, **kwargs):
    pathlib.Path(os.environ["AGILERL_TEST_MARKER"]).write_text("called")

class Env:
    def __init__(self, *args, **kwargs):
        run()
'''


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """An importable module `evilmod_<n>` (and package `evilpkg_<n>`) that write `marker` when imported or
    called; the test asserts the marker never appears."""
    code = tmp_path / "code"
    code.mkdir()
    tag = tmp_path.name.replace("-", "_").replace(".", "_")
    (code / f"evilmod_{tag}.py").write_text(EVIL)
    (code / f"evilpkg_{tag}").mkdir()
    (code / f"evilpkg_{tag}" / "__init__.py").write_text(EVIL)
    (code / f"evilpkg_{tag}" / "sub.py").write_text("")
    monkeypatch.syspath_prepend(str(code))
    path = tmp_path / "marker"
    monkeypatch.setenv("AGILERL_TEST_MARKER", str(path))
    return SimpleNamespace(path=path, module=f"evilmod_{tag}", package=f"evilpkg_{tag}")


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _gym_elite(tmp_path: Path, **overrides) -> Path:
    evo = build_evolution(tiny_config(population_size=2, **overrides))
    evo.population.record_fitness([1.0, 2.0])
    return evo.save_elite(tmp_path / "elite")


def _tamperings(marker) -> list:
    return [
        {"kind": "multi_agent", "env_id": f"{marker.module}:run", "env_kwargs": {"args": ["touch", "x"]}},
        {"env_id": "Evil-v0", "env_entry_point": f"{marker.module}:Env", "env_kwargs": {}},
        {"env_id": f"{marker.module}:Evil-v0", "env_kwargs": {}},
        {"kind": "multi_agent", "env_id": "subprocess:run", "env_kwargs": {"args": ["touch", str(marker.path)]}},
    ]


def test_a_tampered_env_in_member_json_is_a_label_nothing_runs(tmp_path, marker):
    elite = _gym_elite(tmp_path)
    reference, _ = load_member(elite)
    obs = {"obs": torch.randn(8, 4)}
    for env in _tamperings(marker):
        _edit(elite / "member.json", lambda d, env=env: d.__setitem__("env", env))
        member, recorded = load_member(elite)  # built from the recorded spaces alone
        assert recorded == env
        assert np.array_equal(greedy(member.agent, obs), greedy(reference.agent, obs))
        assert not marker.path.exists(), f"loading ran code named by {env}"


def test_every_loader_of_a_gym_member_ignores_code_it_names(tmp_path, marker):
    from agilerl_core.data.collect import collect_episodes
    from tasks.champion_model import ChampionPolicy

    elite = _gym_elite(tmp_path)
    _edit(elite / "member.json", lambda d: d.__setitem__("env", {
        "env_id": "CartPole-v1", "env_entry_point": f"{marker.module}:Env", "kind": "multi_agent"}))
    policy = ChampionPolicy()
    policy.load_context(SimpleNamespace(artifacts={"member": str(elite)}))  # the registered champion
    assert np.asarray(policy.predict(None, np.zeros((3, 4), np.float32))).shape == (3,)
    _edit(elite / "member.json", lambda d: d["env"].pop("kind"))
    episodes = collect_episodes("CartPole-v1", str(elite), 2, num_envs=2,  # dataset collect --policy DIR
                                algorithms=get_algorithm, acting=Acting)
    assert len(episodes) == 2
    assert not marker.path.exists()


def test_malformed_or_missing_spaces_are_refused_naming_file_and_field(tmp_path, marker):
    elite = _gym_elite(tmp_path)
    good = json.loads((elite / "member.json").read_text())
    for bad, field in [({"kind": "single", "observation_space": {"type": f"{marker.module}:Space"}}, "spec"),
                       ({"kind": "single", "observation_space": {"type": "Box", "shape": [4], "dtype": "object",
                                                                 "low": [0] * 4, "high": [1] * 4}}, "dtype"),
                       ("evilmod:spec", "spec")]:
        _edit(elite / "member.json", lambda d, bad=bad: d.__setitem__("spec", bad))
        with pytest.raises(CheckpointError, match=rf"member\.json.*{field}"):
            load_member(elite)
    (elite / "member.json").write_text(json.dumps({k: v for k, v in good.items() if k != "spec"}))  # an older file
    with pytest.raises(CheckpointError, match=r"member\.json: records no observation/action spaces \(field 'spec'"):
        load_member(elite)
    evo = build_evolution(tiny_config(population_size=2))
    member, _ = load_member(elite, evo.arena.obs_spec)  # the caller's own spec (a trusted config) still loads it
    assert member.agent.name == "dqn"
    _edit(elite / "member.json", lambda d: d["agent"].__setitem__("algorithm", f"{marker.module}:Agent"))
    with pytest.raises(CheckpointError, match=r"member\.json: field agent\.algorithm"):
        load_member(elite, evo.arena.obs_spec)
    assert not marker.path.exists()


def test_a_team_checkpoint_records_every_agents_spaces_and_runs_nothing(tmp_path, marker):
    from tests.test_multi_agent import ma_config

    evo = build_evolution(ma_config())
    evo.population.record_fitness([1.0, 0.0])
    elite = evo.save_elite(tmp_path / "team")
    _edit(elite / "member.json", lambda d: d.__setitem__("env", {
        "kind": "multi_agent", "env_id": f"{marker.module}:run", "env_kwargs": {"args": ["touch", "x"]}}))
    member, _ = load_member(elite)
    spec = member.agent.env_spec
    assert spec.agents == evo.arena.spec.agents
    spec.space.seed(0)
    obs = spec.to_tensors({a: np.stack([spec.space.sample()[a] for _ in range(2)]) for a in spec.agents})
    original = greedy(evo.population.elite().agent, obs)
    loaded = greedy(member.agent, obs)
    assert set(loaded) == set(spec.agents)
    for a in spec.agents:
        assert np.array_equal(loaded[a], original[a])
    pop_dir = evo.save(tmp_path / "pop")
    _edit(pop_dir / "population.json", lambda d: d.__setitem__("env", {"kind": "multi_agent",
                                                                       "env_id": f"{marker.module}:run"}))
    for m in (pop_dir / "members").iterdir():
        _edit(m / "member.json", lambda d: d["env"].__setitem__("env_id", f"{marker.module}:run"))
    pop, _ = load_population(pop_dir)
    assert len(pop.members) == 2
    assert not marker.path.exists()


def test_an_llm_base_recorded_in_a_checkpoint_never_runs_code(tmp_path, marker):
    from agilerl_core.arenas.llm import load_llm_member
    from tests.test_llm import llm_config

    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"{a}+{b}=", "answer": "7"} for a in range(10) for b in range(10)]
    (data / "const.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evo = build_evolution(llm_config(data, population_size=1))
    evo.population.record_fitness([0.5])
    elite = evo.save_elite(tmp_path / "llm")
    load_llm_member(str(elite))  # as saved: loads
    # a directory whose tokenizer and model configs ask for remote code from a module beside them
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / f"{marker.module}.py").write_text(EVIL)
    auto = {"AutoConfig": f"{marker.module}.Env", "AutoModelForCausalLM": f"{marker.module}.Env",
            "AutoTokenizer": [f"{marker.module}.Env", None]}
    (remote / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": auto}))
    (remote / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto}))
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1)}, str(remote / "model.safetensors"))
    for base in ({"path": str(remote)}, {"path": f"package:{marker.package}.sub"}, {"path": "package:os.path"},
                 {"path": str(remote), "config": None}):
        _edit(elite / "member.json", lambda d, base=base: (d["agent"]["base"].pop("config", None),
                                                            d["agent"]["base"].update(base)))
        with pytest.raises(CheckpointError, match=r"member\.json: field agent\.base"):
            load_llm_member(str(elite))
        assert not marker.path.exists(), f"loading ran code for base {base}"


# ---- code named by a deployment run's parameters ---------------------------------------------------------------
def test_code_references_and_the_allowlist():
    from agilerl_core.config import check_code_allowed, code_references, module_allowed
    from agilerl_core.errors import ConfigError

    cfg = tiny_config(env_id="pkg.envs:Line-v0", env_entry_point="other.mod:Line")
    assert code_references(cfg) == {"env_id": "pkg.envs", "env_entry_point": "other.mod"}
    assert module_allowed("pkg.envs.sub", {"pkg"}) and not module_allowed("pkgx", {"pkg"})
    check_code_allowed(cfg, {"pkg", "other.mod"})
    with pytest.raises(ConfigError, match=r"^env_entry_point: .*'other\.mod'.*AGILERL_TRUSTED_MODULES"):
        check_code_allowed(cfg, {"pkg.envs"})
    assert code_references(tiny_config()) == {}


@pytest.mark.integration
def test_a_deployment_run_refuses_parameters_naming_code_its_config_does_not(servers, tmp_path, cli):
    """Deployed with a config naming tests.conftest's env: a run whose `config` parameter names another module
    fails before anything is imported, naming the field; the deployed config itself still runs."""
    import subprocess
    import sys
    import tempfile

    from tests.conftest import ROOT_DIR

    marker = Path(tempfile.gettempdir()) / "agilerl-evil-module-imported"
    marker.unlink(missing_ok=True)
    servers.start_worker()
    env = {**cli.env, **servers.client_env()}
    config = {"name": "trust-test", "env_id": "Line-v0", "env_entry_point": "tests.conftest:MaskedLineEnv",
              "num_envs": 2, "population_size": 2, "evo_steps": 100, "eval_episodes": 1, "max_env_steps": 200,
              "seed": 0, "hyperparameters": {"batch_size": 32, "learning_delay": 32, "buffer_size": 1000},
              "network": {"hidden_sizes": [16], "min_nodes": 8}, "tracking": {"enabled": False},
              "storage": {"uri": str(tmp_path / "runs")}}
    deploy = (f"from prefect import flow\n"
              f"flow.from_source(source={str(ROOT_DIR)!r}, entrypoint='flows/online.py:online_evolution').deploy("
              f"name='trust-test', work_pool_name='agilerl-process', parameters={{'config': {config!r}}}, "
              f"print_next_steps=False)\n")
    p = subprocess.run([sys.executable, "-c", deploy], cwd=ROOT_DIR, env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    refused = cli.run("trigger", "online-evolution/trust-test", "--param",
                       "config.env_entry_point=tests.evil_module:Env", "--wait", "--timeout", "240",
                       cwd=ROOT_DIR, env=env, timeout=300)
    assert refused.returncode != 0
    out = refused.stdout + refused.stderr
    assert "env_entry_point" in out and "tests.evil_module" in out and "not allowed in a parameter" in out, out[-3000:]
    assert not marker.exists(), "the refused parameter's module was imported"
    elsewhere = cli.run("trigger", "online-evolution/trust-test", "--param", "config.runner.address=tcp://10.9.9.9:8786",
                         "--wait", "--timeout", "240", cwd=ROOT_DIR, env=env, timeout=300)  # issue 38, case 2
    out = elsewhere.stdout + elsewhere.stderr
    assert elsewhere.returncode != 0 and "runner.address" in out and "not allowed in a parameter" in out, out[-3000:]
    ran = cli.run("trigger", "online-evolution/trust-test", "--param", "config.seed=1", "--wait", "--timeout", "240",
                   cwd=ROOT_DIR, env=env, timeout=300)
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:]


# ---- no path from a key, id or URI escapes its root ----------------------------------------------------------
def _s3_opts(s3):
    from agilerl_core.io.storage import S3Options

    c = s3.credentials()
    return S3Options(s3.s3_url, None, c["access_key_id"], c["secret_access_key"])


@pytest.mark.integration
@pytest.mark.parametrize("bad", ["../../escape.txt", "/etc/escape.txt", "a/./b.txt", "a/../../escape.txt"])
def test_dataset_keys_that_would_leave_the_cache_are_refused_before_any_write(s3, tmp_path, monkeypatch, bad):
    """SeaweedFS itself refuses '..' keys and folds '//', but other S3 stores hold them: the listing of a real
    bucket is given one such key, and nothing is written or deleted anywhere."""
    from agilerl_core.data.fetch import resolve_dataset
    from agilerl_core.errors import DatasetError
    from agilerl_core.io.storage import S3Storage

    opts = _s3_opts(s3)
    store = S3Storage("s3://agilerl", opts)
    prefix = f"trust/ds-{tmp_path.name}"
    store.put_bytes(f"{prefix}/ok.txt", b"fine")
    real_list = S3Storage.list
    monkeypatch.setattr(S3Storage, "list", lambda self, p: [*real_list(self, p), f"{prefix}/{bad}"])
    cache = tmp_path / "cache"
    with pytest.raises(DatasetError, match=r"would leave its directory.*refusing it before anything is written"):
        resolve_dataset(f"s3://agilerl/{prefix}", opts, str(cache))
    assert not list(cache.rglob("*.txt")) and not (tmp_path / "escape.txt").exists()
    with pytest.raises(Exception, match="would leave its directory"):
        store.download_dir(prefix, tmp_path / "mirror" / "deep")
    assert not (tmp_path / "mirror").exists()


@pytest.mark.integration
def test_a_symlink_planted_in_the_cache_is_not_written_through(s3, tmp_path):
    from agilerl_core.data.fetch import resolve_dataset
    from agilerl_core.errors import StorageError
    from agilerl_core.io.storage import S3Storage

    opts = _s3_opts(s3)
    store = S3Storage("s3://agilerl", opts)
    prefix = f"trust/link-{tmp_path.name}"
    store.put_bytes(f"{prefix}/sub/data.txt", b"v1")
    cache = tmp_path / "cache"
    first = resolve_dataset(f"s3://agilerl/{prefix}", opts, str(cache))
    outside = tmp_path / "outside"
    outside.mkdir()
    sub = first.path / "sub"
    (sub / "data.txt").unlink()
    sub.rmdir()
    sub.symlink_to(outside)  # the cache's sub/ now leads out of it
    store.put_bytes(f"{prefix}/sub/data.txt", b"v2")  # changed: it would be fetched again into sub/
    with pytest.raises(StorageError, match="outside"):
        resolve_dataset(f"s3://agilerl/{prefix}", opts, str(cache))
    assert not any(outside.iterdir())


def test_names_in_checkpoints_and_dataset_ids_stay_below_their_roots(tmp_path, monkeypatch):
    from agilerl_core.data.fetch import resolve_dataset
    from agilerl_core.errors import DatasetError

    evo = build_evolution(tiny_config(population_size=2))
    pop = evo.save(tmp_path / "pop")
    _edit(pop / "population.json", lambda d: d.__setitem__("members", ["0", "../../elsewhere"]))
    with pytest.raises(CheckpointError, match=r"population\.json: field members lists '\.\./\.\./elsewhere'"):
        load_population(pop)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    for bad in ("minari:../../etc", "minari:/etc/passwd", "minari:a/../../b"):
        with pytest.raises(DatasetError, match="would leave its directory"):
            resolve_dataset(bad)


# ---- the stack's own authentication -------------------------------------------------------------------------
@pytest.mark.integration
def test_stack_up_with_auth_turns_on_prefect_and_mlflow_authentication(tmp_path):
    """`stack up --auth`: Prefect's API and MLflow refuse a client without credentials (401) and serve one with
    the stack's env (what env.sh exports); the credentials stay in a 0600 file."""
    import base64
    import os
    import stat
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from infra.stack import Stack, free_port

    stack = Stack(tmp_path / "stack", ports={k: free_port() for k in ("s3", "mlflow", "prefect")}, auth=True)
    try:
        stack.start_mlflow()
        stack.start_prefect()
        assert stat.S_IMODE(os.stat(tmp_path / "stack" / "auth.json").st_mode) == 0o600
        env = stack.client_env(("mlflow", "prefect"))

        def status(url, headers=None, data=None):
            req = urllib.request.Request(url, headers={"Content-Type": "application/json", **(headers or {})},
                                         data=data, method="POST" if data is not None else "GET")
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    return resp.status
            except urllib.error.HTTPError as err:
                return err.code

        flows = f"{stack.prefect_api}/flows/filter"
        assert status(flows, data=b"{}") == 401
        token = base64.b64encode(env["PREFECT_API_AUTH_STRING"].encode()).decode()
        assert status(flows, {"Authorization": f"Basic {token}"}, b"{}") == 200
        search = f"{stack.mlflow_url}/api/2.0/mlflow/experiments/search?max_results=1"
        assert status(search) == 401
        probe = ("import mlflow; c = mlflow.MlflowClient(); e = c.create_experiment('auth-probe'); "
                 "print(c.get_experiment(e).name)")
        out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "auth-probe", out.stderr[-2000:]
        denied = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                                env={**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")},
                                     "MLFLOW_TRACKING_URI": stack.mlflow_url})
        assert denied.returncode != 0 and "401" in denied.stderr + denied.stdout
        assert stack.status()["prefect"]["healthy"] and stack.status()["mlflow"]["healthy"]
    finally:
        stack.down()


def _cli_config(cli, tmp_path, **fields):
    """A small CartPole config written as YAML for the CLI: (its path, the CLI's env, a storage dir)."""
    import yaml



    cfg = {"env_id": "CartPole-v1", "num_envs": 4, "eval_episodes": 2, "seed": 0, "tracking": {"enabled": False},
           "hyperparameters": {"batch_size": 32, "learning_delay": 64, "buffer_size": 5000},
           "network": {"hidden_sizes": [32, 32], "min_nodes": 8}, **fields}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cli.env, str(tmp_path / "runs")


def _start_run(path, run_id: str, storage: str, env: dict, cwd):
    """`agilerl-flow run` in the background, in a process group of its own (to be killed whole)."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(path), "--run-id", run_id, "--storage",
                             storage, "--no-progress"], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def test_a_resume_reads_a_tampered_generation_as_data(tmp_path, marker):
    """Committed members whose member.json (and the manifest's checksums, rewritten to match) name code: the
    resume rebuilds them from its own config and nothing runs."""
    import hashlib

    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import LocalStorage

    evo = build_evolution(tiny_config(population_size=2))
    store = RunStore(LocalStorage(tmp_path / "store"), "tampered")
    store.init_run({"name": "x"})
    evo.population.record_fitness([1.0, 2.0])
    evo.commit(store, [])
    manifest = store.manifest(0)
    for key in list(manifest["files"]):
        if key.endswith("member.json"):
            doc = json.loads(store.storage.get_bytes(key))
            doc["env"] = {"kind": "multi_agent", "env_id": f"{marker.module}:run", "env_kwargs": {}}
            doc.pop("spec")
            data = json.dumps(doc).encode()
            store.storage.put_bytes(key, data)
            manifest["files"][key] = hashlib.sha256(data).hexdigest()
    store.storage.put_bytes(store.key("generations/000000/MANIFEST.json"), json.dumps(manifest).encode())
    again = build_evolution(tiny_config(population_size=2))
    again.resume(store, 0)
    assert [m.member_id for m in again.population.members] == [0, 1]
    assert not marker.path.exists()


def test_experience_written_by_an_older_buffer_layout_is_refused_clearly(tmp_path):
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import LocalStorage

    evo = build_evolution(tiny_config(population_size=2))
    store = RunStore(LocalStorage(tmp_path / "store"), "old-layout")
    shard = {k: torch.zeros((4, *f.shape), dtype=f.dtype) for k, f in evo.arena.buffer.fields.items()
             if k != "terminated"}
    ref = store.put_shard(0, 0, shard)
    evo.population.record_fitness([1.0, 2.0])
    store.commit_generation(evo.population, evo.arena.env_desc, [ref], evo.extra_state(),
                            {"size": 4, "pos": 4, "capacity": evo.arena.buffer.capacity}, 0)
    with pytest.raises(CheckpointError, match="lacks field.*terminated.*older version"):
        store.rebuild_buffer(0, evo.arena.buffer)


def test_a_manifest_listing_a_path_outside_the_generation_is_refused(tmp_path):
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import LocalStorage

    evo = build_evolution(tiny_config(population_size=2))
    store = RunStore(LocalStorage(tmp_path / "store"), "bad-manifest")
    evo.population.record_fitness([1.0, 2.0])
    evo.commit(store, [])
    manifest = store.manifest(0)
    prefix = store.key("generations/000000/population")
    manifest["files"][f"{prefix}/a//escape"] = "0" * 64
    store.storage.put_bytes(store.key("generations/000000/MANIFEST.json"), json.dumps(manifest).encode())
    with pytest.raises(CheckpointError, match="is not a file of one of this run's generations"):  # before any read
        store.load_generation(0, algorithms=get_algorithm)


def test_a_retried_generation_log_records_each_metric_once(tmp_path, monkeypatch):
    """The log task's retries are idempotent: a second batch for the same generation (what a retry sends after
    a half-finished first try) adds nothing; the end-of-run task, which registers a model, is not retried."""
    import mlflow

    from tasks.tracker import Tracker, log_run_end_task

    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    cfg = tiny_config(population_size=2, **{"tracking.uri": f"sqlite:///{tmp_path / 'm.db'}"})
    tracker = Tracker(cfg, "retry-run", str(tmp_path / "runs"))
    stats = {"generation": 0, "best_fitness": 2.0, "mean_fitness": 1.5, "global_steps": 400, "wall_s": 1.0}
    members = [{"fitness": f, "param_count": 10, "train_return": 1.0, "member_id": i, "mutation": "none",
                "architecture": "mlp", "hyperparameters": {"lr": 1e-3}} for i, f in enumerate((1.0, 2.0))]
    tracker.log_generation(stats, members)
    tracker.log_generation(stats, members)  # the retry
    client = mlflow.MlflowClient(cfg.tracking.uri)
    assert len(client.get_metric_history(tracker.parent_id, "best_fitness")) == 1
    assert len(client.get_metric_history(tracker.child_ids[1], "hp.lr")) == 1
    assert log_run_end_task.retries == 0
