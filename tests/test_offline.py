"""Offline learning: the CQL penalties and behaviour cloning on hand-built batches, the HDF5 and Minari
datasets (round trips and every bad-input error), the S3 cache (SeaweedFS), and the offline flow end to
end through the CLI against the real stack."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest
import torch
from gymnasium import spaces

from agilerl_core.algorithms.acting import Acting
from agilerl_core.algorithms.bc import BC
from agilerl_core.algorithms.cql import CQL, CQN, discrete_penalty, sampled_logsumexp
from agilerl_core.algorithms.group import StackedRows
from agilerl_core.algorithms.hyperparameters.bc import BCHyperparameters
from agilerl_core.algorithms.hyperparameters.cql import CQLHyperparameters, CQNHyperparameters
from agilerl_core.buffers.replay import Transition
from agilerl_core.config import NetworkConfig
from agilerl_core.data.collect import collect_episodes, write_dataset
from agilerl_core.data.fetch import resolve_dataset
from agilerl_core.data.hdf5 import read_hdf5, write_hdf5
from agilerl_core.data.loader import check_fits, dataset_buffer, load_dataset
from agilerl_core.data.minari_format import read_minari
from agilerl_core.data.transitions import from_episodes
from agilerl_core.envs.spaces import ActionSpec, ObsSpec
from agilerl_core.errors import DatasetError
from agilerl_core.io.storage import S3Options
from agilerl_core.networks.evolvable import initial_arch
from tests.conftest import greedy, learn_alone, tiny_config

OBS4 = ObsSpec(spaces.Box(-10, 10, (4,), np.float32))


def _agent(cls, hp, action, seed=0):
    spec = action if isinstance(action, ActionSpec) else ActionSpec("discrete", action)
    arch = initial_arch(OBS4, spec.dim, NetworkConfig(hidden_sizes=[32, 32], min_nodes=8))
    return cls(OBS4, spec, arch, hp, seed)


def _batch(obs, action, reward=None, next_obs=None, terminated=None):
    n = obs.shape[0]
    return Transition({"obs": obs}, action, torch.zeros(n) if reward is None else reward,
                      {"obs": obs if next_obs is None else next_obs}, torch.zeros(n) if terminated is None else terminated)


# ---- loss maths -----------------------------------------------------------------------------------------
def test_discrete_cql_penalty_on_a_hand_built_batch():
    q = torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, -1.0]])
    action = torch.tensor([1, 0, 1])
    want = torch.tensor([math.log(math.e + math.e ** 2) - 2.0, math.log(2.0), math.log(math.e ** 3 + math.e ** -1) + 1.0])
    assert torch.allclose(discrete_penalty(q, action), want)


def test_cqn_loss_is_the_td_loss_plus_alpha_times_the_penalty():
    agent = _agent(CQN, CQNHyperparameters(cql_alpha=2.5, gamma=0.9), 3)
    g = torch.Generator().manual_seed(1)
    obs, nxt = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    batch = _batch(obs, torch.randint(0, 3, (8,), generator=g), torch.randn(8, generator=g), nxt,
                   (torch.rand(8, generator=g) < 0.3).float())
    per, signal = (x[0] for x in agent.group([agent]).sample_losses(batch, 1))  # a member alone: K = 1
    with torch.no_grad():
        q, q_next_online = agent.networks["q"]({"obs": obs}), agent.networks["q"]({"obs": nxt})
        q_next_target = agent.networks["q_target"]({"obs": nxt})
        best = q_next_online.argmax(1, keepdim=True)  # double DQN
        target = batch.reward + 0.9 * (1 - batch.terminated) * q_next_target.gather(1, best).squeeze(1)
        q_taken = q.gather(1, batch.action.unsqueeze(1)).squeeze(1)
        want = (q_taken - target).square() + 2.5 * (torch.logsumexp(q, 1) - q_taken)
    assert torch.allclose(per, want, atol=1e-6) and torch.allclose(signal, (q_taken - target).abs(), atol=1e-6)


def test_sampled_logsumexp_is_the_importance_weighted_estimate():
    q = torch.tensor([[0.5, 1.5, -1.0, 2.0]])
    dens = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.5), math.log(2.0)]])
    want = math.log(np.mean([math.exp(0.5) / 0.5, math.exp(1.5) / 0.25, math.exp(-1.0) / 0.5, math.exp(2.0) / 2.0]))
    assert sampled_logsumexp(q, dens).item() == pytest.approx(want, rel=1e-6)


def test_cql_critic_ranks_dataset_actions_above_unseen_ones():
    """Every dataset action is +0.5 with reward 0: without the penalty nothing separates actions; with it,
    Q at the dataset's action ends above Q at actions the data never took."""
    box = ActionSpec("box", 1, (-2.0,), (2.0,), (1,))
    agent = _agent(CQL, CQLHyperparameters(cql_alpha=5.0, batch_size=64, cql_n_actions=4), box)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        obs = torch.randn(64, 4, generator=g)
        loss = learn_alone(agent, _batch(obs, torch.full((64, 1), 0.5), next_obs=torch.randn(64, 4, generator=g)))
        assert torch.isfinite(loss)
    obs = torch.randn(32, 4, generator=g)
    with torch.no_grad():
        critic = agent.networks["critic_1"]
        seen = critic({"obs": obs}, torch.full((32, 1), 0.5)).squeeze(1)
        unseen = critic({"obs": obs}, torch.full((32, 1), -0.9)).squeeze(1)
    assert (seen > unseen).all() and (seen - unseen).mean() > 0.3


