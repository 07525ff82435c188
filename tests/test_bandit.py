"""Contextual bandits (kind: bandit): the arm inputs, NeuralUCB's and NeuralTS's confidence width and its update
against per-sample autograd (one member and a padded group), a member's pulls alone and in a group, the arena
on a bundled table (learning, regret, the held-out fitness, a checkpoint as data), a bandit env of your own,
the tables' readers and every bad input named."""

from __future__ import annotations

from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch

from agilerl_core.algorithms.neural_bandit import NeuralTS, NeuralUCB, arm_inputs
from agilerl_core.arenas import build_arena
from agilerl_core.arenas.bandit import SPLIT_SEED
from agilerl_core.data.tables import BanditSplit, load_table, write_table
from agilerl_core.errors import ConfigError, DatasetError
from agilerl_core.experiment import build_evolution, train_local
from tasks.config import validate_config
from tests.conftest import greedy


def bandit_config(**over):
    data = {"kind": "bandit", "name": "bandit-test", "algorithm": "neural_ucb", "data": {"source": "sklearn:iris"},
            "population_size": 3, "num_envs": 4, "evo_steps": 200, "max_env_steps": 1200,
            "hyperparameters": {"batch_size": 16, "learning_delay": 16}, "network": {"hidden_sizes": [8, 6],
                                                                                   "min_nodes": 2}}
    data.update(over)
    return validate_config(data)


class CueBandit(gym.Env):
    """A bandit env of one's own: the context's sign picks the paying arm of two."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._x = np.zeros(2, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._x = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self._x, {}

    def step(self, action):
        reward = float(int(action) == int(self._x[0] > 0))
        self._x = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self._x, reward, False, False, {}


def test_arm_inputs_pair_each_context_with_each_arm_in_both_layouts():
    ctx = torch.tensor([[[1.0, 2.0]]])
    arms = torch.eye(3).expand(1, 1, 3, 3)
    assert arm_inputs(ctx, arms, "one_hot")[0].tolist() == [[1, 2, 1, 0, 0], [1, 2, 0, 1, 0], [1, 2, 0, 0, 1]]
    assert arm_inputs(ctx, arms, "block")[0].tolist() == [[1, 2, 0, 0, 0, 0], [0, 0, 1, 2, 0, 0], [0, 0, 0, 0, 1, 2]]


def _members(arena, widths, lambs, seed=0):
    """Members of `arena`'s algorithm with the hidden widths given (a padded group when they differ), random
    non-negative S and their own lambda."""
    out = []
    for i, (hidden, lamb) in enumerate(zip(widths, lambs, strict=True)):
        arch = replace(arena.arch, mlp=replace(arena.arch.mlp, hidden=tuple(hidden)))
        m = arena.algo_cls(arena.obs_spec, arena.action_spec, arch, arena.cfg.hyperparameters, seed + i)
        m.set_hyperparameter("lamb", lamb)
        m.sq_grads = torch.rand(m.sq_grads.shape, generator=torch.Generator().manual_seed(i)) * 3
        out.append(m)
    return out


def _per_sample_sq_grads(member, inputs):
    """g * g [M, P] of the member's own network output at each input row (autograd, one row at a time)."""
    net = member.networks["value"]
    rows = []
    for x in inputs:
        net.zero_grad()
        net({"obs": x[None]}).sum().backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]).square())
    return torch.stack(rows)


