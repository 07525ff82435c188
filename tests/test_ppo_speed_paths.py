"""The faster paths of population-major PPO compute what the plain ones do: the recurrent core's hand-written
backward against autograd through the step-by-step cells, the actor and critic recurrences run as one stack,
action samples drawn a rollout ahead, the stacked update of recurrent sequences against the per-member one, the
rollout-end bootstrap of time-limit cuts against the per-step one, and stacking members without padding."""

from __future__ import annotations

import pytest
import torch

from agilerl_core.algorithms.group_state import stack_flats, unstack_into
from agilerl_core.algorithms.ppo import PPO
from agilerl_core.arenas import build_arena
from agilerl_core.envs.group import TorchGroupEnv
from agilerl_core.loops.on_policy import _members_sequences, train_group_on_policy
from agilerl_core.networks.recurrent import STATE_PARTS, run_sequence
from agilerl_core.networks.stacked import sequences
from tests.conftest import ppo_learn_alone, tiny_config
from tests.test_group import assert_same_members
from tests.test_recurrent import _sequences, rppo


def _cells(cell, params, x, state, starts):
    """The recurrence one autograd-tracked cell step at a time (the reference)."""
    layers = list(state.unbind(2))
    keep = (~starts).to(x.dtype)
    outs = []
    for t in range(x.shape[2]):
        inp = x[:, :, t]
        layers = [s * keep[:, :, t, None, None] for s in layers]
        for i, (w_ih, w_hh, b_ih, b_hh) in enumerate(params):
            k, g, h = w_ih.shape[0], w_ih.shape[1], w_ih.shape[2]
            gi = (torch.einsum("kbi,kgoi->kbgo", inp, w_ih) + b_ih[:, None]).view(k, -1, g, h)
            gh = (torch.einsum("kbi,kgoi->kbgo", layers[i][:, :, 0], w_hh) + b_hh[:, None]).view(k, -1, g, h)
            if cell == "lstm":
                z = gi + gh
                c = torch.sigmoid(z[:, :, 1]) * layers[i][:, :, 1] + torch.sigmoid(z[:, :, 0]) * torch.tanh(z[:, :, 2])
                layers[i] = torch.stack([torch.sigmoid(z[:, :, 3]) * torch.tanh(c), c], dim=2)
            else:
                r, u = torch.sigmoid(gi[:, :, 0] + gh[:, :, 0]), torch.sigmoid(gi[:, :, 1] + gh[:, :, 1])
                n = torch.tanh(gi[:, :, 2] + r * gh[:, :, 2])
                layers[i] = ((1 - u) * n + u * layers[i][:, :, 0]).unsqueeze(2)
            inp = layers[i][:, :, 0]
        outs.append(inp)
    return torch.stack(outs, dim=2), torch.stack(layers, dim=2)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_recurrence_and_its_backward_equal_autograd_through_the_cells(cell):
    g = torch.Generator().manual_seed(1)
    k, b, steps, inp, hid, gates = 3, 4, 6, 5, 7, 4 if cell == "lstm" else 3
    params = [tuple((torch.randn(*shape, generator=g) * 0.4).requires_grad_(True)
                    for shape in ((k, gates, hid, inp if i == 0 else hid), (k, gates, hid, hid), (k, gates, hid),
                                  (k, gates, hid)))
              for i in range(2)]
    x = torch.randn(k, b, steps, inp, generator=g, requires_grad=True)
    state = (torch.randn(k, b, 2, STATE_PARTS[cell], hid, generator=g) * 0.5).requires_grad_(True)
    starts = torch.rand(k, b, steps, generator=g) < 0.25
    leaves = [x, state, *[t for layer in params for t in layer]]
    weights = torch.randn(k, b, steps, hid, generator=g), torch.randn(k, b, 2, STATE_PARTS[cell], hid, generator=g)
    got, want = (fn(cell, params, x, state, starts) for fn in (run_sequence, _cells))
    for a, w in zip(got, want, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-5, atol=1e-6)
    grads = [torch.autograd.grad((o * weights[0]).sum() + (s * weights[1]).sum(), leaves) for o, s in (got, want)]
    for a, w in zip(*grads, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-5)
    with torch.no_grad():  # acting: the same forward, nothing kept
        torch.testing.assert_close(run_sequence(cell, params, x, state, starts)[0], want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_actor_and_critic_run_as_one_stack_as_each_alone(cell):
    members = [rppo(i, cell, hidden=h) for i, h in enumerate((8, 12))]
    group = PPO.group(members)
    actor, critic = group.nets["actor"], group.nets["critic"]
    g = torch.Generator().manual_seed(2)
    obs = {"obs": torch.rand(2 * 3 * 4, 3, generator=g)}
    states = [torch.randn(2, 3, *group.rnn, generator=g) for _ in range(2)]
    starts = torch.rand(2, 3, 4, generator=g) < 0.3
    joint = sequences([actor, critic], obs, states, starts, 4)
    alone = [net.sequence(obs, s, starts, 4) for net, s in zip((actor, critic), states, strict=True)]
    for (out, new), (want_out, want_new) in zip(joint, alone, strict=True):
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(new, want_new)
    grads = [torch.autograd.grad(sum(o.square().sum() for o, _ in outs), actor.leaves + critic.leaves,
                                 materialize_grads=True) for outs in (joint, alone)]
    for a, w in zip(*grads, strict=True):
        torch.testing.assert_close(a, w)


@pytest.mark.parametrize("action", ["discrete", "box"])
def test_action_draws_taken_ahead_are_the_streams_next_draws(action):
    cfg = tiny_config(algorithm="ppo", env_id="CartPole-v1" if action == "discrete" else "Pendulum-v1",
                      hyperparameters={"rollout_steps": 16})
    arena = build_arena(cfg)
    ahead, step_by_step = (arena.algo_cls.group(arena.build_members([3, 4])) for _ in range(2))
    draws = ahead.action_draws(5, 6)
    out = torch.zeros(2, 6, ahead.agents[0].action_dim)
    for t in range(5):
        torch.testing.assert_close(ahead.sample(out, None, draws[t]), step_by_step.sample(out, None), rtol=0, atol=0)
    assert ahead.stream.counter == step_by_step.stream.counter


def test_a_stacked_update_of_recurrent_sequences_equals_the_per_member_one():
    hps = [{"lr": 1e-3, "update_epochs": 2, "num_minibatches": 2, "ent_coef": 0.01},
           {"lr": 3e-3, "update_epochs": 3, "num_minibatches": 3, "clip_coef": 0.1, "target_kl": 0.001},
           {"lr": 5e-4, "update_epochs": 2, "num_minibatches": 1, "vf_coef": 1.0}]
    solo = [rppo(70 + i, hidden=h, **hp) for i, (h, hp) in enumerate(zip((16, 24, 8), hps, strict=True))]
    stacked = [a.clone() for a in solo]
    width = 24
    buf = {"obs": {"obs": torch.zeros(10, 3, 3, 3)}, "actions": torch.zeros(10, 3, 3, dtype=torch.int64),
           "logprobs": torch.zeros(10, 3, 3), "rewards": torch.zeros(10, 3, 3), "dones": torch.zeros(10, 3, 3),
           "values": torch.zeros(10, 3, 3), "masks": None, "starts": torch.zeros(10, 3, 3, dtype=torch.bool),
           "states": {name: torch.zeros(10, 3, 3, 1, 2, width) for name in ("actor", "critic")}}
    adv, ret = torch.zeros(10, 3, 3), torch.zeros(10, 3, 3)
    sequences = []
    for i, h in enumerate((16, 24, 8)):
        r, a_i, r_i = _sequences(80 + i, hidden=h)
        sequences.append((r, a_i, r_i))
        for key, dst in (("actions", buf["actions"]), ("logprobs", buf["logprobs"]), ("values", buf["values"]),
                         ("starts", buf["starts"])):
            dst[:, i] = getattr(r, key)
        buf["obs"]["obs"][:, i] = r.obs["obs"]
        for name, st in r.states.items():
            buf["states"][name][:, i, :, :, :, :h] = st
        adv[:, i], ret[:, i] = a_i, r_i
    own = [ppo_learn_alone(a, r, 10, a_i, r_i) for a, (r, a_i, r_i) in zip(solo, sequences, strict=True)]  # alone
    group = PPO.group(stacked)
    stats = group.learn_stacked(*_members_sequences(buf, 10, 4, adv, ret))
    group.write_back()
    updates = stats["updates"].tolist()
    assert [o["updates"] for o in own] == updates and updates[1] < 9  # member 1 stopped early (its KL target)
    for a, u in zip(stacked, updates, strict=True):
        a.learn_steps += u  # (the arena counts them; ppo_learn_alone counts on the member)
    assert_same_members(solo, stacked, atol=1e-5)
    for o, s, u in zip(own, stats["loss_sum"].tolist(), updates, strict=True):
        assert s / u == pytest.approx(o["loss"], rel=1e-4, abs=1e-6)


def test_time_limit_cuts_bootstrapped_at_the_rollouts_end_equal_those_at_each_step():
    cfg = tiny_config(algorithm="ppo", env_backend="torch", population_size=2, num_envs=3, evo_steps=60,
                      env_kwargs={"max_episode_steps": 7}, hyperparameters={"rollout_steps": 8, "update_epochs": 2,
                                                                             "num_minibatches": 2})
    arena = build_arena(cfg)

    class PerStep(TorchGroupEnv):  # an env that does not say it is on the device: V at every step
        on_device = False

    runs = []
    for env_cls in (TorchGroupEnv, PerStep):
        members = arena.build_members([5, 6])
        group = arena.algo_cls.group(members)
        envs = env_cls(arena.recipe, 2, 3, arena.action_spec, group.device)
        runs.append((train_group_on_policy(group, [0, 1], envs, 60, [7, 8]), members))
    (deferred, a), (per_step, b) = runs
    assert [r.mean_loss for r in deferred] == pytest.approx([r.mean_loss for r in per_step], rel=1e-6)
    assert_same_members(a, b, atol=1e-6)


def test_stacking_members_is_one_row_each_and_parameters_are_views_of_their_columns():
    from agilerl_core.networks.stacked import parameter_blocks

    shapes = [[(3, 2), (3,)]] * 4
    flats = [torch.arange(9.0) + 10 * i for i in range(4)]
    stacked = stack_flats(flats, shapes, shapes[0])
    assert stacked.shape == (4, 9)
    torch.testing.assert_close(stacked[2], flats[2])
    weight, bias = parameter_blocks(stacked, 4, shapes[0])
    torch.testing.assert_close(weight[2], flats[2][:6].view(3, 2))
    torch.testing.assert_close(bias[1], flats[1][6:])
    weight.mul_(2.0)  # a block is a view: an in-place step on the state moves it, and the other way round
    torch.testing.assert_close(stacked[3, :6], 2.0 * flats[3][:6])
    back = [torch.zeros(9) for _ in range(4)]
    unstack_into(stacked, back, shapes, shapes[0])
    torch.testing.assert_close(back[0][6:], flats[0][6:])
    torch.testing.assert_close(back[0][:6], 2.0 * flats[0][:6])


def test_padded_members_round_trip_and_multi_network_rows():
    """Narrower members sit in the leading corner of each padded parameter (zeros around), network after network
    when a member's buffer holds several, and unstack back exactly."""
    shapes = [[(2, 3), (2,)], [(1, 2), (1,)]]
    padded = [(2, 3), (2,)]
    flats = [torch.arange(2 * 8.0), 100 + torch.arange(2 * 3.0)]  # two networks each
    stacked = stack_flats(flats, shapes, padded, networks=2)
    assert stacked.shape == (2, 16)
    second = stacked[1].view(2, 8)  # member 1's two networks, each padded to 8 values
    torch.testing.assert_close(second[1, :6].view(2, 3), torch.tensor([[103.0, 104.0, 0.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(second[1, 6:], torch.tensor([105.0, 0.0]))
    torch.testing.assert_close(stacked[0], flats[0])
    back = [torch.zeros(16), torch.zeros(6)]
    unstack_into(stacked, back, shapes, padded, networks=2)
    for a, b in zip(back, flats, strict=True):
        torch.testing.assert_close(a, b)
