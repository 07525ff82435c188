"""Known answers, on hand-built batches, for the maths of Rainbow's parts (its losses: test_dqn), TD3 and SAC."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from agilerl_core import rng
from agilerl_core.algorithms.actor_critic import DDPG, SAC, TD3, alpha_loss, squashed_log_prob
from agilerl_core.algorithms.dqn import DQN, categorical_projection
from agilerl_core.algorithms.group import StackedRows
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters
from agilerl_core.algorithms.hyperparameters.sac import SACHyperparameters
from agilerl_core.algorithms.hyperparameters.td3 import DDPGHyperparameters, TD3Hyperparameters
from agilerl_core.buffers.nstep import NStepCollector
from agilerl_core.buffers.prioritized import GroupPriorities, MemberPriorities, SumTree
from agilerl_core.buffers.replay import ReplayBuffer, Transition, n_step_return, transition_fields
from agilerl_core.config import NetworkConfig
from agilerl_core.envs.spaces import ActionSpec, ObsSpec, action_spec
from agilerl_core.networks import initial_arch
from tests.conftest import learn_alone

SPEC = ObsSpec(spaces.Box(-1, 1, (3,), np.float32))
BOX = ActionSpec("box", 1, (-2.0,), (2.0,), (1,))


def _arch(out=2):
    return initial_arch(SPEC, out, NetworkConfig(hidden_sizes=[16, 16], min_nodes=1))


def _constant(agent, net, values):
    """Make `net` output `values` for every input (zero weights, output bias = values)."""
    with torch.no_grad():
        for p in agent.networks[net].parameters():
            p.zero_()
        agent.networks[net].mlp.out.bias.copy_(torch.as_tensor(values, dtype=torch.float32))


def _batch(reward, terminated, action):
    n = len(reward)
    obs = {"obs": torch.zeros(n, 3)}
    return Transition(obs, torch.as_tensor(action), torch.tensor(reward, dtype=torch.float32), obs,
                      torch.tensor(terminated, dtype=torch.float32))


def _returns(out, gamma):
    """(R, gamma^L) of the n-step rows `out` at a learner's `gamma`."""
    batch = Transition({}, out["action"], out["reward"], {}, out["terminated"], None, out["step_rewards"],
                       out["length"])
    r, d = n_step_return(batch, gamma)
    return r.tolist(), d.tolist()


# ---- n-step returns ----------------------------------------------------------------------------------
def _step(t, reward, envs=2):
    return {"obs.obs": torch.full((envs, 1), float(t)), "next_obs.obs": torch.full((envs, 1), float(t + 1)),
            "action": torch.full((envs,), t), "reward": torch.tensor(reward, dtype=torch.float32),
            "terminated": torch.zeros(envs)}


def test_nstep_returns_combine_within_episodes_and_per_env():
    g = 0.5
    c = NStepCollector(num_envs=2, n=3)
    assert c.push(_step(0, [1, 10]), np.array([False, False])) is None
    assert c.push(_step(1, [2, 20]), np.array([False, False])) is None
    out = c.push(_step(2, [4, 40]), np.array([False, True]))  # env 1's episode ends (truncated) at t=2
    # full window for both envs (env 0 by length, env 1 by its end), then env 1's shorter tails
    assert out["obs.obs"][:, 0].tolist() == [0, 0, 1, 2]
    returns, discounts = _returns(out, g)
    assert returns == pytest.approx([1 + g * 2 + g * g * 4, 10 + g * 20 + g * g * 40, 20 + g * 40, 40])
    assert discounts == pytest.approx([g ** 3, g ** 3, g ** 2, g])
    # another member's gamma on the very same stored rows: its own returns and discounts
    assert _returns(out, 0.9)[0] == pytest.approx([1 + 0.9 * 2 + 0.81 * 4, 10 + 0.9 * 20 + 0.81 * 40,
                                                   20 + 0.9 * 40, 40])
    assert _returns(out, 0.9)[1] == pytest.approx([0.9 ** 3, 0.9 ** 3, 0.81, 0.9])
    assert out["next_obs.obs"][:, 0].tolist() == [3, 3, 3, 3]  # every window bootstraps from s_3
    out = c.push(_step(3, [8, 80]), np.array([False, False]))  # env 0: window 1..3; env 1: only 1 pending
    assert out["obs.obs"][:, 0].tolist() == [1] and _returns(out, g)[0] == pytest.approx([2 + g * 4 + g * g * 8])
    tail = c.flush()  # env 0: t=2,3 pending; env 1: t=3
    pairs = sorted(zip(tail["obs.obs"][:, 0].tolist(), _returns(tail, g)[0], strict=True))
    assert [o for o, _ in pairs] == [2, 3, 3]
    assert [r for _, r in pairs] == pytest.approx([4 + g * 8, 8, 80])
    assert c.flush() is None  # nothing pending twice