@pytest.mark.parametrize("layout", ["one_hot", "block"])
@pytest.mark.parametrize("widths", [[(8, 6)], [(8, 6), (5, 6), (8, 3)]])
def test_the_confidence_width_and_its_update_match_per_sample_autograd(widths, layout):
    """sum_j g_j^2 / (lambda + S_j) per (context, arm), and S += sum of g^2 over the pulled inputs, from the
    batched walk over the layers equal what autograd gives one sample at a time, for one member and for a group
    whose narrower members are zero-padded."""
    arena = build_arena(bandit_config(hyperparameters={"arm_features": layout}))
    members = _members(arena, widths, [0.5, 2.0, 1.0][: len(widths)])
    before = [m.sq_grads.clone() for m in members]
    group = NeuralUCB.group(members)
    ctx = torch.randn(len(members), 5, 4, generator=torch.Generator().manual_seed(7))
    inputs = group.every_arm(ctx)
    f, q = group.gradient_walk(inputs)
    for i, m in enumerate(members):
        g2 = _per_sample_sq_grads(m, inputs[i])
        want = (g2 / (m.hp.lamb + before[i])).sum(1)
        assert torch.allclose(q[i], want, rtol=1e-4), (i, q[i], want)
        assert torch.allclose(f[i], m.networks["value"]({"obs": inputs[i]}).squeeze(-1), atol=1e-5)
    arms = torch.tensor([[0, 2, 1, 1, 0]] * len(members))
    group.gradient_walk(group.pulled(ctx, arms), accumulate=True)
    group.write_back()
    for i, m in enumerate(members):
        want = before[i] + _per_sample_sq_grads(m, group.pulled(ctx, arms)[i]).sum(0)
        assert torch.allclose(m.sq_grads, want, rtol=1e-4, atol=1e-6)


def test_a_learn_step_follows_the_mean_squared_error_gradient_of_the_pulled_arms():
    """The hand-written backward of a learn step equals autograd's gradient of mean (f(x, a) - r)^2 over each
    member's batch, for a padded group."""
    from agilerl_core.algorithms.group import StackedRows
    from agilerl_core.buffers.replay import Transition

    arena = build_arena(bandit_config())
    members = _members(arena, [(8, 6), (5, 6)], [1.0, 1.0])
    gen = torch.Generator().manual_seed(5)
    ctx, arm = torch.randn(2 * 6, 4, generator=gen), torch.randint(0, 3, (2 * 6,), generator=gen)
    reward = torch.randint(0, 2, (2 * 6,), generator=gen).float()
    mean, std = torch.tensor([1.0, -2.0, 0.5, 3.0]), torch.tensor([2.0, 0.5, 1.0, 4.0])
    for m in members:  # the raw contexts a table shows, standardised by each member
        m.set_context_scaling(mean, std)
    want = []
    for i, m in enumerate(members):
        net = m.networks["value"]
        net.zero_grad()
        rows = slice(6 * i, 6 * i + 6)
        x = arm_inputs(((ctx[rows] - mean) / std)[None], torch.eye(3)[arm[rows]][None, :, None], "one_hot")[0]
        ((net({"obs": x}).squeeze(-1) - reward[rows]).square().mean()).backward()
        want.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
    group = NeuralUCB.group(members)
    batch = Transition({"obs": ctx}, arm, reward, {"obs": ctx}, torch.zeros(12))
    group.learn(batch, StackedRows([torch.arange(6), torch.arange(6)], group.device))
    for i, m in enumerate(members):  # the group's gradient, in member i's own layout
        got = group.adam.grad[i]
        own = torch.cat([b.reshape(-1) for b in _own_blocks(got, m, group)])
        assert torch.allclose(own, want[i], atol=1e-6), i


def _own_blocks(row, member, group):
    """Member `member`'s parameters' values in a padded group row `row` (each block's leading corner)."""
    out, i = [], 0
    for p, shape in zip(member.networks["value"].parameters(), group.adam.padded, strict=True):
        n = int(np.prod(shape))
        block = row[i: i + n].view(shape)
        out.append(block[tuple(slice(0, d) for d in p.shape)])
        i += n
    return out


