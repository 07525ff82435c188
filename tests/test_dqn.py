"""DQN-family maths on hand-built batches, run at K = 1 (a member alone) and K = 3 (a population batched):
TD targets, masks, the epsilon schedule, the C51 and CQN losses, and a learning step against a reference
written with plain torch (each member's own network, autograd, torch.optim.Adam)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from agilerl_core.algorithms.dqn import DQN, linear_epsilon
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters
from agilerl_core.algorithms.optim import FlatAdam
from agilerl_core.buffers.replay import Transition
from agilerl_core.config import NetworkConfig
from agilerl_core.envs.spaces import ObsSpec
from agilerl_core.networks import initial_arch
from tests.conftest import greedy

SPEC = ObsSpec(spaces.Box(-1, 1, (3,), np.float32))
KS = [1, 3]


def make_dqn(seed=0, hidden=(16, 16), activation="relu", cls=DQN, hp_cls=DQNHyperparameters, actions=2, **hp):
    arch = initial_arch(SPEC, actions, NetworkConfig(hidden_sizes=list(hidden), activation=activation, min_nodes=1))
    return cls(SPEC, actions, arch, hp_cls(**hp), seed)


def constant_q(agent: DQN, net: str, values):
    """Make `net` output `values` for every state (zero weights, output bias = values)."""
    with torch.no_grad():
        for p in agent.networks[net].parameters():
            p.zero_()
        agent.networks[net].mlp.out.bias.copy_(torch.as_tensor(values, dtype=torch.float32))


def batch(reward, terminated, mask=None, action=(0, 0)):
    n = len(reward)
    obs = {"obs": torch.zeros(n, 3)}
    return Transition(obs, torch.tensor(action), torch.tensor(reward, dtype=torch.float32), obs,
                      torch.tensor(terminated, dtype=torch.float32), mask)


def repeat(b: Transition, k: int) -> Transition:
    """`b` for each of k members, member-major (what a group's step reads)."""
    def rep(x):
        if x is None:
            return None
        if isinstance(x, dict):
            return {key: rep(v) for key, v in x.items()}
        return x.repeat(k, *([1] * (x.dim() - 1)))
    return Transition(*(rep(x) for x in b))


def group_of(agent: DQN, k: int):
    """`agent` and k - 1 copies of it (other seeds) as one stacked group."""
    members = [agent] + [agent.clone() for _ in range(k - 1)]
    return type(agent).group(members)


@pytest.mark.parametrize("k", KS)
def test_td_target_known_answers(k):
    agent = make_dqn(gamma=0.9, double=False)
    constant_q(agent, "q", [5.0, 2.0])
    constant_q(agent, "q_target", [1.0, 3.0])
    b = repeat(batch([1.0, 1.0], [0.0, 1.0]), k)
    # vanilla: r + gamma * max_a Q_target(s', a) = 1 + 0.9 * 3; terminal: r only
    torch.testing.assert_close(group_of(agent, k).td_target(b, k), torch.tensor([[3.7, 1.0]] * k))
    agent.set_hyperparameter("double", True)
    # double: a* = argmax Q_online(s') = 0, evaluated by the target: 1 + 0.9 * 1
    torch.testing.assert_close(group_of(agent, k).td_target(b, k), torch.tensor([[1.9, 1.0]] * k))


@pytest.mark.parametrize("k", KS)
def test_truncation_bootstraps_termination_does_not(k):
    agent = make_dqn(gamma=0.5, double=False)
    constant_q(agent, "q_target", [4.0, 4.0])
    # a truncated transition is stored with terminated=0 and bootstraps from its final observation
    got = group_of(agent, k).td_target(repeat(batch([0.0, 0.0], [0.0, 1.0]), k), k)
    torch.testing.assert_close(got, torch.tensor([[2.0, 0.0]] * k))


@pytest.mark.parametrize("k", KS)
def test_masked_actions_are_not_bootstrapped(k):
    agent = make_dqn(gamma=1.0, double=False)
    constant_q(agent, "q_target", [1.0, 3.0])
    mask = torch.tensor([[True, False], [False, False]])  # second row: no valid action -> all allowed
    got = group_of(agent, k).td_target(repeat(batch([0.0, 0.0], [0.0, 0.0], mask), k), k)
    torch.testing.assert_close(got, torch.tensor([[1.0, 3.0]] * k))


def test_members_bootstrap_at_their_own_gamma():
    members = [make_dqn(seed=i, gamma=g, double=False) for i, g in enumerate((0.9, 0.5, 0.0))]
    for a in members:
        constant_q(a, "q_target", [2.0, 1.0])
    got = DQN.group(members).td_target(repeat(batch([1.0], [0.0], action=(0,)), 3), 3)
    torch.testing.assert_close(got, torch.tensor([[2.8], [2.0], [1.0]]))


@pytest.mark.parametrize("k", KS)
def test_c51_loss_is_the_cross_entropy_to_the_projected_target(k):
    agent = make_dqn(distributional=True, num_atoms=3, v_min=0, v_max=2, gamma=1.0, double=False)
    constant_q(agent, "q_target", [0.0, 10.0, 0.0, 0.0, 0.0, 10.0])  # action 0: all on z=1; action 1: on z=2
    constant_q(agent, "q", [0.0] * 6)  # uniform predictions
    group = group_of(agent, k)
    b = repeat(batch([0.0], [0.0], action=(0,)), k)
    target = group.target_distribution(b, k)  # greedy next action is 1 (mean 2), shifted by r=0: z=2
    torch.testing.assert_close(target, torch.tensor([[[0.0, 0.0, 1.0]]] * k), atol=1e-4, rtol=0)
    losses, _ = group.sample_losses(b, k)
    torch.testing.assert_close(losses, torch.full((k, 1), math.log(3)), atol=1e-4, rtol=0)


def test_epsilon_schedule():
    assert linear_epsilon(0, 1.0, 0.05, 10_000) == 1.0
    assert linear_epsilon(5_000, 1.0, 0.05, 10_000) == pytest.approx(0.525)
    assert linear_epsilon(10_000, 1.0, 0.05, 10_000) == pytest.approx(0.05)
    assert linear_epsilon(10**9, 1.0, 0.05, 10_000) == pytest.approx(0.05)
    agent = make_dqn(eps_start=0.8, eps_end=0.2, eps_decay_steps=100)
    agent.env_steps = 50
    assert float(DQN.group([agent]).epsilon()[0]) == pytest.approx(0.5)  # the group's, on the device


def test_act_never_picks_masked_actions():
    obs = {"obs": torch.zeros(64, 3)}
    mask = torch.zeros((64, 2), dtype=torch.bool)
    mask[:, 1] = True
    assert (greedy(make_dqn(), obs, mask.numpy()) == 1).all()
    for eps in (0.0, 1.0):
        group = DQN.group([make_dqn(eps_start=eps, eps_end=eps)])
        assert (group.explore_group(obs, mask) == 1).all()
    acts = DQN.group([make_dqn(eps_start=1.0, eps_end=1.0)]).explore_group(obs, None)
    assert set(acts.view(-1).tolist()) == {0, 1}


def test_stacked_adam_matches_torch_adam():
    """Two members with their own learning rates (and other widths) stepped as one stacked Adam, gradients
    clipped per member: each ends where torch.optim.Adam and clip_grad_norm_ take its own copy."""
    from agilerl_core.algorithms.group_state import StackedAdam, padded_shapes, param_shapes, stack_flats

    torch.manual_seed(0)
    ours = [torch.nn.Sequential(torch.nn.Linear(4, w), torch.nn.Tanh(), torch.nn.Linear(w, 2)) for w in (8, 5)]
    refs = [torch.nn.Sequential(torch.nn.Linear(4, w), torch.nn.Tanh(), torch.nn.Linear(w, 2)) for w in (8, 5)]
    for a, b in zip(ours, refs, strict=True):
        b.load_state_dict(a.state_dict())
    flats = [FlatAdam(a, lr) for a, lr in zip(ours, (1e-2, 3e-3), strict=True)]
    shapes = [param_shapes(a) for a in ours]
    opts = [torch.optim.Adam(b.parameters(), lr) for b, lr in zip(refs, (1e-2, 3e-3), strict=True)]
    for _ in range(20):
        x = torch.randn(16, 4)
        adam = StackedAdam(flats, shapes)
        for a in ours:
            for p in a.parameters():
                p.grad.zero_()
            (a(x).square().mean() * 10).backward()  # grads land in each FlatAdam's flat gradient buffer
        adam.grad = stack_flats([f.grad for f in flats], shapes, padded_shapes(shapes))
        adam.clip_grad_norm(0.5)
        adam.step()
        adam.write_back()
        for b, opt in zip(refs, opts, strict=True):
            opt.zero_grad()
            (b(x).square().mean() * 10).backward()
            torch.nn.utils.clip_grad_norm_(b.parameters(), 0.5)
            opt.step()
    for a, b in zip(ours, refs, strict=True):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def reference_step(net, target, opt, b: Transition, hp) -> float:
    """One double/vanilla DQN step written with plain torch on one member's own networks."""
    q = net(b.obs)
    with torch.no_grad():
        nq_t = target(b.next_obs)
        chooser = net(b.next_obs) if hp["double"] else nq_t
        best = chooser.argmax(1, keepdim=True)
        y = b.reward + hp["gamma"] * (1 - b.terminated) * nq_t.gather(1, best).squeeze(1)
    q_taken = q.gather(1, b.action.unsqueeze(1)).squeeze(1)
    loss = torch.nn.functional.smooth_l1_loss(q_taken, y) if hp["loss"] == "huber" else \
        torch.nn.functional.mse_loss(q_taken, y)
    opt.zero_grad()
    loss.backward()
    if hp.get("max_grad_norm"):
        torch.nn.utils.clip_grad_norm_(net.parameters(), hp["max_grad_norm"])
    opt.step()
    with torch.no_grad():
        for pt, p in zip(target.parameters(), net.parameters(), strict=True):
            pt.lerp_(p, hp["tau"])
    return float(loss.detach())


@pytest.mark.parametrize("activation", ["relu", "leaky_relu", "elu", "tanh"])
@pytest.mark.parametrize("options", [{"loss": "mse", "double": True}, {"loss": "huber", "double": False,
                                                                          "max_grad_norm": 0.5}])
def test_group_steps_equal_each_members_plain_torch_reference(activation, options):
    """Three members of other widths and their own lr, gamma and tau take three batched steps on their own
    batches; each ends where plain torch (its own modules, autograd, torch.optim.Adam) takes it."""
    hps = [{"lr": 1e-2, "gamma": 0.9, "tau": 0.1}, {"lr": 3e-3, "gamma": 0.99, "tau": 0.5},
           {"lr": 2e-2, "gamma": 0.5, "tau": 1.0}]
    widths = [(8, 8), (16, 4), (4, 12)]
    members = [make_dqn(i, w, activation, **hp, **options) for i, (w, hp) in enumerate(zip(widths, hps, strict=True))]
    refs = []
    for a in members:
        net, tgt = a.clone().networks["q"], a.clone().networks["q_target"]
        for p in [*net.parameters(), *tgt.parameters()]:
            p.grad = None
        refs.append((net, tgt, torch.optim.Adam(net.parameters(), a.hp.lr)))
    group = DQN.group(members)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        parts = [Transition({"obs": torch.randn(16, 3, generator=g)}, torch.randint(0, 2, (16,), generator=g),
                            torch.randn(16, generator=g) * 3, {"obs": torch.randn(16, 3, generator=g)},
                            (torch.rand(16, generator=g) < 0.2).float()) for _ in members]
        joined = Transition({"obs": torch.cat([p.obs["obs"] for p in parts])},
                            *(torch.cat([getattr(p, f) for p in parts]) for f in ("action", "reward")),
                            {"obs": torch.cat([p.next_obs["obs"] for p in parts])},
                            torch.cat([p.terminated for p in parts]))
        losses = group.learn_batch(joined)
        for i, ((net, tgt, opt), part) in enumerate(zip(refs, parts, strict=True)):
            want = reference_step(net, tgt, opt, part, {**hps[i], **options})
            assert float(losses[i]) == pytest.approx(want, rel=1e-5, abs=1e-6)
    group.write_back()
    for a, (net, tgt, _) in zip(members, refs, strict=True):
        for (n, p), q in zip(a.networks["q"].named_parameters(), net.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=n)
        for p, q in zip(a.networks["q_target"].parameters(), tgt.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        assert a.learn_steps == 3


@pytest.mark.parametrize("k", KS)
def test_hard_target_update_every_n_steps(k):
    agent = make_dqn(hard_update_every=3)
    group = group_of(agent, k)
    b = repeat(batch([1.0, 0.0], [0.0, 0.0], action=(0, 1)), k)
    before = group.targets["q_target"].clone()
    group.learn_batch(b)
    group.learn_batch(b)
    assert torch.equal(group.targets["q_target"], before)
    group.learn_batch(b)
    assert torch.equal(group.targets["q_target"], group.q.flat.detach())


@pytest.mark.parametrize("k", KS)
def test_loss_decreases_on_a_fixed_batch(k):
    group = group_of(make_dqn(lr=1e-2, tau=1.0), k)
    b = repeat(batch([1.0, 0.5], [1.0, 1.0], action=(0, 1)), k)
    first = group.learn_batch(b)
    for _ in range(200):
        last = group.learn_batch(b)
    assert (last < 0.01 * first).all()