def test_nstep_terminal_transition_stops_the_return():
    c = NStepCollector(num_envs=1, n=3)
    c.push(_step(0, [1], envs=1), np.array([False]))
    step = _step(1, [5], envs=1)
    step["terminated"] = torch.ones(1)
    out = c.push(step, np.array([True]))
    assert _returns(out, 0.9)[0] == pytest.approx([1 + 0.9 * 5, 5])
    assert out["terminated"].tolist() == [1, 1]


# ---- prioritised replay ------------------------------------------------------------------------------
def test_sum_tree_sampling_follows_priorities():
    tree = SumTree(5)
    tree.update(torch.arange(5), torch.tensor([1.0, 0.0, 2.0, 3.0, 4.0], dtype=torch.float64))
    assert float(tree.total) == 10.0
    mass = torch.tensor([0.0, 0.999, 1.0, 2.99, 3.0, 5.99, 6.0, 9.99], dtype=torch.float64)
    assert tree.find(mass).tolist() == [0, 0, 2, 2, 3, 3, 4, 4]
    draws = tree.find(torch.rand(200_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 10.0)
    freq = torch.bincount(draws, minlength=5).double() / draws.numel()
    assert freq.tolist() == pytest.approx([0.1, 0.0, 0.2, 0.3, 0.4], abs=0.005)
    rebuilt = SumTree(5)
    rebuilt.set_all(tree.leaves.clone())
    assert torch.equal(rebuilt.tree[1:], tree.tree[1:])  # a pure function of the leaves (exact resume)


def _draw(per, buf, slot: int, n: int, beta: float, u: torch.Tensor):
    """One member's stratified draw alone (a group of one) from uniforms `u` [n]."""
    rows, weights, leaves = GroupPriorities([per]).sample_rows(buf, [slot], [n], torch.tensor([beta], dtype=torch.float64),
                                                              u.view(1, -1))
    return rows[0], weights[0], leaves[0]


def _learned(per, leaves: torch.Tensor, errors: torch.Tensor) -> None:
    GroupPriorities([per]).update(leaves.view(1, -1), errors.view(1, -1), [leaves.numel()])


def test_per_weights_and_priority_updates():
    fields = transition_fields(SPEC)
    buf = ReplayBuffer(fields, capacity=4)
    buf.reserve_staging(1, 4)
    buf.extend({k: torch.zeros((4, *f.shape), dtype=f.dtype) for k, f in fields.items()})
    per = MemberPriorities(capacity=4, staging=4, alpha=0.5, eps=0.0)
    per.committed(0, 4)
    _learned(per, torch.arange(4), torch.tensor([1.0, 4.0, 9.0, 16.0]))  # priorities sqrt: 1, 2, 3, 4
    assert float(per.tree.total) == pytest.approx(10.0)
    rows, weight, leaves = _draw(per, buf, 0, 4, 1.0, torch.rand(4, generator=torch.Generator().manual_seed(0),
                                                                  dtype=torch.float64))
    assert rows.tolist() == leaves.tolist()  # committed rows: leaf i is ring row i
    probs = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)[leaves] / 10.0
    expected = (4 * probs) ** -1.0
    assert weight.tolist() == pytest.approx((expected / expected.max()).tolist(), rel=1e-6)
    assert leaves.tolist() == sorted(leaves.tolist())  # stratified: one draw per equal segment of the mass, in order
    _learned(per, torch.tensor([3]), torch.tensor([0.0]))  # a learned transition loses its priority
    assert float(per.tree.leaves[3]) == 0.0 and float(per.max_priority) == pytest.approx(4.0)
    per.committed(3, 1)  # overwritten by a new transition: the largest priority seen
    assert float(per.tree.leaves[3]) == pytest.approx(4.0)