def test_a_pull_narrows_the_width_where_it_was_taken_and_no_bonus_is_greedy():
    arena = build_arena(bandit_config(hyperparameters={"gamma": 0.0}, hp_space={"gamma": None}))
    m, = _members(arena, [(8, 6)], [1.0])
    group = NeuralUCB.group([m])
    ctx = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(1))
    _, sigma0 = group.sigma(ctx)
    arms = group.explore_group({"obs": ctx.view(3, 4)}, None)  # gamma 0: the greedy pulls
    assert torch.equal(arms, group.greedy({"obs": ctx.view(3, 4)}, None))
    _, sigma1 = group.sigma(ctx)
    pulled = torch.nn.functional.one_hot(arms, 3).bool()  # [1, 3 contexts, 3 arms]
    assert bool((sigma1 <= sigma0 + 1e-7).all()) and bool((sigma1[pulled] < sigma0[pulled]).all())


def test_a_members_pulls_and_posterior_do_not_depend_on_its_group():
    arena = build_arena(bandit_config(algorithm="neural_ts"))
    members = _members(arena, [(8, 6)] * 3, [1.0, 0.3, 3.0])
    alone = [m.clone() for m in members]
    obs = {"obs": torch.randn(3 * 4, 4, generator=torch.Generator().manual_seed(3))}
    together = NeuralTS.group(members)
    arms = together.explore_group(obs, None)
    together.write_back()
    for i, a in enumerate(alone):
        one = NeuralTS.group([a])
        assert torch.equal(one.explore_group({"obs": obs["obs"][i * 4: (i + 1) * 4]}, None)[0], arms[i])
        one.write_back()
        assert torch.allclose(a.sq_grads, members[i].sq_grads, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("algorithm", ["neural_ucb", "neural_ts"])
def test_a_population_learns_iris_from_bandit_feedback_and_logs_its_regret(algorithm, tmp_path):
    cfg = bandit_config(algorithm=algorithm, population_size=2, evo_steps=1000, max_env_steps=6000,
                        network={"hidden_sizes": [32]}, hyperparameters={"batch_size": 32})
    evo = build_evolution(cfg)
    res = train_local(cfg, progress=False, run_dir=tmp_path / "run", evolution=evo)
    assert res.best_fitness >= 0.9, [h.best_fitness for h in res.history]  # a random policy earns 1/3
    first, last = res.history[0].train_metrics[0], res.history[-1].train_metrics[0]
    assert 0 <= first["regret"] <= 1000 and first["regret"] + first["mean_reward"] * 1000 == pytest.approx(1000)
    assert last["mean_reward"] > first["mean_reward"]
    for h in res.history:  # a member's cumulative regret holds its ancestors' pulls too
        assert all(m["cumulative_regret"] >= m["regret"] for m in h.train_metrics)
    assert all(m["cumulative_regret"] == m["regret"] for m in res.history[0].train_metrics)
    alone = bandit_config(algorithm=algorithm, population_size=1, evo_steps=300, max_env_steps=900)
    line = train_local(alone, progress=False, run_dir=tmp_path / "alone").history  # one lineage: the sum
    assert line[-1].train_metrics[0]["cumulative_regret"] == sum(h.train_metrics[0]["regret"] for h in line)
    # the fitness is the share of held-out rows classified right by greedy pulls
    member = evo.population.members[0].agent
    x, y = evo.arena.split.held_x, evo.arena.split.held_y
    arms = greedy(member, {"obs": torch.as_tensor(x)})
    assert evo.arena.evaluate(member, 0, 0) == pytest.approx(float((arms == y).mean()))


def test_a_bandit_checkpoint_is_data_and_carries_s_and_the_regret(tmp_path):
    import agilerl_core

    cfg = bandit_config(population_size=2, evo_steps=200, max_env_steps=400)
    res = train_local(cfg, progress=False, run_dir=tmp_path / "run")
    policy = agilerl_core.load(tmp_path / "run" / "elite")
    agent = policy.agent
    assert policy.env["bandit"]["classes"] == ["0", "1", "2"] and len(policy.env["bandit"]["feature_std"]) == 4
    assert agent.regret > 0 and float(agent.sq_grads.sum()) > 0
    assert agent.regret == res.best_member.agent.regret
    assert torch.equal(agent.sq_grads, res.best_member.agent.sq_grads)
    tensors, meta = agent.state()
    sq = tensors["extra/sq_grads"]
    for bad in (sq[:-1], -sq - 1, torch.full_like(sq, float("nan"))):  # a wrong shape, negative, not finite
        with pytest.raises(ValueError, match="extra/sq_grads"):
            NeuralUCB.from_state(agent.obs_spec, {**tensors, "extra/sq_grads": bad}, meta)
    std = tensors["extra/ctx_std"]
    for name, bad in (("ctx_std", std[:-1]), ("ctx_std", -std), ("ctx_mean", torch.full_like(std, float("inf")))):
        with pytest.raises(ValueError, match=f"extra/{name}"):
            NeuralUCB.from_state(agent.obs_spec, {**tensors, f"extra/{name}": bad}, meta)
    # the member standardises raw features itself: the elite's accuracy on iris's raw held-out rows is its fitness
    split = BanditSplit.of(load_table("sklearn:iris"), 0.2, SPLIT_SEED)
    assert torch.equal(agent.ctx_std, torch.as_tensor(split.std)) and float(split.held_x.std()) > 1.5  # raw: cm
    assert float((policy.predict(split.held_x) == split.held_y).mean()) == pytest.approx(policy.fitness)


def test_a_table_bandits_policy_names_its_arms_by_the_tables_labels(tmp_path):
    """Text labels become arms in sorted order; the checkpoint and the Policy say which arm is which label, and
    the run's start line names the table."""
    import agilerl_core
    from agilerl_core.api.policy import _check_classes
    from agilerl_core.errors import CheckpointError
    from tasks.artifacts import start_line

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 2)).astype(np.float32)
    names = np.array(["dog", "ant", "cat"])[np.where(x[:, 0] > 0.5, 0, np.where(x[:, 0] < -0.5, 1, 2))]
    path = tmp_path / "pets.csv"
    path.write_text("a,b,kind\n" + "".join(f"{a},{b},{n}\n" for (a, b), n in zip(x, names, strict=True)))
    cfg = bandit_config(data={"source": str(path), "label": "kind"}, population_size=2, evo_steps=200,
                        max_env_steps=400)
    assert f"on the table {path} (label kind: one arm per class)" in start_line(cfg, "r", "/tmp/r", None, None)
    train_local(cfg, progress=False, run_dir=tmp_path / "run")
    policy = agilerl_core.load(tmp_path / "run" / "elite")
    assert policy.classes == ["ant", "cat", "dog"]
    table = load_table(str(path), "kind")  # arm i is the class the run's rows of label classes[i] were scored as
    assert tuple(policy.classes) == table.classes and [table.classes[i] for i in table.labels[:4]] == list(names[:4])
    assert all(policy.classes[int(a)] in names for a in policy.predict(x[:5]))
    assert agilerl_core.load(tmp_path / "run" / "elite").classes == policy.classes  # read back alike
    for bad in (["ant", "cat"], ["ant", "cat", 3], "ant,cat,dog"):  # a tampered record: named, never used
        with pytest.raises(CheckpointError, match="env.bandit.classes"):
            _check_classes({"bandit": {"classes": bad}}, policy.agent, tmp_path / "member.json")

