"""Recurrent PPO: the LSTM/GRU core's maths, its episode resets, population batching of members of different
hidden sizes, function-preserving growth, acting with memory, and a POMDP run that trains deterministically."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from agilerl_core.algorithms.acting import Acting
from agilerl_core.algorithms.hyperparameters.ppo import PPOHyperparameters
from agilerl_core.algorithms.ppo import PPO
from agilerl_core.buffers.rollout import Rollout
from agilerl_core.config import NetworkConfig, RNNConfig, load_config
from agilerl_core.envs.spaces import ObsSpec
from agilerl_core.errors import ConfigError
from agilerl_core.networks import initial_arch
from agilerl_core.networks.arch_mutation import propose_mutation
from agilerl_core.networks.evolvable import ArchBounds, EvolvableNetwork
from agilerl_core.networks.recurrent import EvolvableRNN, RNNSpec
from tests.conftest import ppo_learn_alone, ppo_rows
from tests.test_group import assert_same_members

SPEC = ObsSpec(spaces.Box(-1, 1, (3,), np.float32))


def rppo(seed, cell="lstm", hidden=16, layers=1, **hp):
    net = NetworkConfig(hidden_sizes=[16], min_nodes=1, rnn=RNNConfig(cell=cell, hidden_size=hidden, num_layers=layers))
    return PPO(SPEC, 3, initial_arch(SPEC, 3, net), PPOHyperparameters(**{"seq_len": 4, **hp}), seed)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_cells_compute_what_torch_lstm_and_gru_compute(cell):
    """Known answers: two stacked layers over a sequence equal torch.nn.LSTM / torch.nn.GRU with the same weights
    (torch's gate order i, f, g, o and r, z, n is ours, gate-major)."""
    g = torch.Generator().manual_seed(0)
    core = EvolvableRNN(RNNSpec(cell, 5, 7, 2), g)
    ref = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(5, 7, num_layers=2, batch_first=True)
    with torch.no_grad():
        for i, layer in enumerate(core.layers):
            for ours, theirs in (("w_ih", "weight_ih"), ("w_hh", "weight_hh"), ("b_ih", "bias_ih"), ("b_hh", "bias_hh")):
                getattr(ref, f"{theirs}_l{i}").copy_(getattr(layer, ours).reshape(getattr(ref, f"{theirs}_l{i}").shape))
    x = torch.randn(4, 6, 5, generator=g)
    out, state = core(x, None, None)
    want, hidden = ref(x)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    h = hidden[0] if cell == "lstm" else hidden
    torch.testing.assert_close(state[:, :, 0], h.transpose(0, 1), rtol=1e-5, atol=1e-6)
    if cell == "lstm":
        torch.testing.assert_close(state[:, :, 1], hidden[1].transpose(0, 1), rtol=1e-5, atol=1e-6)


def test_an_episode_start_zeroes_the_state_before_its_step():
    g = torch.Generator().manual_seed(1)
    core = EvolvableRNN(RNNSpec("lstm", 3, 8, 1), g)
    x = torch.randn(2, 7, 3, generator=g)
    starts = torch.zeros(2, 7, dtype=torch.bool)
    starts[0, 4] = True
    state0 = torch.randn(2, 1, 2, 8, generator=g)
    out, _ = core(x, state0, starts)
    tail, _ = core(x[:1, 4:], None, None)
    torch.testing.assert_close(out[0, 4:], tail[0])
    assert not torch.allclose(out[1, 4:], core(x[1:, 4:], None, None)[0][0])  # the other env remembers


def test_growing_the_core_keeps_the_function_and_shrinking_keeps_the_weights():
    net_cfg = NetworkConfig(hidden_sizes=[16], min_nodes=1, node_changes=[8],
                            rnn=RNNConfig(cell="gru", hidden_size=16))
    arch = initial_arch(SPEC, 3, net_cfg)
    net = EvolvableNetwork(SPEC, arch, torch.Generator().manual_seed(2))
    obs = [{"obs": torch.rand(5, 3) * 2 - 1} for _ in range(4)]
    bounds = ArchBounds.from_config(net_cfg)
    grown_arch, desc = propose_mutation(arch, "rnn.add_nodes", bounds, np.random.default_rng(0))
    assert grown_arch.rnn.hidden == 24 and grown_arch.mlp.in_dim == 24 and desc == "rnn.add_nodes(+8)"
    grown = net.rebuilt(grown_arch, torch.Generator().manual_seed(3))
    s1 = s2 = None
    for o in obs:
        a, s1 = net.step(o, s1)
        b, s2 = grown.step(o, s2)
        torch.testing.assert_close(a, b)
    layered, _ = propose_mutation(arch, "rnn.add_layer", bounds, np.random.default_rng(0))
    assert layered.rnn.layers == 2 and propose_mutation(layered, "rnn.add_layer", bounds, np.random.default_rng(0)) is None
    with pytest.raises(TypeError, match="step"):
        net(obs[0])


def _sequences(seed, n_envs=3, steps=10, hidden=16, layers=1):
    """A recurrent rollout of random experience (states stored as the member's own width), cut into sequences."""
    g = torch.Generator().manual_seed(seed)
    r = Rollout.allocate(steps, n_envs, {"obs": torch.zeros(n_envs, 3)}, (), torch.int64)
    r.with_states({"actor": (layers, 2, hidden), "critic": (layers, 2, hidden)})
    r.obs["obs"].copy_(torch.rand(steps, n_envs, 3, generator=g) * 2 - 1)
    r.actions.copy_(torch.randint(0, 3, (steps, n_envs), generator=g))
    r.logprobs.copy_(-torch.rand(steps, n_envs, generator=g) * 2)
    r.values.copy_(torch.randn(steps, n_envs, generator=g))
    r.starts.copy_(torch.rand(steps, n_envs, generator=g) < 0.15)
    for st in r.states.values():
        st.copy_(torch.randn(st.shape, generator=g) * 0.3)
    return r, torch.randn(steps, n_envs, generator=g), torch.randn(steps, n_envs, generator=g)


def test_sequences_cut_a_rollout_into_whole_padded_chunks():
    r, adv, ret = _sequences(0, n_envs=2, steps=10)
    data, a, _ = r.sequences(10, 4, adv, ret)
    assert data["valid"].shape == (6, 4) and int(data["valid"].sum()) == 20  # 3 chunks x 2 envs, 2 padded steps
    torch.testing.assert_close(data["obs"]["obs"][3], r.obs["obs"][4:8, 1])  # chunk 1 of env 1
    torch.testing.assert_close(data["state/actor"][3], r.states["actor"][4, 1])  # the state before the chunk
    torch.testing.assert_close(a[5, :2], adv[8:10, 1])
    assert not data["valid"][5, 2:].any()


def stack_sequence_rows(rows: list) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Members' sequence rows (tests.conftest.ppo_rows) stacked as :meth:`PPOGroup.learn_stacked` takes them, a
    narrower core's stored states zero-padded to the widest."""
    width = max(d["state/actor"].shape[-1] for d, _, _ in rows)

    def stacked(get):
        parts = [get(d) for d, _, _ in rows]
        return torch.stack([torch.nn.functional.pad(x, (0, width - x.shape[-1])) for x in parts]) \
            if parts[0].dim() == 4 else torch.stack(parts)

    data = {"obs": {"obs": stacked(lambda d: d["obs"]["obs"])},
            **{key: stacked(lambda d, key=key: d[key]) for key in rows[0][0] if key != "obs"}}
    return data, torch.stack([a for _, a, _ in rows]), torch.stack([r for _, _, r in rows])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_group_of_different_core_sizes_learns_as_each_member_alone(cell):
    hps = [{"lr": 1e-3, "update_epochs": 2, "num_minibatches": 2, "ent_coef": 0.01},
           {"lr": 3e-3, "update_epochs": 3, "num_minibatches": 3, "clip_coef": 0.1},
           {"lr": 5e-4, "update_epochs": 2, "num_minibatches": 1, "vf_coef": 1.0}]
    hidden = [16, 24, 8]
    solo = [rppo(50 + i, cell, hidden[i], **hp) for i, hp in enumerate(hps)]
    together = [a.clone() for a in solo]
    parts = (2 if cell == "lstm" else 1)
    rollouts = []
    for i, h in enumerate(hidden):
        r, adv, ret = _sequences(60 + i, hidden=h)
        if parts == 1:
            r.states = {k: v[:, :, :, :1] for k, v in r.states.items()}
        rollouts.append((r, adv, ret))
    own = [ppo_learn_alone(a, r, 10, adv, ret) for a, (r, adv, ret) in zip(solo, rollouts, strict=True)]
    assert len({a.batch_key() for a in together}) == 1
    group = PPO.group(together)
    rows = [ppo_rows(a, r, 10, adv, ret) for a, (r, adv, ret) in zip(together, rollouts, strict=True)]
    stats = group.learn_stacked(*stack_sequence_rows(rows))
    group.write_back()
    for a, u in zip(together, stats["updates"].tolist(), strict=True):
        a.learn_steps += u  # (the arenas count them)
    assert_same_members(solo, together, atol=1e-5)
    assert stats["updates"].tolist() == [o["updates"] for o in own]
    for s, u, o in zip(stats["loss_sum"].tolist(), stats["updates"].tolist(), own, strict=True):
        assert s / u == pytest.approx(o["loss"], rel=1e-4, abs=1e-6)


def test_greedy_acting_remembers_until_reset():
    """A recurrent member acting alone (its group of one, as Policy.predict acts) carries its state from call to
    call; reset(done) starts those envs again, reset() every env."""
    agent = rppo(3)
    obs = {"obs": torch.rand(2, 3) * 2 - 1}
    acting = Acting(agent)
    acting.actions(obs)
    first = acting.group.act_state["actor"].clone()
    assert first.abs().sum() > 0
    acting.actions(obs)
    assert not torch.allclose(acting.group.act_state["actor"], first)  # it went on from the first call's state
    acting.reset(np.array([True, False]))
    before = acting.group.act_state["actor"].clone()
    acting.actions(obs)
    after = acting.group.act_state["actor"]
    torch.testing.assert_close(after[0, 0], first[0, 0])  # env 0 started afresh: its first step's state again
    assert not torch.allclose(after[0, 1], before[0, 1])
    acting.reset()
    acting.actions(obs)
    torch.testing.assert_close(acting.group.act_state["actor"], first)


def _config(tmp_path, **extra):
    text = f"""
kind: gym
env_id: CartPole-v1
env_wrappers: [{{wrapper: agilerl_core.envs.wrappers.KeepObservation, kwargs: {{indices: [0, 2]}}}}]
num_envs: 2
algorithm: ppo
hyperparameters: {{rollout_steps: 16, seq_len: 4, num_minibatches: 2, update_epochs: 2}}
network: {{hidden_sizes: [16], min_nodes: 8, node_changes: [8], rnn: {{cell: lstm, hidden_size: 16}}}}
mutation: {{architecture: 1.0, no_mutation: 0.0, parameters: 0.0, rl_hp: 0.0}}
population_size: 3
evo_steps: 64
eval_episodes: 2
max_env_steps: 960
seed: 4
output_dir: {tmp_path}
"""
    path = tmp_path / "rppo.yaml"
    path.write_text(text)
    return load_config(path, overrides=extra) if extra else load_config(path)


def test_a_pomdp_run_trains_batched_and_deterministically(tmp_path):
    import agilerl_core as ac

    runs = [ac.evolve(_config(tmp_path), progress=False, run_dir=tmp_path / f"run{i}") for i in range(2)]
    assert runs[0].summary["batching"] == "on"
    assert [h.fitnesses for h in runs[0].history] == [h.fitnesses for h in runs[1].history]
    assert any("rnn." in m for h in runs[0].history for m in h.mutations)  # the core mutated and still trained
    policy = runs[0].elite
    policy.reset()
    action = policy.predict(np.zeros(2, dtype=np.float32))
    assert action in (0, 1)
    with pytest.raises(ValueError, match="shape"):
        policy.predict(np.zeros(4, dtype=np.float32))  # the wrapped env's observations, not CartPole's


def test_a_recurrent_core_is_refused_where_it_cannot_train(tmp_path):
    with pytest.raises(ConfigError, match="network.rnn"):
        _config(tmp_path, algorithm="dqn", hyperparameters={})