def test_a_groups_prioritised_draw_and_update_are_each_members_own():
    fields = transition_fields(SPEC)
    buf = ReplayBuffer(fields, capacity=40)
    buf.reserve_staging(3, 12)
    buf.extend({k: torch.zeros((30, *f.shape), dtype=f.dtype) for k, f in fields.items()})
    for slot, n in ((0, 12), (1, 5), (2, 8)):
        buf.add(slot, {k: torch.zeros((n, *f.shape), dtype=f.dtype) for k, f in fields.items()})
    g = torch.Generator().manual_seed(0)

    def members():
        out = []
        for alpha in (0.6, 0.5, 0.7):
            per = MemberPriorities(capacity=40, staging=12, alpha=alpha, eps=1e-3)
            per.committed(0, 30)
            _learned(per, torch.arange(30), torch.rand(30, generator=g, dtype=torch.float64) * 3)
            out.append(per)
        return out

    alone, together = members(), members()
    for a, b in zip(alone, together, strict=True):
        b.tree.set_all(a.tree.leaves.clone())
        b.max_priority = a.max_priority.clone()
    group = GroupPriorities(together)
    sizes, betas = [6, 0, 4], [0.4, 0.5, 1.0]  # member 1 sits this step out; batch sizes differ
    for step in range(3):
        u = torch.rand(3, 6, generator=torch.Generator().manual_seed(step), dtype=torch.float64)
        rows, weights, leaves = group.sample_rows(buf, [0, 1, 2], sizes, torch.tensor(betas, dtype=torch.float64), u)
        for i, n in enumerate(sizes):
            if not n:
                continue
            r, w, lv = _draw(alone[i], buf, i, n, betas[i], u[i, :n])
            assert rows[i, :n].tolist() == r.tolist() and leaves[i, :n].tolist() == lv.tolist()
            torch.testing.assert_close(weights[i, :n], w, rtol=1e-6, atol=0)
            assert not weights[i, n:].any()
        errors = torch.rand(3, 6, generator=g) * 2
        group.update(leaves, errors, sizes)
        for i, n in enumerate(sizes):
            if n:
                _learned(alone[i], leaves[i, :n], errors[i, :n])
    for a, b in zip(alone, together, strict=True):
        assert torch.equal(a.tree.tree[1:], b.tree.tree[1:]) and torch.equal(a.max_priority, b.max_priority)


# ---- C51 ---------------------------------------------------------------------------------------------
def test_categorical_projection_known_answers():
    support = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])
    p = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0],   # all mass on z=1
                      [0.0, 0.0, 0.0, 0.0, 1.0],   # all mass on z=4
                      [0.2, 0.2, 0.2, 0.2, 0.2]])
    reward = torch.tensor([0.5, 1.0, 10.0])
    discount = torch.tensor([1.0, 0.5, 0.0])
    m = categorical_projection(p, reward, discount, support)
    assert m[0].tolist() == pytest.approx([0, 0.5, 0.5, 0, 0])  # 0.5 + 1 = 1.5: split between atoms 1 and 2
    assert m[1].tolist() == pytest.approx([0, 0, 0, 1.0, 0])  # 1 + 0.5 * 4 = 3: exactly on an atom
    assert m[2].tolist() == pytest.approx([0, 0, 0, 0, 1.0])  # terminal (discount 0): r clipped to v_max
    assert m.sum(dim=1).tolist() == pytest.approx([1, 1, 1])


def test_dueling_and_noisy_heads_mutate_with_the_network():
    hp = DQNHyperparameters(dueling=True, noisy=True, distributional=True, num_atoms=5, v_min=0, v_max=4)
    agent = DQN(SPEC, 2, _arch(), hp, 0)
    mlp = agent.networks["q"].mlp
    assert mlp.spec.dueling == 5 and mlp.value is not None and mlp.noisy_layers()
    obs = {"obs": torch.randn(4, 3)}

    def q_values():  # the greedy Q(s, .) of a group of one (noisy layers at their means)
        group = DQN.group([agent])
        group.online.noise_off()
        return group.q_values(group.online(obs))[0]

    before = q_values()
    from dataclasses import replace
    arch = replace(agent.arch, mlp=replace(agent.arch.mlp, hidden=(16, 16, 16)))
    agent.apply_architecture(arch)  # a new identity layer keeps the function (noise scales start at 0)
    assert torch.allclose(q_values(), before, atol=1e-5)
    assert agent.networks["q_target"].mlp.spec.hidden == (16, 16, 16)


# ---- TD3 / DDPG --------------------------------------------------------------------------------------
def _td3(cls=TD3, hp_cls=TD3Hyperparameters, **hp):
    return cls(SPEC, BOX, _arch(), hp_cls(**hp), 0)


def _rows(k, b):
    """Each of k members' rows of a member-major batch of k * b transitions."""
    return StackedRows([torch.arange(i * b, (i + 1) * b) for i in range(k)], torch.device("cpu"))