def test_an_architecture_mutation_keeps_s_where_the_weights_stay():
    arena = build_arena(bandit_config())
    m, = _members(arena, [(8, 6)], [1.0])
    old = m._blocks(m.sq_grads)
    old = {k: v.clone() for k, v in old.items()}
    m.apply_architecture(replace(m.arch, mlp=replace(m.arch.mlp, hidden=(10, 6))))
    new = m._blocks(m.sq_grads)
    assert new["mlp.hidden.0.weight"].shape == (10, 7)  # 4 features + 3 arms (one_hot)
    assert torch.equal(new["mlp.hidden.0.weight"][:8], old["mlp.hidden.0.weight"])
    assert float(new["mlp.hidden.0.weight"][8:].abs().sum()) == 0  # new units: no information yet
    assert torch.equal(new["mlp.out.weight"][:, :6], old["mlp.out.weight"])


def test_a_bandit_env_of_ones_own_trains_and_is_judged_per_pull(tmp_path):
    cfg = bandit_config(data=None, env_id="CueBandit-v0", env_entry_point="tests.test_bandit:CueBandit",
                        eval_episodes=4, eval_max_steps=50, population_size=2, evo_steps=400, max_env_steps=1600,
                        network={"hidden_sizes": [16]})
    res = train_local(cfg, progress=False, run_dir=tmp_path / "run")
    assert all(0 <= f <= 1 for h in res.history for f in h.fitnesses)
    assert res.best_fitness >= 0.8  # the sign of one feature, from rewards alone
    assert "regret" not in res.history[-1].train_metrics[0]  # the best arm's reward is not known for it