@pytest.mark.parametrize("k", [1, 2])
def test_cql_penalty_matches_its_definition_for_given_samples(k):
    box = ActionSpec("box", 2, (-1.0, -1.0), (1.0, 1.0), (2,))
    members = [_agent(CQL, CQLHyperparameters(cql_n_actions=3), box) for _ in range(k)]
    for i, m in enumerate(members):
        m.reseed(i)
        with torch.no_grad():
            for p in m.networks["critic_1"].parameters():
                p.add_(0.1 * i)
    g = torch.Generator().manual_seed(2)
    parts = [_batch(torch.randn(5, 4, generator=g), torch.rand(5, 2, generator=g) * 2 - 1,
                    next_obs=torch.randn(5, 4, generator=g)) for _ in members]
    batch = Transition({"obs": torch.cat([p.obs["obs"] for p in parts])}, torch.cat([p.action for p in parts]),
                       torch.cat([p.reward for p in parts]), {"obs": torch.cat([p.next_obs["obs"] for p in parts])},
                       torch.cat([p.terminated for p in parts]))
    group = CQL.group(members)
    rows = StackedRows([torch.arange(i * 5, i * 5 + 5) for i in range(k)], torch.device("cpu"))
    sampled = group.penalty_actions(batch, rows, [True] * k)
    obs_rep, actions, dens = sampled
    assert obs_rep["obs"].shape == (k * 15, 4) and actions[0].shape == (k, 15, 2) and dens.shape == (k, 5, 9)
    assert torch.allclose(dens[..., :3], torch.full((k, 5, 3), 2 * math.log(0.5)))
    with torch.no_grad():
        got = group.penalty("critic_1", batch, rows, sampled)
        for m, (agent, part) in enumerate(zip(members, parts, strict=True)):
            per_state = []
            for i in range(5):
                idx = slice(15 * m + 3 * i, 15 * m + 3 * i + 3)
                critic = agent.networks["critic_1"]  # the member's own network: a reference beside the group's
                q = torch.cat([critic({"obs": obs_rep["obs"][idx]}, a[m, 3 * i: 3 * i + 3]).squeeze(1)
                               for a in actions])
                per_state.append(torch.logsumexp(q - dens[m, i], 0) - math.log(9) -
                                 critic({"obs": part.obs["obs"][i:i + 1]}, part.action[i:i + 1])[0, 0])
            assert got[m].item() == pytest.approx(torch.stack(per_state).mean().item(), rel=1e-5)


def test_behaviour_cloning_learns_the_data_policy():
    g = torch.Generator().manual_seed(0)
    disc = _agent(BC, BCHyperparameters(lr=3e-3), 2)
    box = _agent(BC, BCHyperparameters(lr=3e-3), ActionSpec("box", 1, (-2.0,), (2.0,), (1,)))
    for _ in range(300):
        obs = torch.randn(64, 4, generator=g)
        learn_alone(disc, _batch(obs, (obs[:, 0] > 0).long()))
        learn_alone(box, _batch(obs, torch.tanh(obs[:, 1:2])))
    obs = torch.randn(200, 4, generator=g)
    acc = (torch.as_tensor(greedy(disc, {"obs": obs})) == (obs[:, 0] > 0).long()).float().mean()
    err = (torch.as_tensor(greedy(box, {"obs": obs})) - torch.tanh(obs[:, 1:2])).abs().mean()
    assert acc > 0.95 and err < 0.1
    assert np.allclose(Acting(box).env_action({"obs": obs[:3]}), 2 * greedy(box, {"obs": obs[:3]}))  # env scale


