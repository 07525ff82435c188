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

from agilerl_core.algorithms.registry import get_algorithm
from agilerl_core.algorithms.saved import load_member, load_population
from agilerl_core.errors import CheckpointError
from agilerl_core.experiment import build_evolution
from tests.conftest import tiny_config

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
        assert np.array_equal(member.agent.greedy_action(obs), reference.agent.greedy_action(obs))
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
                                algorithms=get_algorithm)
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
    original = evo.population.elite().agent.greedy_action(obs)
    loaded = member.agent.greedy_action(obs)
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


# ---- every child draws its own randomness ---------------------------------------------------------------------
def _clones_of_the_best(seed: int, algorithm: str = "dqn", **extra):
    """A population of 3 evolved once with tournaments of the whole population and no mutation: every new
    member (the elite too) is a clone of the one best member."""
    cfg = tiny_config(seed=seed, algorithm=algorithm, **{"tournament.size": 3, "mutation.no_mutation": 1.0,
                                                         "mutation.architecture": 0.0, "mutation.parameters": 0.0,
                                                         "mutation.rl_hp": 0.0}, **extra)
    evo = build_evolution(cfg)
    evo.population.record_fitness([0.0, 5.0, 1.0])
    evo.evolve()
    assert [m.parent_id for m in evo.population.members] == [1, 1, 1]
    return evo


def _draws(agent) -> tuple:
    return (tuple(agent.np_rng.integers(0, 10**9, 4)), tuple(torch.randint(0, 10**9, (4,), generator=agent.torch_gen)
                                                             .tolist()))


def test_clones_of_one_parent_draw_differently_and_the_same_seed_repeats():
    evo = _clones_of_the_best(0)
    draws = [_draws(m.agent) for m in evo.population.members]
    assert len({d[0] for d in draws}) == 3 and len({d[1] for d in draws}) == 3  # numpy and torch, every member
    again = _clones_of_the_best(0)
    assert [_draws(m.agent) for m in again.population.members] == draws  # deterministic
    other = _clones_of_the_best(1)
    assert [_draws(m.agent) for m in other.population.members] != draws


def test_clones_explore_and_sample_minibatches_differently():
    cfg = tiny_config(seed=0, **{"tournament.size": 3, "mutation.no_mutation": 1.0, "mutation.architecture": 0.0,
                                 "mutation.parameters": 0.0, "mutation.rl_hp": 0.0})
    evo = build_evolution(cfg)
    evo.run_generation()  # fills the shared replay buffer
    for m, f in zip(evo.population.members, [0.0, 5.0, 1.0], strict=True):
        m.fitness_history[-1] = f
    evo.evolve()
    members = [m.agent for m in evo.population.members]
    obs = {"obs": torch.zeros(64, 4)}
    explored = [type(a).group([a]).explore_group(obs, None)[0] for a in members]
    assert len({tuple(x.tolist()) for x in explored}) == 3  # exploration draws of their own
    batches = [a.sample(evo.arena.buffer, None) for a in members]
    assert len({tuple(b.reward.tolist()) + tuple(b.obs["obs"].sum(1).tolist()) for b in batches}) == 3


def test_ippo_team_clones_reseed_every_policy_unit():
    from tests.test_multi_agent import ma_config

    cfg = ma_config(algorithm="ippo", population_size=3, **{"tournament.size": 3, "mutation.no_mutation": 1.0,
                                                            "mutation.architecture": 0.0, "mutation.parameters": 0.0,
                                                            "mutation.rl_hp": 0.0}, hyperparameters={})
    evo = build_evolution(cfg)
    evo.population.record_fitness([0.0, 5.0, 1.0])
    evo.evolve()
    for unit in evo.population.members[0].agent.learners:
        draws = {_draws(m.agent.learners[unit]) for m in evo.population.members}
        assert len(draws) == 3


