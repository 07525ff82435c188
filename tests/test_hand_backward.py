"""Hand-written backward passes (the plain-MLP trunks, DQN, PPO, the TD3/SAC critics) equal autograd's, and every
network keeps learning step after step."""

from __future__ import annotations

import pytest
import torch

from agilerl_core.algorithms.dqn import DQN
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters
from agilerl_core.config import NetworkConfig
from agilerl_core.networks import initial_arch
from tests.test_group import SPEC, assert_same_members, continuous_buffer, dqn, filled_buffer, ppo, rollout_data, state_of, td3
from tests.test_group_teams import team, team_buffer


@pytest.mark.parametrize("family", ["dqn", "td3", "sac", "matd3"])
def test_every_network_keeps_learning_step_after_step(family):
    """Optimiser steps rewrite the stacked buffers in place: every later step must still reach each network
    (a view of the trainable blocks kept across steps once silently lost its gradient: zero from step 2)."""
    from agilerl_core.algorithms.actor_critic import SAC
    from tests.test_multi_agent import SPEAKER_LISTENER

    if family == "matd3":
        member, buf = team(SPEAKER_LISTENER, 1, "matd3", policy_freq=1, batch_size=32), team_buffer(SPEAKER_LISTENER, 1)
    elif family == "dqn":
        member, buf = dqn(1, batch_size=32), filled_buffer(1)
    else:
        member, buf = td3(1, SAC if family == "sac" else None, policy_freq=1, batch_size=32), continuous_buffer(1)
    group = type(member).group([member])
    for step in range(3):  # (Adam's momentum would move them anyway: the gradient is what must arrive)
        for a in group.adams.values():
            a.grad = torch.zeros_like(a.flat)
        group.learn_step(buf, [0], [True])
        for n, a in group.adams.items():
            assert a.grad.abs().sum() > 0, f"{n} got no gradient at step {step}"


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_hand_written_mlp_backward_equals_autograd(activation):
    """StackedNetwork.backward (the plain-MLP trunk's hand-written backward) gives autograd's gradient for
    every parameter block of three members of other widths (zero-padded), for an arbitrary output gradient;
    networks it cannot take (dueling, noisy) say so."""
    from agilerl_core.algorithms.group import gradients

    def member(i, hidden, **hp):
        arch = initial_arch(SPEC, 2, NetworkConfig(hidden_sizes=list(hidden), min_nodes=1, activation=activation))
        return DQN(SPEC, 2, arch, DQNHyperparameters(**hp), i)

    stack = DQN.group([member(i, h) for i, h in enumerate([(16, 16), (32, 8), (8, 24)])]).online
    assert stack.hand_backward and stack.arch.mlp.activation == activation
    g = torch.Generator().manual_seed(3)
    obs = {"obs": torch.rand(3 * 20, 3, generator=g) * 2 - 1}
    grad_out = torch.randn(3, 20, 2, generator=g)
    (want,) = gradients((stack(obs) * grad_out).sum(), stack.leaves)
    out, saved = stack.forward_saving(obs)
    torch.testing.assert_close(out, stack(obs).detach(), rtol=0, atol=0)
    torch.testing.assert_close(stack.backward(saved, grad_out, torch.full_like(want, float('nan'))), want,
                               rtol=1e-6, atol=1e-7)
    assert not DQN.group([member(1, (16, 16), dueling=True)]).online.hand_backward
    assert not DQN.group([member(1, (16, 16), noisy=True)]).online.hand_backward


@pytest.mark.parametrize("options", [{"double": True, "loss": "mse"}, {"double": False, "loss": "huber"},
                                     {"distributional": True, "num_atoms": 11, "v_min": -5.0, "v_max": 5.0}, "cqn"])
