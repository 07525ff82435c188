"""DQN maths on hand-built batches, the epsilon schedule, masks, and the fused learn step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from agilerl_core.algorithms.dqn import DQN, linear_epsilon
from agilerl_core.algorithms.dqn_hp import DQNHyperparameters
from agilerl_core.algorithms.optim import FlatAdam
from agilerl_core.buffers.replay import Transition
from agilerl_core.config import NetworkConfig
from agilerl_core.envs.spaces import ObsSpec
from agilerl_core.networks import initial_arch

SPEC = ObsSpec(spaces.Box(-1, 1, (3,), np.float32))


def make_dqn(seed=0, hidden=(16, 16), activation="relu", **hp):
    arch = initial_arch(SPEC, 2, NetworkConfig(hidden_sizes=list(hidden), activation=activation, min_nodes=1))
    return DQN(SPEC, 2, arch, DQNHyperparameters(**hp), seed)


def constant_q(agent: DQN, net: str, values):
    """Make `net` output `values` for every state (zero weights, output bias = values)."""
    with torch.no_grad():
        for p in agent.networks[net].parameters():
            p.zero_()
        agent.networks[net].mlp.out.bias.copy_(torch.tensor(values))


def batch(reward, terminated, mask=None, action=(0, 0)):
    n = len(reward)
    obs = {"obs": torch.zeros(n, 3)}
    return Transition(obs, torch.tensor(action), torch.tensor(reward, dtype=torch.float32), obs,
                      torch.tensor(terminated, dtype=torch.float32), mask)


def test_td_target_known_answers():
    agent = make_dqn(gamma=0.9, double=False)
    constant_q(agent, "q", [5.0, 2.0])
    constant_q(agent, "q_target", [1.0, 3.0])
    b = batch([1.0, 1.0], [0.0, 1.0])
    # vanilla: r + gamma * max_a Q_target(s', a) = 1 + 0.9 * 3; terminal: r only
    torch.testing.assert_close(agent.td_target(b), torch.tensor([3.7, 1.0]))
    agent.set_hyperparameter("double", True)
    # double: a* = argmax Q_online(s') = 0, evaluated by the target: 1 + 0.9 * 1
    torch.testing.assert_close(agent.td_target(b), torch.tensor([1.9, 1.0]))


def test_truncation_bootstraps_termination_does_not():
    agent = make_dqn(gamma=0.5, double=False)
    constant_q(agent, "q_target", [4.0, 4.0])
    # a truncated transition is stored with terminated=0 and bootstraps from its final observation
    torch.testing.assert_close(agent.td_target(batch([0.0, 0.0], [0.0, 1.0])), torch.tensor([2.0, 0.0]))


def test_masked_actions_are_not_bootstrapped():
    agent = make_dqn(gamma=1.0, double=False)
    constant_q(agent, "q_target", [1.0, 3.0])
    mask = torch.tensor([[True, False], [False, False]])  # second row: no valid action -> all allowed
    torch.testing.assert_close(agent.td_target(batch([0.0, 0.0], [0.0, 0.0], mask)), torch.tensor([1.0, 3.0]))


def test_epsilon_schedule():
    assert linear_epsilon(0, 1.0, 0.05, 10_000) == 1.0
    assert linear_epsilon(5_000, 1.0, 0.05, 10_000) == pytest.approx(0.525)
    assert linear_epsilon(10_000, 1.0, 0.05, 10_000) == pytest.approx(0.05)
    assert linear_epsilon(10**9, 1.0, 0.05, 10_000) == pytest.approx(0.05)
    agent = make_dqn(eps_start=0.8, eps_end=0.2, eps_decay_steps=100)
    agent.env_steps = 50
    assert agent.epsilon() == pytest.approx(0.5)


def test_act_never_picks_masked_actions():
    agent = make_dqn()
    obs = {"obs": torch.zeros(64, 3)}
    mask = np.zeros((64, 2), dtype=bool)
    mask[:, 1] = True
    for eps in (0.0, 1.0):
        assert (agent.act(obs, eps, mask) == 1).all()
    acts = agent.act(obs, 1.0, None)
    assert set(acts.tolist()) == {0, 1}


def test_flat_adam_matches_torch_adam():
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    b = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    b.load_state_dict(a.state_dict())
    ours, ref = FlatAdam(a, 1e-2), torch.optim.Adam(b.parameters(), 1e-2)
    for _ in range(20):
        x = torch.randn(16, 4)
        ours.zero_grad()
        a(x).square().mean().backward()
        ours.step()
        ref.zero_grad()
        b(x).square().mean().backward()
        ref.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert a[0].weight.grad.data_ptr() == ours.grad.data_ptr()  # grads still live in the flat buffer


@pytest.mark.parametrize("activation", ["relu", "leaky_relu", "elu", "tanh"])
@pytest.mark.parametrize("loss", ["mse", "huber"])
@pytest.mark.parametrize("double", [True, False])
def test_fused_learn_step_matches_autograd(activation, loss, double):
    fused = make_dqn(activation=activation, loss=loss, double=double, lr=1e-2, hidden=(8, 8))
    ref = fused.clone()
    g = torch.Generator().manual_seed(0)
    b = Transition({"obs": torch.randn(32, 3, generator=g)}, torch.randint(0, 2, (32,), generator=g),
                   torch.randn(32, generator=g) * 3, {"obs": torch.randn(32, 3, generator=g)},
                   (torch.rand(32, generator=g) < 0.2).float())
    for _ in range(3):
        l1 = fused.learn(b)
        opt = ref.optimizers["q"]
        opt.zero_grad()
        l2 = ref.loss(b)
        l2.backward()
        opt.step()
        ref.learn_steps += 1
        ref.update_targets(ref.hp.tau)
        torch.testing.assert_close(l1, l2.detach(), rtol=1e-5, atol=1e-6)
    for (n, p), q in zip(fused.networks["q"].named_parameters(), ref.networks["q"].parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)


def test_hard_target_update_every_n_steps():
    agent = make_dqn(hard_update_every=3)
    b = batch([1.0, 0.0], [0.0, 0.0], action=(0, 1))
    target = agent.networks["q_target"]
    before = [p.clone() for p in target.parameters()]
    agent.learn(b)
    agent.learn(b)
    assert all(torch.equal(p, q) for p, q in zip(target.parameters(), before, strict=True))
    agent.learn(b)
    for p, q in zip(target.parameters(), agent.networks["q"].parameters(), strict=True):
        assert torch.equal(p, q)


def test_loss_decreases_on_a_fixed_batch():
    agent = make_dqn(lr=1e-2, tau=1.0)
    b = batch([1.0, 0.5], [1.0, 1.0], action=(0, 1))
    first = float(agent.learn(b))
    for _ in range(200):
        last = float(agent.learn(b))
    assert last < 0.01 * first