# ---- maths the review found biased ------------------------------------------------------------------------------
def test_grpo_scores_completions_at_the_sampling_temperature(tmp_path, monkeypatch):
    """completion_logprobs at temperature T is log_softmax(logits / T); a GRPO step scores its ratio, old and
    reference log-probabilities at the temperature it sampled at."""
    import agilerl_core.algorithms.grpo as grpo_module
    from agilerl_core.llm.sampling import completion_logprobs
    from tests.test_llm import llm_config

    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"{a}+{b}=", "answer": "7"} for a in range(10) for b in range(10)]
    (data / "const.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evo = build_evolution(llm_config(data, population_size=1, **{"hyperparameters.temperature": 0.5,
                                                                 "hyperparameters.beta": 0.1,
                                                                 "hyperparameters.update_epochs": 2}))
    member = evo.population.members[0].agent
    ids, mask = member.prompt_batch(member.base.encode(["1+2=", "3+4="], False))
    comp = torch.tensor([[5, 1], [6, 7]])
    cmask = torch.ones_like(comp)
    with torch.no_grad(), member.base.bound(member.adapter) as model:
        logits = model(input_ids=torch.cat([ids, comp], 1), attention_mask=torch.cat([mask, cmask], 1)).logits
        want = torch.log_softmax(logits[:, ids.shape[1] - 1:-1].float() / 0.5, -1).gather(-1, comp[..., None])[..., 0]
        got = completion_logprobs(model, ids, mask, comp, cmask, 0.5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    seen = []
    real = grpo_module.completion_logprobs

    def spy(*args, **kwargs):
        seen.append(args[5] if len(args) > 5 else kwargs.get("temperature", 1.0))
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo_module, "completion_logprobs", spy)
    evo.arena.train_group([member], [0], [0], 32)
    assert seen and set(seen) == {0.5}  # reference, old and new log-probabilities alike


def test_a_width_mutation_keeps_adam_moments_over_the_overlap_and_new_units_start_fresh():
    from dataclasses import replace

    from agilerl_core.buffers.replay import Transition
    from tests.test_dqn import make_dqn

    agent = make_dqn(seed=3, lr=1e-2, hidden=(16, 16))
    obs = {"obs": torch.randn(32, 3)}
    batch = Transition(obs, torch.randint(0, 2, (32,)), torch.randn(32), obs, torch.zeros(32))
    for _ in range(5):
        agent.learn(batch)
    before = agent.optimizers["q"].state_tensors()
    agent.apply_architecture(replace(agent.arch, mlp=replace(agent.arch.mlp, hidden=(24, 16))))
    after = agent.optimizers["q"].state_tensors()
    name = next(k for k in after if k.startswith("m/") and k.endswith("weight") and after[k].shape[0] == 24)
    rest = name[2:]
    for key in ("m", "v", "beta1_pow", "beta2_pow"):
        old, new = before[f"{key}/{rest}"], after[f"{key}/{rest}"]
        assert torch.equal(new[:16, :], old)  # the 16 units that existed keep their moments
        fresh = 1.0 if key.endswith("pow") else 0.0
        assert torch.all(new[16:] == fresh)  # the 8 new ones start as a fresh Adam
    assert torch.any(before[f"m/{rest}"] != 0)
    widened_in = next(k[2:] for k in after if k.startswith("m/") and k.endswith("weight") and after[k].shape[1] == 24)
    old, new = before[f"m/{widened_in}"], after[f"m/{widened_in}"]
    assert torch.equal(new[:, :16], old) and torch.all(new[:, 16:] == 0)
    agent.learn(batch)  # and it still steps