def _twice(batch, k=2):
    """The same transitions for k members (member-major)."""
    return Transition({"obs": batch.obs["obs"].repeat(k, 1)}, batch.action.repeat(k, 1), batch.reward.repeat(k),
                      {"obs": batch.next_obs["obs"].repeat(k, 1)}, batch.terminated.repeat(k))


def _linear_target_critics(agent):
    """Q_1'(s', a) = 3 + 10 a, Q_2'(s', a) = 1 + 10 a (one hidden unit passes a + 1 through its relus)."""
    for name, bias in (("critic_1_target", 3.0), ("critic_2_target", 1.0)):
        _constant(agent, name, [bias])
        net = agent.networks[name].mlp
        with torch.no_grad():
            net.hidden[0].weight[0, 3] = 1.0
            net.hidden[0].bias[0] = 1.0
            net.hidden[1].weight[0, 0] = 1.0
            net.out.weight[0, 0] = 10.0
            net.out.bias.fill_(bias - 10.0)


def test_td3_target_with_clipped_double_q_and_smoothing_alone_and_in_a_group():
    one = _td3(gamma=0.5, target_noise=0.2, target_noise_clip=0.3)
    two = _td3(gamma=0.9, target_noise=0.4, target_noise_clip=0.5)
    for agent in (one, two):
        _constant(agent, "actor_target", [0.0])  # mu'(s') = tanh(0) = 0
        _linear_target_critics(agent)
    b = _batch([1.0, 1.0], [0.0, 1.0], torch.zeros(2, 1))
    noise = torch.tensor([[1.0], [-5.0]])
    # alone (K = 1): noise scaled by 0.2 -> 0.2 and -1.0, clipped to 0.2 and -0.3; min(3 + 10a, 1 + 10a) = 1 + 10a
    y = TD3.group([one]).target(b, _rows(1, 2), smoothing=noise.unsqueeze(0))
    assert y.tolist() == [pytest.approx([1 + 0.5 * 3.0, 1.0])]
    # together (K = 2): each member its own gamma, noise scale and clip (two: 0.4 -> a = 0.4, so 1 + 0.9 * 5)
    y = TD3.group([one, two]).target(_twice(b), _rows(2, 2), smoothing=torch.stack([noise, noise]))
    assert y.tolist() == [pytest.approx([2.5, 1.0]), pytest.approx([1 + 0.9 * 5.0, 1.0])]
    ddpg = _td3(DDPG, DDPGHyperparameters, gamma=0.5)
    assert ddpg.critics == ["critic_1"] and ddpg.hp.policy_freq == 1 and ddpg.hp.target_noise == 0


def test_td3_delays_actor_and_target_updates_per_member():
    b = Transition({"obs": torch.randn(8, 3)}, torch.rand(8, 1) * 2 - 1, torch.randn(8), {"obs": torch.randn(8, 3)},
                   torch.zeros(8))
    alone = _td3(policy_freq=2)
    actor0 = alone.optimizers["actor"].flat.clone()
    target0 = alone.target_flat["critic_1_target"].clone()
    learn_alone(alone, b)  # a group of one
    assert torch.equal(alone.optimizers["actor"].flat, actor0)
    assert torch.equal(alone.target_flat["critic_1_target"], target0)
    learn_alone(alone, b)
    assert not torch.equal(alone.optimizers["actor"].flat, actor0)
    assert not torch.equal(alone.target_flat["critic_1_target"], target0)
    slow, fast = _td3(policy_freq=2), _td3(policy_freq=1)
    before = [a.optimizers["actor"].flat.clone() for a in (slow, fast)]
    group = TD3.group([slow, fast])
    group.learn_batch(_twice(b))
    group.write_back()
    assert torch.equal(slow.optimizers["actor"].flat, before[0])
    assert not torch.equal(fast.optimizers["actor"].flat, before[1])
    assert (slow.learn_steps, fast.learn_steps) == (1, 1)


def test_ou_noise_resets_per_finished_episode():
    agent = _td3(noise_type="ou", expl_noise=0.5, random_steps=0)
    group = type(agent).group([agent])
    obs = {"obs": torch.zeros(3, 3)}
    for _ in range(5):
        group.explore_group(obs, None)
    assert (group.ou_state != 0).all()
    group.episodes_done(torch.tensor([False, True, False]))
    assert (group.ou_state[0, 1] == 0).all() and (group.ou_state[0, [0, 2]] != 0).all()