@pytest.mark.parametrize("suffix", [".csv", ".npz", ".parquet"])
def test_tables_read_back_from_csv_npz_and_parquet(suffix, tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.array([1, 0, 1, 2, 2, 0])
    path = tmp_path / f"t{suffix}"
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"a": x[:, 0], "b": x[:, 1], "label": ["cat", "ant", "cat", "dog", "dog", "ant"]}),
                       path)
    else:
        write_table(path, x, y)
    t = load_table(str(path))
    assert np.array_equal(t.features, x) and t.labels.tolist() == [1, 0, 1, 2, 2, 0] and t.arms == 3
    assert t.sha256 is not None and len(t.sha256) == 64


def _bad_npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize("make, match", [
    (lambda p: write_table(p / "t.csv", np.ones((4, 2)), np.array([0, 0, 0, 0])), "one class only"),
    (lambda p: (p / "t.csv").write_text("a,b,label\n1,x,0\n2,3,1\n"), "column 'b'.*not numbers"),
    (lambda p: (p / "t.csv").write_text("a,label\n1,0\nnan,1\n"), "feature 0 of row 1 is nan"),
    (lambda p: (p / "t.csv").write_text("a,klass\n1,0\n2,1\n"), "data.label: 'label' is not a column"),
    (lambda p: (p / "t.csv").write_text("a,label\n1,0\n2\n"), "line 3 has 1 fields"),
    (lambda p: _bad_npz(p / "t.npz", features=np.array([[1], [2]], dtype=object), label=np.array([0, 1])),
     "Python objects"),
    (lambda p: _bad_npz(p / "t.npz", feats=np.ones((2, 2)), label=np.array([0, 1])), "data.features: 'features'"),
    (lambda p: (p / "t.npz").write_bytes(b"not a zip"), "not a readable NPZ"),
])
def test_a_bad_table_is_refused_naming_the_field_and_the_fix(make, match, tmp_path):
    make(tmp_path)
    path = next(tmp_path.iterdir())
    with pytest.raises(DatasetError, match=match):
        load_table(str(path))


def test_table_sizes_are_checked_against_the_limits_before_reading(tmp_path):
    from agilerl_core import limits

    path = tmp_path / "t.npz"
    np.savez_compressed(path, features=np.zeros((20_000, 64), np.float32), label=np.zeros(20_000))
    with limits.applied({"dataset_bytes": 1_000_000}), pytest.raises(DatasetError, match="dataset_bytes"):
        load_table(str(path))  # 5 MB declared, a few KB stored
    write_table(tmp_path / "t.csv", np.ones((50, 1)), np.arange(50) % 2)
    with limits.applied({"dataset_records": 10}), pytest.raises(DatasetError, match="dataset_records"):
        load_table(str(tmp_path / "t.csv"))