# ---- datasets -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def episodes():
    return collect_episodes("CartPole-v1", "random", 12, seed=3)


def test_hdf5_round_trip_and_episode_statistics(tmp_path, episodes):
    t = from_episodes(episodes)
    write_hdf5(tmp_path / "d.hdf5", t, {"env_id": "CartPole-v1"})
    back, attrs = read_hdf5(tmp_path / "d.hdf5")
    for f in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
        assert np.array_equal(getattr(back, f), getattr(t, f)), f
    assert attrs["env_id"] == "CartPole-v1"
    assert np.allclose(back.episode_returns(), [e["rewards"].sum() for e in episodes])
    ds = load_dataset(str(tmp_path / "d.hdf5"))
    assert ds.describe()["episodes"] == 12 and ds.format == "hdf5"
    buf = dataset_buffer(ds.transitions, OBS4, ActionSpec("discrete", 2))
    assert buf.size == len(t) and torch.equal(buf.committed()["obs.obs"], torch.as_tensor(t.observations))
    # the collector's episodes are the env's: replaying the actions reproduces every observation
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    e = episodes[0]
    env.reset(seed=None)
    env.unwrapped.state = e["observations"][0].astype(np.float64)
    for a, o in zip(e["actions"], e["observations"][1:], strict=True):
        assert np.allclose(env.step(int(a))[0], o, atol=1e-6)


def test_hdf5_without_next_observations_follows_episodes(tmp_path):
    obs = np.arange(12, dtype=np.float32).reshape(6, 2)
    with h5py.File(tmp_path / "d4rl.hdf5", "w") as f:
        f["observations"] = obs
        f["actions"] = np.zeros(6, np.int64)
        f["rewards"] = np.ones(6, np.float32)
        f["terminals"] = np.array([0, 1, 0, 0, 0, 0], bool)  # episode 1 ends by termination at row 1
        f["timeouts"] = np.array([0, 0, 0, 1, 0, 0], bool)  # episode 2 is cut at row 3; row 5 is unfinished
    t, _ = read_hdf5(tmp_path / "d4rl.hdf5")
    # row 3 (a timeout: its successor is unknown) and row 5 (the last, unfinished) are dropped
    assert np.array_equal(t.observations, obs[[0, 1, 2, 4]])
    assert np.array_equal(t.next_observations, obs[[1, 1, 3, 5]])
    assert t.terminals.tolist() == [False, True, False, False]
    assert t.episode_returns().tolist() == [2.0, 1.0]  # the cut episode ends at row 2


def test_minari_round_trip_with_minari_itself(tmp_path, episodes, monkeypatch):
    minari = pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    where = write_dataset("minari:agilerl-test/cartpole-v0", episodes, "CartPole-v1", "random", fmt="minari")
    ds = load_dataset("minari:agilerl-test/cartpole-v0")
    t = from_episodes(episodes)
    assert ds.format == "minari" and ds.info["env_id"] == "CartPole-v1"
    for f in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
        assert np.array_equal(getattr(ds.transitions, f), getattr(t, f)), f
    loaded = minari.load_dataset("agilerl-test/cartpole-v0")  # Minari reads what we wrote
    assert loaded.total_episodes == 12 and loaded.total_steps == len(t)
    first = next(loaded.iterate_episodes())
    assert np.array_equal(first.observations, episodes[0]["observations"])
    # a plain directory works too, and its hash covers every file
    out = write_dataset(str(tmp_path / "plain"), episodes, "CartPole-v1", "random", fmt="minari")
    assert read_minari(out)[0].rewards.shape == t.rewards.shape
    before = load_dataset(out).sha256
    meta = __import__("pathlib").Path(out) / "data" / "metadata.json"
    meta.write_text(meta.read_text() + " ")
    assert load_dataset(out).sha256 != before and where.endswith("agilerl-test/cartpole-v0")