def test_box_actions_scale_in_and_out():
    spec = action_spec(spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32)))
    a = np.array([[-1.0, 1.0], [0.0, 0.0]])
    assert spec.to_env(a).tolist() == [[-2.0, 10.0], [0.0, 5.0]]
    assert spec.from_env(spec.to_env(a)) == pytest.approx(a)
    from agilerl_core.errors import ConfigError
    with pytest.raises(ConfigError, match="unbounded"):
        action_spec(spaces.Box(-np.inf, np.inf, (2,)))


# ---- SAC ---------------------------------------------------------------------------------------------
def test_sac_squashed_log_prob_matches_change_of_variables():
    mean, log_std = torch.tensor([[0.3]]), torch.tensor([[-0.5]])
    u = torch.tensor([[0.8]])
    gauss = torch.distributions.Normal(mean, log_std.exp()).log_prob(u)
    expected = gauss - torch.log(1 - torch.tanh(u) ** 2)
    assert squashed_log_prob(u, mean, log_std).item() == pytest.approx(expected.item(), abs=1e-5)


def test_sac_soft_target_and_temperature_step_alone_and_in_a_group():
    one = SAC(SPEC, BOX, _arch(), SACHyperparameters(init_alpha=0.5, lr_alpha=0.1, gamma=0.9), 0)
    two = SAC(SPEC, BOX, _arch(), SACHyperparameters(init_alpha=0.25, lr_alpha=0.05, gamma=0.5), 0)
    assert one.target_entropy == -1.0
    for agent in (one, two):  # the critic target subtracts alpha * log pi of the next action
        _constant(agent, "actor", [0.0, math.log(0.5)])  # mean 0, std 0.5
        for name in ("critic_1_target", "critic_2_target"):
            _constant(agent, name, [2.0 if name.endswith("1_target") else 1.0])
    b = _batch([1.0], [0.0], torch.zeros(1, 1))
    noise = torch.tensor([[[0.4]]])
    logp = squashed_log_prob(0.5 * noise[0], torch.zeros(1, 1), torch.full((1, 1), math.log(0.5))).item()
    assert SAC.group([one]).target(b, _rows(1, 1), noise).item() == pytest.approx(1 + 0.9 * (1.0 - 0.5 * logp), abs=1e-5)
    y = SAC.group([one, two]).target(_twice(b), _rows(2, 1), torch.cat([noise, noise]))
    assert y.view(-1).tolist() == pytest.approx([1 + 0.9 * (1.0 - 0.5 * logp), 1 + 0.5 * (1.0 - 0.25 * logp)], abs=1e-5)
    # alpha loss gradient: d/dlog_alpha = -(log pi + target_entropy)
    la = torch.tensor(0.0, requires_grad=True)
    alpha_loss(la, torch.tensor([0.5, 1.5]), -1.0).backward()
    assert la.grad.item() == pytest.approx(-(1.0 - 1.0))
    # entropy below target -> alpha rises; above -> it falls; Adam's first step moves log alpha by the member's lr
    low = SAC(SPEC, BOX, _arch(), SACHyperparameters(init_alpha=0.5, lr_alpha=0.1, target_entropy=100.0), 0)
    high = SAC(SPEC, BOX, _arch(), SACHyperparameters(init_alpha=0.5, lr_alpha=0.05, target_entropy=-100.0), 0)
    batch = Transition({"obs": torch.randn(4, 3)}, torch.zeros(4, 1), torch.zeros(4), {"obs": torch.randn(4, 3)},
                       torch.zeros(4))
    for members in ([low.clone()], [high.clone()], [low, high]):
        group = SAC.group(members)
        group.learn_batch(_twice(batch, len(members)))
        group.write_back()
        for m in members:
            step = 0.1 if m.hp.target_entropy > 0 else -0.05
            assert m.log_alpha.item() == pytest.approx(math.log(0.5) + step, abs=1e-6)


