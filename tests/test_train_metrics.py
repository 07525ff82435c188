"""Training diagnostics per member (issue 52): the device-side sums and their known answers, every family's phase
filling its members' ``train_metrics``, a member's diagnostics independent of its group, the one-line report."""

from __future__ import annotations

import math

import pytest
import torch

import agilerl_core as ac
from agilerl_core.algorithms.ppo.maths import explained_variance
from agilerl_core.train_metrics import EpisodeTally, MetricSums, headline, per_unit, phase_metrics
from tests.test_group import dqn, filled_buffer


def test_metric_sums_weigh_each_member_by_the_steps_it_took():
    m = MetricSums(3, "cpu")
    m.add(loss=torch.tensor([1.0, 2.0, 3.0]), q=torch.tensor([0.0, 1.0, 2.0]))
    m.add(torch.tensor([True, False, True]), loss=torch.tensor([3.0, 100.0, 5.0]), q=torch.tensor([2.0, 9.0, 4.0]))
    m.add(torch.tensor([False, False, True]), grad_norm=torch.tensor([7.0, 7.0, 0.5]))
    m.last(epsilon=torch.tensor([0.1, 0.2, 0.3]))
    out = m.means()
    assert out[0] == pytest.approx({"loss": 2.0, "q": 1.0, "epsilon": 0.1})
    assert out[1] == pytest.approx({"loss": 2.0, "q": 1.0, "epsilon": 0.2})  # sat the second step out
    assert out[2] == pytest.approx({"loss": 4.0, "q": 3.0, "grad_norm": 0.5, "epsilon": 0.3})
    assert MetricSums(2, "cpu").means() == [{}, {}]
    sampled = MetricSums(1, "cpu", every=3)  # the first step, then every third
    assert [sampled.due() for _ in range(7)] == [True, False, False, True, False, False, True]


def test_episode_tally_counts_returns_and_lengths_per_member():
    tally = EpisodeTally(2, 2, "cpu")
    rewards = torch.ones(2, 2)
    dones = [torch.tensor([[False, False], [False, True]]), torch.tensor([[True, False], [False, False]]),
             torch.tensor([[False, True], [True, True]])]
    for done in dones:
        tally.step(rewards, done)
    count, returns, lengths = tally.read()
    assert count == [2, 3]
    assert returns == [pytest.approx(2.5), pytest.approx(2.0)]  # member 0: episodes of 2 and 3 steps; 1: 3, 1, 2
    assert lengths == returns  # a reward of 1 per step: return = length
    assert EpisodeTally(1, 1, "cpu").read()[1][0] != EpisodeTally(1, 1, "cpu").read()[1][0]  # nan: none ended


def test_explained_variance_known_answers():
    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0]])
    values = torch.stack([ret[0], torch.full((4,), 2.5), torch.zeros(4)])
    ev = explained_variance(values, ret)
    assert ev[0].item() == pytest.approx(1.0) and ev[1].item() == pytest.approx(0.0) and math.isnan(ev[2].item())
    # masked: only the valid rows count (the padding's wild values change nothing)
    valid = torch.tensor([[True, True, True, False]] * 3)
    padded_values = values.clone()
    padded_values[:, 3] = 1e6
    masked = explained_variance(padded_values, ret, valid)
    assert masked[0].item() == pytest.approx(1.0)
    assert masked[1].item() == pytest.approx(1 - ((torch.tensor([1.0, 2, 3]) - 2.5).var(unbiased=False)
                                                  / torch.tensor([1.0, 2, 3]).var(unbiased=False)).item())


def test_phase_metrics_and_headline():
    assert phase_metrics({}, 10, 1.0, float("nan"), loss=0.5)["loss"] == 0.5  # the arena's every-step mean
    assert phase_metrics({"loss": 0.1}, 10, 1.0, float("nan"), loss=0.5)["loss"] == 0.1  # the group's own first
    assert phase_metrics({"loss": 1.0}, 1000, 2.0, float("nan")) == {"loss": 1.0, "env_steps_per_s": 500.0}
    assert phase_metrics({}, 10, 1.0, 12.5)["episode_length"] == 12.5
    assert headline([1.0, 5.0, float("nan")], [{"loss": 9.0}, {"loss": 0.1234, "q": 3.456}, {}]) == \
        "loss 0.123, q 3.46"
    assert headline([2.0], [{"critic_loss": 1.0, "entropy": 0.5}]) == "critic loss 1, entropy 0.5"
    assert headline([float("nan")], [{}]) == "" and headline([1.0], [{}]) == ""
    assert per_unit({"a": [{"loss": 1.0}], "b": [{"loss": 2.0}]}) == [{"loss.a": 1.0, "loss.b": 2.0}]