def _h5(path, **arrays):
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f[k] = v
    return str(path)


def test_bad_datasets_name_the_key_and_the_fix(tmp_path, episodes):
    n = 5
    ok = {"observations": np.zeros((n, 4), np.float32), "actions": np.zeros(n, np.int64),
          "rewards": np.zeros(n, np.float32), "terminals": np.zeros(n, bool)}
    with pytest.raises(DatasetError, match=r"missing key\(s\) \['terminals'\]"):
        read_hdf5(_h5(tmp_path / "a.hdf5", **{k: v for k, v in ok.items() if k != "terminals"}))
    with pytest.raises(DatasetError, match="key 'rewards' has 4 rows but 'observations' has 5"):
        read_hdf5(_h5(tmp_path / "b.hdf5", **{**ok, "rewards": np.zeros(4, np.float32)}))
    with pytest.raises(DatasetError, match="does not exist; record a dataset"):
        load_dataset(str(tmp_path / "missing.hdf5"))
    good = write_hdf5(tmp_path / "good.hdf5", from_episodes(episodes))
    data = good.read_bytes()
    (tmp_path / "cut.hdf5").write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match="truncated"):
        load_dataset(str(tmp_path / "cut.hdf5"))
    cartpole = spaces.Box(-5, 5, (4,), np.float32), spaces.Discrete(2)
    pendulum = collect_episodes("Pendulum-v1", "random", 1, seed=0)
    wrong = load_dataset(str(write_hdf5(tmp_path / "p.hdf5", from_episodes(pendulum),
                                        {"env_id": "Pendulum-v1"})))
    with pytest.raises(DatasetError, match=r"key 'observations' holds observations of shape \(3,\), but "
                                           r"CartPole-v1 observes \(4,\) \(it was recorded on Pendulum-v1\)"):
        check_fits(wrong, "CartPole-v1", *cartpole)
    bad_actions = load_dataset(_h5(tmp_path / "c.hdf5", **{**ok, "actions": np.array([0, 1, 2, 1, 0])}))
    with pytest.raises(DatasetError, match=r"key 'actions' ranges over \[0, 2\], but CartPole-v1 has 2 actions"):
        check_fits(bad_actions, "CartPole-v1", *cartpole)
    # through a config: refused before any work, and a pinned hash guards against other data
    with pytest.raises(DatasetError, match="key 'observations'"):
        from agilerl_core.experiment import build_evolution

        build_evolution(tiny_config(kind="offline", algorithm="cqn", **{"dataset.uri": str(tmp_path / "p.hdf5")}))
    with pytest.raises(DatasetError, match="differs from dataset.sha256"):
        build_evolution(tiny_config(kind="offline", algorithm="cqn", **{"dataset.uri": str(good), "dataset.sha256": "0" * 64}))