def test_dqn_steps_with_the_hand_written_trunk_backward_as_with_autograd(options, monkeypatch):
    """The DQN family's learn step takes the trunk's gradient by hand when the network is a plain MLP: three
    members' four steps equal the same steps differentiated by autograd throughout."""
    from agilerl_core.algorithms.cql import CQN
    from agilerl_core.algorithms.hyperparameters.cql import CQNHyperparameters
    from agilerl_core.networks.stacked import StackedNetwork

    def make(i):
        if options == "cqn":
            arch = initial_arch(SPEC, 2, NetworkConfig(hidden_sizes=[16, 16], min_nodes=1))
            return CQN(SPEC, 2, arch, CQNHyperparameters(batch_size=24 + 8 * i), i)
        return dqn(i, batch_size=24 + 8 * i, **options)

    hand, auto = [make(i) for i in range(3)], [make(i) for i in range(3)]
    buf = filled_buffer(3)
    group = type(hand[0]).group(hand)
    assert group.online.hand_backward
    for _ in range(4):
        group.learn_step(buf, [0, 1, 2], [True] * 3)
    group.write_back()
    monkeypatch.setattr(StackedNetwork, "hand_backward", property(lambda self: False))
    group = type(auto[0]).group(auto)
    for _ in range(4):
        group.learn_step(buf, [0, 1, 2], [True] * 3)
    group.write_back()
    assert_same_members(hand, auto, atol=1e-6)


@pytest.mark.parametrize(("continuous", "mask"), [(False, True), (True, False)])
def test_ppo_updates_with_the_hand_written_trunk_backward_as_with_autograd(continuous, mask, monkeypatch):
    """PPO's actor and critic take their trunks' gradients by hand (their losses by autograd): three members'
    batched update (other widths, tanh) equals the same update differentiated by autograd throughout."""
    from agilerl_core.networks.stacked import StackedNetwork

    def members():
        return [ppo(30 + i, continuous, hidden=(16, 16) if i != 2 else (24, 8), update_epochs=2, num_minibatches=2)
                for i in range(3)]

    rollouts = [rollout_data(40 + i, 48, continuous, mask) for i in range(3)]

    def update(agents):
        group = type(agents[0]).group(agents)
        data = {"obs": {"obs": torch.stack([d["obs"]["obs"] for d, _, _ in rollouts])},
                **{key: torch.stack([d[key] for d, _, _ in rollouts]) for key in rollouts[0][0] if key != "obs"}}
        stats = group.learn_stacked(data, torch.stack([a for _, a, _ in rollouts]), torch.stack([r for _, _, r in rollouts]))
        group.write_back()
        return group, stats

    hand, auto = members(), members()
    group, stats = update(hand)
    assert group.nets["actor"].hand_backward and group.nets["critic"].hand_backward
    monkeypatch.setattr(StackedNetwork, "hand_backward", property(lambda self: False))
    _, auto_stats = update(auto)
    assert_same_members(hand, auto, atol=1e-6)
    torch.testing.assert_close(stats["loss_sum"], auto_stats["loss_sum"], rtol=1e-5, atol=0)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_critics_step_with_the_hand_written_backward_as_with_autograd(algo, monkeypatch):
    """TD3's and SAC's critics (Q(s, a): the action joins the trunk's input) take their TD regression's gradient
    by hand: three members of other widths, four steps (one with a member sitting out), equal to the same steps
    differentiated by autograd throughout, bit for bit."""
    from agilerl_core.algorithms.actor_critic import SAC, TD3
    from agilerl_core.networks.stacked import StackedNetwork

    cls = TD3 if algo == "td3" else SAC

    def members():
        return [td3(20 + i, cls, hidden=(16, 16) if i != 1 else (24, 8), batch_size=24 + 8 * i) for i in range(3)]

    buf = continuous_buffer(3)
    plan = [[True, True, True], [True, False, True], [True, True, True], [True, True, True]]

    def steps(agents):
        group = type(agents[0]).group(agents)
        for active in plan:
            group.learn_step(buf, [0, 1, 2], active)
        group.write_back()
        return group

    hand = members()
    group = steps(hand)
    assert all(group.nets[c].hand_backward for c in hand[0].critics)
    monkeypatch.setattr(StackedNetwork, "hand_backward", property(lambda self: False))
    auto = members()
    steps(auto)
    for a, b in zip(hand, auto, strict=True):
        sa, sb = state_of(a), state_of(b)
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