@pytest.mark.parametrize("over, match", [
    ({"env_id": "CartPole-v1"}, "data: give either data"),
    ({"data": None}, "data: give either data"),
    ({"data": {"source": "sklearn:mnist"}}, "not a bundled scikit-learn dataset"),
    ({"data": {"source": "rows.txt"}}, "give a .csv, .parquet or .npz"),
    ({"data": {"source": "sklearn:iris", "held_out": 1.0}}, "held_out"),
    ({"network": {"activation": "elu"}}, "network.activation: the confidence bonus"),
    ({"env_kwargs": {"x": 1}}, "env_kwargs: applies to an env_id bandit"),
    ({"data": None, "env_id": "CartPole-v1"}, "eval_max_steps: a bandit env need never end"),
    ({"algorithm": "dqn"}, "algorithm"),
])
def test_bad_bandit_configs_are_refused_naming_the_field(over, match):
    with pytest.raises(ConfigError, match=match):
        bandit_config(**over)


def test_a_missing_or_irregular_table_is_named_before_any_work(tmp_path):
    import os

    with pytest.raises(DatasetError, match=r"data.source .*missing.csv: file not found"):
        bandit_config(data={"source": str(tmp_path / "missing.csv")}).check_env()
    os.mkfifo(tmp_path / "pipe.csv")
    with pytest.raises(DatasetError, match=r"not a regular file"):
        bandit_config(data={"source": str(tmp_path / "pipe.csv")}).check_env()
    bandit_config().check_env()  # bundled: nothing to check


def test_a_pinned_table_refuses_other_data(tmp_path):
    path = write_table(tmp_path / "t.csv", np.arange(8.0).reshape(4, 2), np.array([0, 1, 0, 1]))
    with pytest.raises(DatasetError, match="differs from data.sha256"):
        build_arena(bandit_config(data={"source": str(path), "sha256": "0" * 64}, population_size=1))
    with pytest.raises(ConfigError, match="data.sha256: sklearn:iris is bundled"):
        build_arena(bandit_config(data={"source": "sklearn:iris", "sha256": "0" * 64}))


# ---- through the flow ------------------------------------------------------------------------------------------
def test_a_bandit_run_through_the_cli_tracks_regret_and_registers_a_champion_that_pulls(tmp_path, cli):
    """Through the CLI and the bandit flow on the embedded default: every member's MLflow run has its fitness,
    pull reward, regret and cumulative regret and its evolving lambda and gamma; the registered champion pulls an
    arm per raw context (the members standardise their own), the loaded elite too, each scoring its fitness on the
    held-out rows. (Resuming: tests/test_tasks.py.)"""
    import mlflow
    import yaml
    from mlflow.tracking import MlflowClient

    import agilerl_core
    from tests.conftest import cli_summary

    cfg = tmp_path / "iris.yaml"
    data = bandit_config(name="iris-flow", population_size=2, evo_steps=300, max_env_steps=1200).model_dump(mode="json")
    cfg.write_text(yaml.safe_dump(data))
    out = cli_summary(cli.run("run", cfg, "--run-id", "bandit", "--storage", tmp_path / "store", "--no-progress",
                              "--set", f"output_dir={tmp_path / 'out'}"))
    assert out["generations"] == 2
    uri = f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("iris-flow").experiment_id
    children = client.search_runs([exp], filter_string=f"tags.`agilerl.parent` = '{out['mlflow_run_id']}'")
    assert len(children) == 2
    for child in children:
        assert {"fitness", "train.mean_reward", "train.regret", "train.cumulative_regret", "hp.gamma",
                "hp.lamb"} <= set(child.data.metrics), sorted(child.data.metrics)
        history = client.get_metric_history(child.info.run_id, "train.cumulative_regret")
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == sorted(m.value for m in history)
    mlflow.set_tracking_uri(uri)
    champion = mlflow.pyfunc.load_model(out["champion_uri"])
    elite = agilerl_core.load(out["elite_uri"])  # the run's elite in its store
    split = BanditSplit.of(load_table("sklearn:iris"), 0.2, SPLIT_SEED)  # the rows the run held out
    assert elite.env["bandit"]["feature_mean"] == pytest.approx(split.mean.tolist())
    assert float((elite.predict(split.held_x) == split.held_y).mean()) == pytest.approx(elite.fitness)
    arms = np.asarray(champion.predict(split.held_x))
    assert arms.shape == (30,) and float((arms == split.held_y).mean()) == pytest.approx(out["champion"]["fitness"])