def test_ppo_minibatches_share_the_rows_evenly_and_log_std_is_clipped_with_the_actor(monkeypatch):
    from agilerl_core.algorithms.group_state import StackedAdam
    from agilerl_core.algorithms.optim import FlatAdam
    from agilerl_core.algorithms.ppo import minibatch_bounds
    from tests.test_group import _Flat, ppo, rollout_data

    assert minibatch_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]  # no tail of a few rows
    assert minibatch_bounds(3, 4) == [(0, 1), (1, 2), (2, 3)]
    assert sum(e - s for s, e in minibatch_bounds(50, 4)) == 50
    agent = ppo(0, continuous=True, update_epochs=2, num_minibatches=4, max_grad_norm=0.5)
    data, adv, ret = rollout_data(1, 50, True, False)
    clipped = []
    real = StackedAdam.clip_grad_norm

    def spy(self, max_norm, extra=None):
        clipped.append(extra is not None)
        return real(self, max_norm, extra)

    monkeypatch.setattr(StackedAdam, "clip_grad_norm", spy)
    stats = agent.learn_rollout(_Flat(data), 50, adv, ret)
    assert stats["updates"] == 2 * 4  # before: 50 // 4 = 12 rows a minibatch and a fifth of 2 rows
    assert clipped.count(True) == 8  # the actor's clip counted log_std every time, the critic's did not
    # the joint norm: a module's gradient and an outside one scaled together to max_norm
    net = torch.nn.Linear(2, 1, bias=False)
    from agilerl_core.algorithms.group_state import param_shapes

    opt = StackedAdam([FlatAdam(net, 1e-3)], [param_shapes(net)])
    opt.grad.copy_(torch.tensor([3.0, 0.0]))
    extra = torch.tensor([[4.0]])  # 3-4-5: scaled to norm 1 together
    opt.clip_grad_norm(1.0, extra)
    assert torch.allclose(opt.grad, torch.tensor([0.6, 0.0]), atol=1e-6) and float(extra) == pytest.approx(0.8, abs=1e-6)


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
def test_team_target_and_gumbel_actions_respect_action_masks(algo):
    """A Discrete agent's target action is the best allowed one; with one action allowed its Gumbel-softmax
    sample is that action with no gradient to its actor, alone and in a population-batched group."""
    from gymnasium import spaces as gym_spaces

    from agilerl_core.buffers.replay import MultiAgentBatch
    from agilerl_core.envs.spaces import MultiAgentSpec
    from tests.test_group import team

    spec = MultiAgentSpec.from_spaces(
        ["chooser_0", "pointer_0"],
        {"chooser_0": gym_spaces.Box(-1, 1, (3,), np.float32), "pointer_0": gym_spaces.Box(-1, 1, (2,), np.float32)},
        {"chooser_0": gym_spaces.Discrete(4), "pointer_0": gym_spaces.Box(-1, 1, (1,), np.float32)})
    g = torch.Generator().manual_seed(0)
    b = 32
    only = torch.randint(0, 4, (b,), generator=g)
    one_allowed = torch.nn.functional.one_hot(only, 4).bool()
    obs = {"chooser_0": torch.randn(b, 3, generator=g), "pointer_0": torch.randn(b, 2, generator=g)}
    nxt = {"chooser_0": torch.randn(b, 3, generator=g), "pointer_0": torch.randn(b, 2, generator=g)}
    batch = MultiAgentBatch(obs, {"chooser_0": only, "pointer_0": torch.rand(b, 1, generator=g) * 2 - 1},
                            {a: torch.randn(b, generator=g) for a in spec.agents}, nxt,
                            {a: torch.zeros(b) for a in spec.agents}, {a: torch.ones(b) for a in spec.agents},
                            {"chooser_0": one_allowed}, {"chooser_0": one_allowed})
    agent = team(spec, 1, algo, policy_freq=1, batch_size=b)
    from agilerl_core.algorithms.group import StackedRows

    rows = StackedRows([torch.arange(b)], torch.device("cpu"))
    target = type(agent).group([agent]).next_actions(batch, rows)["chooser_0"]
    assert torch.equal(target.argmax(-1), only)

    def actors(a):
        return {n: [p.detach().clone() for p in a.networks[f"actor.{n}"].parameters()] for n in spec.agents}

    twin = agent.clone()
    before = actors(agent)
    agent.learn(batch)
    after = actors(agent)
    assert all(torch.equal(p, q) for p, q in zip(before["chooser_0"], after["chooser_0"], strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(before["pointer_0"], after["pointer_0"], strict=True))
    # the same in a population-batched group
    group = type(twin).group([twin, twin.clone()])
    buf = _team_rows(spec, batch)
    group.learn_step(buf, [0, 1], [True, True])
    group.write_back()
    moved = actors(group.agents[0])
    assert all(torch.equal(p, q) for p, q in zip(before["chooser_0"], moved["chooser_0"], strict=True))


def _team_rows(spec, batch):
    """A replay buffer holding exactly `batch`'s rows, committed (what a group samples from)."""
    from agilerl_core.buffers.replay import ReplayBuffer, multi_agent_fields

    buf = ReplayBuffer(multi_agent_fields(spec), 64)
    rows = {}
    for field, values in (("obs", batch.obs), ("action", batch.action), ("reward", batch.reward),
                          ("next_obs", batch.next_obs), ("terminated", batch.terminated), ("acted", batch.acted),
                          ("mask", batch.mask), ("next_mask", batch.next_mask)):
        rows.update({f"{field}.{a}": v for a, v in values.items()})
    buf.commit([rows])
    buf.reserve_staging(2, 1)
    return buf


# ---- storage that survives crashes, power loss and a second writer ------------------------------------------------
class _CrashOn:
    """A storage that dies (raises) on the put of one key: the moment a crash would hit."""

    def __init__(self, inner, suffix: str) -> None:
        self.inner, self.suffix = inner, suffix

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put_bytes(self, key: str, data: bytes) -> None:
        if key.endswith(self.suffix):
            raise KeyboardInterrupt(f"crash before {key}")
        self.inner.put_bytes(key, data)


def _elite_round(store_storage, tmp_path):
    from agilerl_core.io.run_store import RunStore

    evo = build_evolution(tiny_config(population_size=2))
    evo.population.record_fitness([1.0, 2.0])
    store = RunStore(store_storage, "elite-run")
    uri = store.save_elite(evo.elite(), evo.arena.env_desc)
    first = store.storage.list("elite-run/elite/")
    assert sorted(k.rsplit("/", 1)[1] for k in first)[0] == "member.json" and len(first) == 2
    evo.population.members[1].agent.networks["q"].mlp.out.bias.data += 1.0  # a different elite next time
    for crash_at in ("weights-", "member.json"):
        crashing = RunStore(_CrashOn(store_storage, "member.json" if crash_at == "member.json" else ".safetensors"),
                            "elite-run")
        with pytest.raises(KeyboardInterrupt):
            crashing.save_elite(evo.elite(), evo.arena.env_desc)
        local = tmp_path / f"check-{crash_at}"
        store.storage.download_dir("elite-run/elite", local)
        member, _ = load_member(local)  # whole: the old elite, never a mix
        assert not torch.equal(member.agent.networks["q"].mlp.out.bias, evo.elite().agent.networks["q"].mlp.out.bias)
    store.save_elite(evo.elite(), evo.arena.env_desc)
    local = tmp_path / "check-new"
    store.storage.download_dir("elite-run/elite", local)
    member, _ = load_member(local)
    assert torch.equal(member.agent.networks["q"].mlp.out.bias, evo.elite().agent.networks["q"].mlp.out.bias)
    assert len(store.storage.list("elite-run/elite/")) == 2  # the old weights are gone once replaced
    return uri


def test_the_elite_is_never_torn_on_local_storage(tmp_path):
    from agilerl_core.io.storage import LocalStorage

    _elite_round(LocalStorage(tmp_path / "store"), tmp_path)


@pytest.mark.integration
def test_the_elite_is_never_torn_on_s3(s3, tmp_path):
    from agilerl_core.io.storage import S3Storage

    _elite_round(S3Storage(f"s3://agilerl/trust-elite-{tmp_path.name}", _s3_opts(s3)), tmp_path)


def test_local_writes_are_fsynced_before_they_are_named(tmp_path, monkeypatch):
    import os

    from agilerl_core.io.storage import LocalStorage

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    st = LocalStorage(tmp_path / "store")
    st.put_bytes("run/generations/000001/MANIFEST.json", b"{}")
    assert any(p.endswith(".MANIFEST.json." + p.rsplit(".", 1)[-1]) or "MANIFEST.json" in p for p in synced)
    assert str(tmp_path / "store" / "run" / "generations" / "000001") in synced  # the directory entry too


def test_dispatched_member_states_are_deleted_once_the_generation_is_committed(tmp_path):
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import LocalStorage

    evo = build_evolution(tiny_config(population_size=2))
    store = RunStore(LocalStorage(tmp_path / "store"), "dispatch-run")
    store.init_run({"name": "x"})
    for slot in (0, 1):
        tensors, meta = evo.population.members[slot].agent.state()
        store.put_member_state(0, slot, "in", tensors, meta)
        store.put_member_state(0, slot, "out", tensors, meta, {"fitness": 1.0})
    assert len(store.storage.list("dispatch-run/generations/000000/dispatch/")) == 8
    evo.population.record_fitness([1.0, 2.0])
    evo.commit(store, [])
    assert store.storage.list("dispatch-run/generations/000000/dispatch/") == []
    assert store.committed_generations() == [0]


def test_a_second_writer_is_refused_naming_the_owner_and_a_stale_lease_is_taken_over(tmp_path):
    import subprocess
    import sys

    from agilerl_core.errors import LeaseError
    from agilerl_core.io.lease import LeaseKeeper, new_lease_owner
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import LocalStorage

    store = RunStore(LocalStorage(tmp_path / "store"), "leased")
    first = LeaseKeeper(store, ttl_s=30).start()
    with pytest.raises(LeaseError, match=r"is being written by .*:\d+:[0-9a-f]{8} \(its last heartbeat"):
        RunStore(LocalStorage(tmp_path / "store"), "leased").acquire_lease(new_lease_owner())
    first.stop()
    assert store.lease() is None  # given up at the end
    # a stale heartbeat (another host's writer that stopped beating) is taken over
    store.acquire_lease("elsewhere:1:abcdef01", ttl_s=60)
    stale = {**store.lease(), "heartbeat": store.lease()["heartbeat"] - 61}  # its last beat, 61 s ago
    store.storage.put_bytes(store.key("LEASE.json"), json.dumps(stale).encode())
    store.acquire_lease("me:2:abcdef02")
    assert store.lease()["owner"] == "me:2:abcdef02"
    # ... and the old writer, beating again, learns it lost the run
    with pytest.raises(LeaseError, match="taken over by me:2:abcdef02"):
        store.heartbeat("elsewhere:1:abcdef01")
    # a writer on this host whose process is gone (kill -9) leaves a lease that is stale at once
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    store.release_lease("me:2:abcdef02")
    store.acquire_lease(f"{socket.gethostname()}:{dead.stdout.strip()}:abcdef03", ttl_s=3600)
    store.acquire_lease("me:3:abcdef04")
    assert store.lease()["owner"] == "me:3:abcdef04"


@pytest.mark.integration
def test_resuming_a_run_while_its_writer_is_alive_is_refused_and_the_writer_goes_on(tmp_path, cli):
    import os
    import signal

    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import open_storage
    from tests.conftest import wait_until

    path, env, storage = _cli_config(cli, tmp_path, name="lease-test", population_size=2, evo_steps=400,
                                     max_env_steps=10_000_000)
    proc = _start_run(path, "busy", storage, env, tmp_path)
    try:
        store = RunStore(open_storage(storage), "busy")
        wait_until(lambda: store.lease() is not None and store.committed_generations(), 240, "the first commit")
        second = cli.run("resume", "busy", "--storage", storage, "--no-progress", cwd=tmp_path, env=env)
        assert second.returncode != 0 and "is being written by" in second.stderr, second.stderr[-2000:]
        assert "Traceback" not in second.stderr
        seen = store.committed_generations()
        wait_until(lambda: store.committed_generations()[-1] > seen[-1], 240, "a commit after the refusal")
        assert set(seen) <= set(store.committed_generations())  # nothing of the live writer's was discarded
        assert proc.poll() is None  # and it is still running
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_fold_is_not_retried_and_folding_twice_changes_nothing(tmp_path):
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import LocalStorage
    from tasks.generation import Evaluation, GenerationJob, fold_generation_task, train_group_task

    assert fold_generation_task.retries == 0  # every task Prefect may retry must be idempotent; this one is not
    cfg = tiny_config(population_size=2)
    evo = build_evolution(cfg)
    store = RunStore(LocalStorage(tmp_path / "store"), "fold-run")
    job = GenerationJob("fold-run", cfg, str(tmp_path / "store"), 0, evo.generation_steps(), "threads")
    evo.begin_generation()
    outputs = [o for g in evo.groups() for o in train_group_task.fn(job, g, "g", evo)]
    evaluations = [Evaluation(f) for f in (1.0, 2.0)]
    refs = fold_generation_task.fn(job, evo, store, outputs, evaluations)
    state = (evo.global_steps, len(evo.history), evo.arena.buffer.size, evo.population.members[0].fitness_history)
    again = fold_generation_task.fn(job, evo, store, outputs, evaluations)
    assert again == refs
    assert (evo.global_steps, len(evo.history), evo.arena.buffer.size,
            evo.population.members[0].fitness_history) == state


@pytest.mark.integration
def test_a_resume_on_another_runner_trains_the_groups_the_run_was_started_with(tmp_path, cli):
    """Started with groups of 2, killed after a commit, continued with `--set runner.group_size=1`: the run
    keeps its pinned groups and ends exactly as the uninterrupted run."""
    import os
    import signal

    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import open_storage
    from tests.conftest import cli_summary, committed_state, wait_for_commit

    path, env, storage = _cli_config(cli, tmp_path, name="pin-test", population_size=4, evo_steps=200,
                                     max_env_steps=4000, runner={"group_size": 2})
    common = ["--storage", storage, "--no-progress"]
    proc = _start_run(path, "crashed", storage, env, tmp_path)
    wait_for_commit(RunStore(open_storage(storage), "crashed"), 1, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = cli_summary(cli.run("run", str(path), "--run-id", "crashed", *common, "--set", "runner.group_size=1",
                                   cwd=tmp_path, env=env))
    straight = cli_summary(cli.run("run", str(path), "--run-id", "straight", *common, cwd=tmp_path, env=env))
    assert resumed["group_sizes"] == straight["group_sizes"] == [2, 2]
    assert committed_state(storage, "crashed") == committed_state(storage, "straight")


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
