"""Trust: every child draws its own randomness, and the maths a review found biased stays fixed (GRPO's
sampling temperature, Adam moments over a width mutation, PPO's minibatches and log std, masked team actions)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agilerl_core.experiment import build_evolution
from tests.conftest import learn_alone, ppo_learn_alone, tiny_config


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
    batches = [evo.arena.buffer.sample(a.hp.batch_size, None, a.torch_gen) for a in members]
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
    import agilerl_core.llm.grpo as grpo_module
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
        learn_alone(agent, batch)
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
    learn_alone(agent, batch)  # and it still steps


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
    stats = ppo_learn_alone(agent, _Flat(data), 50, adv, ret)
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
    from tests.test_group_teams import team

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
    learn_alone(agent, batch)
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