# ---- S3 -------------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_s3_dataset_is_downloaded_once_then_served_from_the_verified_cache(s3, tmp_path, episodes):
    c = s3.credentials()
    opts = S3Options(s3.s3_url, None, c["access_key_id"], c["secret_access_key"])
    write_dataset("s3://agilerl/datasets/cartpole.hdf5", episodes, "CartPole-v1", "random", s3=opts)
    cache = str(tmp_path / "cache")
    first = resolve_dataset("s3://agilerl/datasets/cartpole.hdf5", opts, cache)
    assert first.downloaded and first.path.is_file()
    again = resolve_dataset("s3://agilerl/datasets/cartpole.hdf5", opts, cache)
    assert not again.downloaded and again.path == first.path and again.sha256 == first.sha256
    data = bytearray(first.path.read_bytes())  # damage the cached copy (same size): detected, fetched again
    data[len(data) // 2] ^= 0xFF
    first.path.write_bytes(bytes(data))
    healed = resolve_dataset("s3://agilerl/datasets/cartpole.hdf5", opts, cache)
    assert healed.downloaded and healed.sha256 == first.sha256
    assert np.array_equal(load_dataset("s3://agilerl/datasets/cartpole.hdf5", s3=opts, cache_dir=cache)
                          .transitions.actions, from_episodes(episodes).actions)
    # a changed object is fetched again; a Minari directory travels as a prefix
    write_dataset("s3://agilerl/datasets/cartpole.hdf5", episodes[:5], "CartPole-v1", "random", s3=opts)
    changed = resolve_dataset("s3://agilerl/datasets/cartpole.hdf5", opts, cache)
    assert changed.downloaded and changed.sha256 != first.sha256
    write_dataset("s3://agilerl/datasets/cartpole-minari", episodes, "CartPole-v1", "random", fmt="minari", s3=opts)
    ds = load_dataset("s3://agilerl/datasets/cartpole-minari", s3=opts, cache_dir=cache)
    assert ds.format == "minari" and len(ds.transitions) == len(from_episodes(episodes))
    assert not resolve_dataset("s3://agilerl/datasets/cartpole-minari", opts, cache).downloaded
    with pytest.raises(DatasetError, match="nothing stored there"):
        resolve_dataset("s3://agilerl/datasets/absent.hdf5", opts, cache)


# ---- the offline flow -----------------------------------------------------------------------------------
OFFLINE = """\
name: offline-test
kind: offline
env_id: CartPole-v1
algorithm: cqn
dataset: {{uri: {uri}}}
population_size: 3
evo_steps: 60
eval_episodes: 2
max_env_steps: 360
seed: 4
hyperparameters: {{batch_size: 32}}
network: {{hidden_sizes: [32, 32], min_nodes: 8}}
"""


@pytest.mark.integration
def test_offline_flow_end_to_end_through_the_cli(servers, tmp_path, episodes):
    from mlflow.tracking import MlflowClient

    from tests.test_pipeline import _cli, _env, _summary

    env = _env(servers, tmp_path, AGILERL_DATASET_CACHE=str(tmp_path / "cache"))
    c = servers.credentials()
    opts = S3Options(servers.s3_url, None, c["access_key_id"], c["secret_access_key"])
    write_dataset("s3://agilerl/datasets/flow.hdf5", episodes, "CartPole-v1", "random", s3=opts)
    cfg = tmp_path / "offline.yaml"
    cfg.write_text(OFFLINE.format(uri="s3://agilerl/datasets/flow.hdf5"))
    s = _summary(_cli("run", str(cfg), "--run-id", "offline-run", "--no-progress", env=env, cwd=tmp_path))
    assert s["generations"] == 2 and s["global_steps"] == 360 and s["elite_uri"].startswith("s3://")
    local = _summary(_cli("run", str(cfg), "--local", "--no-progress", "--run-dir", str(tmp_path / "local"),
                          env=env, cwd=tmp_path))
    assert local["best_fitness"] == s["best_fitness"]  # the flow gives the in-process loop's result

    sha = load_dataset("s3://agilerl/datasets/flow.hdf5", s3=opts, cache_dir=str(tmp_path / "cache")).sha256
    run = MlflowClient(servers.mlflow_url).get_run(s["mlflow_run_id"])
    assert run.data.params["dataset.uri"] == "s3://agilerl/datasets/flow.hdf5"
    assert run.data.params["dataset.sha256"] == sha and run.data.params["dataset.episodes"] == "12"
    assert run.data.params["algorithm"] == "cqn"
    inputs = run.inputs.dataset_inputs
    assert len(inputs) == 1 and inputs[0].dataset.digest == sha[:32]
    assert json.loads(inputs[0].dataset.source)["uri"] == "s3://agilerl/datasets/flow.hdf5"

    # the run's record pins the data: resuming after the dataset changed is refused, naming the field
    write_dataset("s3://agilerl/datasets/flow.hdf5", episodes[:4], "CartPole-v1", "random", s3=opts)
    p = _cli("resume", "offline-run", "--no-progress", env=env, cwd=tmp_path)
    assert p.returncode == 2 and "differs from dataset.sha256" in p.stderr

    # the dataset tool: collect from the run's elite, then info
    elite_dir = tmp_path / "local" / "elite"
    out = tmp_path / "from-elite.hdf5"
    col = _summary(_cli("dataset", "collect", "--env", "CartPole-v1", "--policy", str(elite_dir), "--episodes", "3",
                        "--out", str(out), "--no-progress", env=env, cwd=tmp_path))
    assert col["episodes"] == 3 and col["out"] == str(out)
    info = _summary(_cli("dataset", "info", str(out), env=env, cwd=tmp_path))
    assert info["sha256"] == col["sha256"] and info["observation_shape"] == [4]
    bad = _cli("dataset", "info", str(tmp_path / "nope.hdf5"), env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