def _td3_reference_step(nets, opts, b: Transition, hp: dict, noise_key: torch.Tensor, step: int) -> float:
    """One TD3 step written with plain torch on one member's own modules and torch.optim.Adam."""
    actor, c1, c2, actor_t, c1_t, c2_t = nets
    with torch.no_grad():
        next_a = torch.tanh(actor_t(b.next_obs))
        # the member's own target-noise draws: its keyed stream, at the count of its own steps
        noise = rng.normal(noise_key, step - 1, next_a.numel()).view(next_a.shape)
        eps = (noise * hp["target_noise"]).clamp(-0.5, 0.5)
        next_a = (next_a + eps).clamp(-1.0, 1.0)
        y = b.reward + hp["gamma"] * (1 - b.terminated) * torch.min(c1_t(b.next_obs, next_a), c2_t(b.next_obs, next_a)).squeeze(1)
    total = 0.0
    for critic, opt in zip((c1, c2), opts[1:], strict=True):
        loss = torch.nn.functional.mse_loss(critic(b.obs, b.action).squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(critic.parameters(), hp["max_grad_norm"])
        opt.step()
        total += float(loss.detach())
    if step % hp["policy_freq"] == 0:
        opts[0].zero_grad()
        (-c1(b.obs, torch.tanh(actor(b.obs))).mean()).backward()
        torch.nn.utils.clip_grad_norm_(actor.parameters(), hp["max_grad_norm"])
        opts[0].step()
        with torch.no_grad():
            for online, target in ((actor, actor_t), (c1, c1_t), (c2, c2_t)):
                for pt, p in zip(target.parameters(), online.parameters(), strict=True):
                    pt.lerp_(p, hp["tau"])
    return total


def test_td3_group_steps_equal_each_members_plain_torch_reference():
    """Three members of other widths with their own rates, gamma, tau, policy_freq and smoothing noise take
    four batched steps on their own batches; each ends where plain torch takes it (the same noise draws)."""
    hps = [{"lr_actor": 1e-2, "lr_critic": 3e-3, "gamma": 0.9, "tau": 0.1, "policy_freq": 2, "target_noise": 0.2},
           {"lr_actor": 3e-3, "lr_critic": 1e-2, "gamma": 0.99, "tau": 0.5, "policy_freq": 1, "target_noise": 0.4},
           {"lr_actor": 2e-2, "lr_critic": 2e-3, "gamma": 0.5, "tau": 1.0, "policy_freq": 3, "target_noise": 0.1}]
    widths = [(8, 8), (16, 4), (4, 12)]
    members = [TD3(SPEC, BOX, initial_arch(SPEC, 1, NetworkConfig(hidden_sizes=list(w), min_nodes=1)),
                   TD3Hyperparameters(max_grad_norm=1.0, **hp), i) for i, (w, hp) in enumerate(zip(widths, hps, strict=True))]
    refs = []
    for a in members:
        twin = a.clone()
        nets = [twin.networks[n] for n in ("actor", "critic_1", "critic_2", "actor_target", "critic_1_target",
                                           "critic_2_target")]
        for p in (p for n in nets for p in n.parameters()):
            p.grad = None
        opts = [torch.optim.Adam(nets[0].parameters(), a.hp.lr_actor),
                *(torch.optim.Adam(n.parameters(), a.hp.lr_critic) for n in nets[1:3])]
        gen = torch.Generator()
        gen.set_state(a.torch_gen.get_state())
        key = rng.member_keys([gen], "cpu")[0]  # the phase key its group draws from its generator
        refs.append((nets, opts, rng.mix(key ^ rng.SALT_NOISE)))
    group = TD3.group(members)
    g = torch.Generator().manual_seed(0)
    for step in range(1, 5):
        parts = [Transition({"obs": torch.randn(16, 3, generator=g)}, torch.rand(16, 1, generator=g) * 2 - 1,
                            torch.randn(16, generator=g), {"obs": torch.randn(16, 3, generator=g)},
                            (torch.rand(16, generator=g) < 0.2).float()) for _ in members]
        joined = Transition({"obs": torch.cat([p.obs["obs"] for p in parts])},
                            *(torch.cat([getattr(p, f) for p in parts]) for f in ("action", "reward")),
                            {"obs": torch.cat([p.next_obs["obs"] for p in parts])},
                            torch.cat([p.terminated for p in parts]))
        losses = group.learn_batch(joined)
        for i, ((nets, opts, gen), part) in enumerate(zip(refs, parts, strict=True)):
            want = _td3_reference_step(nets, opts, part, hps[i] | {"max_grad_norm": 1.0}, gen, step)
            assert float(losses[i]) == pytest.approx(want, rel=1e-5, abs=1e-6)
    group.write_back()
    for a, (nets, _, _) in zip(members, refs, strict=True):
        for name, ref in zip(("actor", "critic_1", "critic_2", "actor_target", "critic_1_target", "critic_2_target"),
                             nets, strict=True):
            for (n, p), q in zip(a.networks[name].named_parameters(), ref.parameters(), strict=True):
                torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=f"{name}.{n}")