def test_dqn_step_diagnostics_known_answers_and_independent_of_the_group():
    """A DQN learn step's loss, Q, |TD error| and gradient norm, from the step's own tensors; a member's equal
    alone or in a group (float rounding)."""
    buf = filled_buffer(2)
    solo = [dqn(0, lr=1e-3), dqn(1, lr=3e-3, batch_size=32)]
    alone = []
    for slot, a in enumerate(solo):
        g = type(a).group([a.clone()])
        g.learn_step(buf, [slot], [True])
        alone.append(g.metrics.means()[0])
        assert alone[-1]["grad_norm"] > 0 and alone[-1]["td_error"] > 0
    group = type(solo[0]).group([a.clone() for a in solo])
    group.learn_step(buf, [0, 1], [True, True])
    together = group.metrics.means()
    for a, b in zip(alone, together, strict=True):
        assert a.keys() == b.keys() == {"q", "grad_norm", "td_error"}
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key

    # the gradient norm is the norm of the step's gradient: one member, a batch given by hand, checked by autograd
    member = dqn(3, max_grad_norm=None)
    g = type(member).group([member])
    rows = torch.arange(16)
    batch = buf.transitions(rows)
    expected_q = member.networks["q"](batch.obs).gather(1, batch.action.view(-1, 1)).mean().item()
    g.learn_batch(batch)
    out = g.metrics.means()[0]
    assert out["q"] == pytest.approx(expected_q, rel=1e-5)
    assert out["grad_norm"] == pytest.approx(torch.linalg.vector_norm(g.q.grad).item(), rel=1e-5)


def _short(algo: str, env: str, **extra) -> list[dict]:
    hp = {} if algo in ("ppo", "ippo", "mappo") else {"learning_delay": 64, "batch_size": 32}
    cfg = {"algorithm": algo, "env_id": env, "population_size": 2, "evo_steps": 256, "max_env_steps": 1024,
           "num_envs": 2, "eval_episodes": 1, "hyperparameters": hp, **extra}
    result = ac.evolve(cfg, progress=False)
    return result.history[-1].train_metrics


@pytest.mark.parametrize(("algo", "env", "names"), [
    ("dqn", "CartPole-v1", {"loss", "q", "td_error", "grad_norm", "epsilon"}),
    ("ppo", "CartPole-v1", {"loss", "pg_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
                            "explained_variance", "actor_grad_norm", "critic_grad_norm"}),
    ("td3", "Pendulum-v1", {"loss", "q", "critic_grad_norm", "actor_loss", "actor_grad_norm", "noise_scale"}),
    ("sac", "Pendulum-v1", {"loss", "q", "actor_loss", "entropy", "alpha", "actor_grad_norm"}),
])
def test_every_family_fills_its_members_train_metrics(algo, env, names):
    long = {"evo_steps": 512, "max_env_steps": 2048} if env == "Pendulum-v1" else {}  # an episode ends: 200 steps
    for metrics in _short(algo, env, **long):
        assert names <= metrics.keys(), names - metrics.keys()
        assert {"env_steps_per_s", "episode_length"} <= metrics.keys()
        assert all(math.isfinite(v) for v in metrics.values()), metrics


@pytest.mark.parametrize("algo", ["matd3", "ippo"])
def test_multi_agent_teams_report_per_agent(algo):
    hp = {"learning_delay": 50, "batch_size": 32} if algo == "matd3" else {}
    cfg = {"algorithm": algo, "env_id": "mpe2:simple_speaker_listener_v4", "population_size": 2, "evo_steps": 200,
           "max_env_steps": 800, "num_envs": 2, "eval_episodes": 1, "kind": "multi_agent", "hyperparameters": hp}
    metrics = ac.evolve(cfg, progress=False).history[-1].train_metrics[0]
    agents = ("speaker_0", "listener_0")
    per_agent = {"critic_loss", "q"} if algo == "matd3" else {"loss", "entropy", "approx_kl", "explained_variance"}
    assert {f"{name}.{a}" for name in per_agent for a in agents} <= metrics.keys(), sorted(metrics)
    assert "env_steps_per_s" in metrics and all(math.isfinite(v) for v in metrics.values())