def test_a_flow_run_parameter_may_not_point_a_bandit_at_other_files(monkeypatch, tmp_path):
    """A deployment's bandit reads its own table; a flow-run parameter naming another file (read with the
    worker's credentials and disk) is refused unless the operator allows it; a bundled dataset names no place."""
    from tasks.trust import check_targets

    monkeypatch.delenv("AGILERL_TRUSTED_URIS", raising=False)
    deployed = bandit_config(data={"source": "s3://team/tables/digits.csv"})
    check_targets(bandit_config(data={"source": "s3://team/tables/digits.csv"}), deployed)
    check_targets(bandit_config(data={"source": "sklearn:wine"}), deployed)
    for elsewhere in ("/home/worker/secrets.csv", "s3://other-bucket/x.parquet"):
        with pytest.raises(ConfigError, match=r"^data\.source: the flow run's config sets .* AGILERL_TRUSTED_URIS"):
            check_targets(bandit_config(data={"source": elsewhere}), deployed)
    with pytest.raises(ConfigError, match=r"^data\.cache_dir: "):
        check_targets(bandit_config(data={"source": "s3://team/tables/digits.csv", "cache_dir": "/tmp/x"}), deployed)
    monkeypatch.setenv("AGILERL_TRUSTED_URIS", "s3://other-bucket/")
    check_targets(bandit_config(data={"source": "s3://other-bucket/x.parquet"}), deployed)


@pytest.mark.integration
def test_a_table_on_s3_is_read_through_the_verified_cache_and_pinned(s3, tmp_path, monkeypatch):
    """data.source s3://...: fetched once into the content-addressed cache (the storage section's endpoint, the
    environment's credentials), the same split as the local file, and pinned by data.sha256."""
    from agilerl_core.io.storage import S3Options, open_storage

    c = s3.credentials()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", c["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", c["secret_access_key"])
    opts = S3Options(s3.s3_url, None, c["access_key_id"], c["secret_access_key"])
    rng = np.random.default_rng(0)
    local = write_table(tmp_path / "cues.npz", rng.standard_normal((40, 3)).astype(np.float32), rng.integers(0, 4, 40))
    open_storage("s3://agilerl/tables", opts).put_bytes("cues.npz", local.read_bytes())
    data = {"source": "s3://agilerl/tables/cues.npz", "cache_dir": str(tmp_path / "cache")}
    over = {"storage": {"endpoint_url": s3.s3_url}, "population_size": 1}
    arena = build_arena(bandit_config(data=data, **over))
    mine = build_arena(bandit_config(data={"source": str(local)}, population_size=1))
    assert np.array_equal(arena.split.held_x, mine.split.held_x) and arena.split.arms == 4
    assert arena.table.sha256 == mine.table.sha256 == arena.env_desc["bandit"]["sha256"]
    cached = list((tmp_path / "cache").rglob("cues.npz"))
    stamp = cached[0].stat().st_mtime_ns
    build_arena(bandit_config(data={**data, "sha256": arena.table.sha256}, **over))
    assert cached[0].stat().st_mtime_ns == stamp  # served from the cache, not fetched again
    with pytest.raises(DatasetError, match=r"^data.source 's3://agilerl/tables/cues.npz': .* differs from data.sha256"):
        build_arena(bandit_config(data={**data, "sha256": "0" * 64}, **over))