def test_a_budget_too_small_to_evolve_is_named_once_before_training():
    import warnings

    from agilerl_core.config import validate_config

    small = validate_config({"env_id": "CartPole-v1", "population_size": 4, "evo_steps": 5000, "max_env_steps": 20000})
    assert small.planned_generations() == 1
    note = small.budget_note()
    assert "pays for 1 generation" in note and "no selection or mutation" in note
    assert "raise max_env_steps to at least 60,000" in note and "evo_steps to 1,666 or less" in note
    two = validate_config({"env_id": "CartPole-v1", "population_size": 4, "evo_steps": 1000, "max_env_steps": 8000})
    assert "pays for 2 generations" in two.budget_note() and "happen once" in two.budget_note()
    assert validate_config({"env_id": "CartPole-v1", "population_size": 4, "evo_steps": 1000,
                            "max_env_steps": 12000}).budget_note() is None
    cfg = {"algorithm": "dqn", "env_id": "CartPole-v1", "population_size": 2, "evo_steps": 64, "max_env_steps": 128,
           "num_envs": 2, "eval_episodes": 1}
    with pytest.warns(ac.BudgetWarning, match="pays for 1 generation") as caught:
        ac.evolve(cfg, progress=False)
    assert len([w for w in caught if issubclass(w.category, ac.BudgetWarning)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", ac.BudgetWarning)
        ac.evolve({**cfg, "max_env_steps": 384}, progress=False)  # three generations: silent


def test_a_long_phase_marks_a_few_points_each_the_mean_since_the_one_before():
    from agilerl_core.train_metrics import marks

    m = MetricSums(2, "cpu")
    m.add(loss=torch.tensor([1.0, 2.0]))
    m.add(loss=torch.tensor([3.0, 4.0]))
    m.mark([10, 20])
    m.add(torch.tensor([True, False]), loss=torch.tensor([5.0, 100.0]), q=torch.tensor([1.0, 1.0]))
    m.mark([30, 40])
    assert m.points() == [[[10, {"loss": 2.0}], [30, {"loss": 5.0, "q": 1.0}]], [[20, {"loss": 3.0}]]]
    assert MetricSums(1, "cpu").points() == [[]]
    assert marks(100, 8000) == {25, 50, 75, 100} and marks(100, 3999) == set() and marks(3, 9000) == set()


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_a_long_phase_reports_its_points_at_the_members_env_steps(algo):
    hp = {"learning_delay": 256, "batch_size": 32} if algo == "dqn" else {}
    cfg = {"algorithm": algo, "env_id": "CartPole-v1", "population_size": 2, "evo_steps": 4096,
           "max_env_steps": 8192, "num_envs": 4, "eval_episodes": 1, "hyperparameters": hp}
    stats = ac.evolve(cfg, progress=False).history[-1]
    for points in stats.train_metric_points:
        assert [at for at, _ in points] == [1024, 2048, 3072, 4096]
        name = "entropy" if algo == "ppo" else "q"
        assert all(name in values and math.isfinite(values[name]) for _, values in points)
    assert stats.train_metric_points[0][0][1] != stats.train_metric_points[0][-1][1]  # the stretches differ


def test_the_tracker_logs_a_generations_means_and_a_long_phases_points(tmp_path, monkeypatch):
    import mlflow

    from tasks.tracker import Tracker
    from tests.conftest import tiny_config

    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    cfg = tiny_config(population_size=1, **{"tracking.uri": f"sqlite:///{tmp_path / 'm.db'}"})
    tracker = Tracker(cfg, "points-run", str(tmp_path / "runs"))
    stats = {"generation": 1, "best_fitness": 2.0, "mean_fitness": 2.0, "global_steps": 800, "wall_s": 1.0}
    member = {"fitness": 2.0, "param_count": 10, "train_return": 1.0, "member_id": 0, "mutation": "none",
              "architecture": "mlp", "hyperparameters": {}, "train_metrics": {"loss": 0.5, "q": float("nan")},
              "train_points": [[1200, {"loss": 0.7}], [1600, {"loss": 0.3}]]}
    tracker.log_generation(stats, [member])
    client = mlflow.MlflowClient(cfg.tracking.uri)
    child = tracker.child_ids[0]
    assert [(x.step, x.value) for x in client.get_metric_history(child, "train.loss")] == [(1, 0.5)]
    assert client.get_metric_history(child, "train.q") == []  # not a number: not logged
    assert sorted((x.step, x.value) for x in client.get_metric_history(child, "phase.loss")) == [(1200, 0.7),
                                                                                                  (1600, 0.3)]


def test_a_value_that_is_not_a_number_counts_as_not_measured_for_that_member_and_name():
    m = MetricSums(2, "cpu")
    m.add(explained_variance=torch.tensor([0.5, float("nan")]), loss=torch.tensor([1.0, 1.0]))
    m.add(explained_variance=torch.tensor([0.7, 0.9]), loss=torch.tensor([3.0, 3.0]))
    out = m.means()
    assert out[0] == pytest.approx({"explained_variance": 0.6, "loss": 2.0})
    assert out[1] == pytest.approx({"explained_variance": 0.9, "loss": 2.0})  # its nan rollout left out, not all
    only_nan = MetricSums(1, "cpu")
    only_nan.add(explained_variance=torch.tensor([float("nan")]))
    assert only_nan.means() == [{}]
