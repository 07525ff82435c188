"""Evolvable networks: every mutation keeps every weight that still exists, bounds hold, spaces work."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from agilerl_core.config import NetworkConfig
from agilerl_core.envs.spaces import ObsSpec
from agilerl_core.networks import (
    LAYER_MUTATIONS,
    NODE_MUTATIONS,
    ArchBounds,
    ArchSpec,
    CNNSpec,
    EvolvableCNN,
    EvolvableMLP,
    EvolvableNetwork,
    MLPSpec,
    initial_arch,
    propose_mutation,
    with_activation,
)
from agilerl_core.networks.transfer import overlap_slices
from agilerl_core.rng import MemberDraws


def _assert_kept(old: torch.nn.Module, new: torch.nn.Module, centered=()):
    old_p = dict(old.named_parameters())
    checked = 0
    for name, p in new.named_parameters():
        if name not in old_p or name == "proj.weight":  # proj is matched per conv output cell, checked below
            continue
        cd = centered if p.ndim == 4 else ()
        s_new, s_old = overlap_slices(p.shape, old_p[name].shape, cd)
        assert torch.equal(p[s_new], old_p[name][s_old]), name
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("hidden", [(32,), (32, 64), (16, 16, 16)])
def test_mlp_every_mutation_keeps_weights_exactly(hidden):
    gen = torch.Generator().manual_seed(0)
    mlp = EvolvableMLP(MLPSpec(5, 3, hidden), gen)
    specs = {
        "add_layer": MLPSpec(5, 3, (*hidden, hidden[-1])),
        "remove_layer": MLPSpec(5, 3, hidden[:-1] or hidden),
        "add_nodes": MLPSpec(5, 3, tuple(h + 16 if i == 0 else h for i, h in enumerate(hidden))),
        "remove_nodes": MLPSpec(5, 3, tuple(h - 8 if i == len(hidden) - 1 else h for i, h in enumerate(hidden))),
        "activation": MLPSpec(5, 3, hidden, "tanh"),
    }
    for spec in specs.values():
        _assert_kept(mlp, mlp.rebuilt(spec, gen))


def test_mlp_growth_preserves_the_function():
    gen = torch.Generator().manual_seed(1)
    mlp = EvolvableMLP(MLPSpec(4, 2, (32, 32)), gen)
    x = torch.randn(64, 4)
    for spec in (MLPSpec(4, 2, (48, 32)), MLPSpec(4, 2, (32, 64)), MLPSpec(4, 2, (32, 32, 32))):
        new = mlp.rebuilt(spec, gen)
        torch.testing.assert_close(new(x), mlp(x), rtol=0, atol=1e-6)


def test_cnn_every_mutation_keeps_weights_exactly():
    gen = torch.Generator().manual_seed(0)
    base = CNNSpec((3, 32, 32), (16, 32), (5, 3), (2, 1), 64)
    cnn = EvolvableCNN(base, gen)
    variants = [
        CNNSpec((3, 32, 32), (24, 32), (5, 3), (2, 1), 64),  # add channels
        CNNSpec((3, 32, 32), (16, 24), (5, 3), (2, 1), 64),  # remove channels (last layer)
        CNNSpec((3, 32, 32), (16, 32), (3, 3), (2, 1), 64),  # change kernel
        CNNSpec((3, 32, 32), (16, 32), (5, 5), (2, 1), 64),  # grow kernel
        CNNSpec((3, 32, 32), (16, 32, 32), (5, 3, 3), (2, 1, 1), 64),  # add layer
        CNNSpec((3, 32, 32), (16,), (5,), (2,), 64),  # remove layer
    ]
    for spec in variants:
        new = cnn.rebuilt(spec, gen)
        _assert_kept(cnn, new, centered=(2, 3))
        # the projection keeps weights per (channel, row, column) of the conv output
        c0, h0, w0 = base.conv_output()
        c1, h1, w1 = spec.conv_output()
        old_w = cnn.proj.weight.view(-1, c0, h0, w0)
        new_w = new.proj.weight.view(-1, c1, h1, w1)
        c, h, w = min(c0, c1), min(h0, h1), min(w0, w1)
        assert torch.equal(new_w[:, :c, :h, :w], old_w[:, :c, :h, :w])
        assert new(torch.rand(2, 3, 32, 32)).shape == (2, 64)


def test_adding_channels_preserves_the_function():
    gen = torch.Generator().manual_seed(3)
    cnn = EvolvableCNN(CNNSpec((3, 16, 16), (8, 8), (3, 3), (1, 1), 16), gen)
    x = torch.rand(4, 3, 16, 16)
    for spec in (CNNSpec((3, 16, 16), (16, 8), (3, 3), (1, 1), 16), CNNSpec((3, 16, 16), (8, 24), (3, 3), (1, 1), 16)):
        torch.testing.assert_close(cnn.rebuilt(spec, gen)(x), cnn(x), rtol=0, atol=1e-6)


def test_mutations_respect_bounds():
    bounds = ArchBounds(min_hidden_layers=1, max_hidden_layers=3, min_nodes=16, max_nodes=64, node_changes=(16, 32),
                        min_conv_layers=1, max_conv_layers=2, min_channels=8, max_channels=32,
                        channel_changes=(8, 16), kernel_choices=(3, 5))
    spec = ObsSpec(spaces.Box(0, 255, (24, 24, 3), np.uint8))
    cfg = NetworkConfig(hidden_sizes=[32], min_nodes=16, max_nodes=64,
                        cnn={"channels": [8], "kernel_sizes": [3], "strides": [1], "latent_dim": 16},
                        rnn={"cell": "gru", "hidden_size": 32, "max_layers": 2})
    arch = initial_arch(spec, 2, cfg)
    rnn_in = arch.rnn.in_dim
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(400):
        name = str(rng.choice(LAYER_MUTATIONS + NODE_MUTATIONS))
        out = propose_mutation(arch, name, bounds, rng)
        if out is None:
            continue
        arch, _ = out
        seen.add(name)
        h = arch.mlp.hidden
        assert 1 <= len(h) <= 3 and all(16 <= x <= 64 for x in h)
        c = arch.cnns[0][1]
        assert 1 <= len(c.channels) <= 2 and all(8 <= x <= 32 for x in c.channels)
        assert all(k in (3, 5) for k in c.kernels[:1]) and c.is_valid()
        r = arch.rnn  # the core reads the (fixed-width) features; the head reads the core
        assert 16 <= r.hidden <= 64 and 1 <= r.layers <= 2 and r.in_dim == rnn_in and arch.mlp.in_dim == r.hidden
    assert seen == {n for n in LAYER_MUTATIONS + NODE_MUTATIONS if not n.startswith("enc.")}  # no Dict keys here
    # at the bounds the mutation is refused, never clipped silently into an invalid network
    at_max = initial_arch(ObsSpec(spaces.Box(-1, 1, (4,))), 2, NetworkConfig(hidden_sizes=[64, 64, 64], max_nodes=64,
                                                                              max_hidden_layers=3))
    assert propose_mutation(at_max, "mlp.add_layer", bounds, rng) is None
    assert propose_mutation(at_max, "mlp.add_nodes", bounds, rng) is None


@pytest.mark.parametrize("space, obs", [
    (spaces.Box(-1, 1, (6,), np.float32), lambda n: np.zeros((n, 6), np.float32)),
    (spaces.Box(0, 255, (12, 12, 3), np.uint8), lambda n: np.zeros((n, 12, 12, 3), np.uint8)),
    (spaces.Box(0, 1, (1, 12, 12), np.float32), lambda n: np.zeros((n, 1, 12, 12), np.float32)),
    (spaces.Discrete(7), lambda n: np.arange(n) % 7),
    (spaces.Dict({"img": spaces.Box(0, 255, (12, 12, 3), np.uint8), "d": spaces.Discrete(3),
                  "v": spaces.Box(-1, 1, (2,), np.float32)}),
     lambda n: {"img": np.zeros((n, 12, 12, 3), np.uint8), "d": np.zeros(n, np.int64), "v": np.zeros((n, 2), np.float32)}),
])
def test_observation_spaces(space, obs):
    spec = ObsSpec(space)
    cfg = NetworkConfig(cnn={"channels": [8], "kernel_sizes": [3], "strides": [1], "latent_dim": 16})
    net = EvolvableNetwork(spec, initial_arch(spec, 4, cfg), torch.Generator().manual_seed(0))
    out = net(spec.to_tensors(obs(5)))
    assert out.shape == (5, 4)
    assert net.plain_mlp == (not spec.has_images and not spec.is_dict)


def test_discrete_observation_is_one_hot():
    spec = ObsSpec(spaces.Discrete(4))
    vec, imgs = spec.preprocess(spec.to_tensors(np.array([2, 0])))
    assert torch.equal(vec, torch.tensor([[0.0, 0, 1, 0], [1, 0, 0, 0]])) and imgs == []


def test_channel_layout_detection():
    assert ObsSpec(spaces.Box(0, 255, (84, 84, 3), np.uint8)).parts[0].channels_last
    assert not ObsSpec(spaces.Box(0, 255, (3, 84, 84), np.uint8)).parts[0].channels_last
    assert ObsSpec(spaces.Box(0, 255, (3, 84, 84), np.uint8), channels_last=True).parts[0].channels_last


def test_unsupported_spaces_raise_config_errors():
    from agilerl_core.envs.spaces import action_dim
    from agilerl_core.errors import ConfigError

    with pytest.raises(ConfigError, match="env_id: observation .*Tuple"):
        ObsSpec(spaces.Tuple([spaces.Discrete(2)]))
    with pytest.raises(ConfigError, match="env_id: action space .*Discrete"):
        action_dim(gym.make("Pendulum-v1").action_space)


DICT_SPACE = spaces.Dict({"img": spaces.Box(0, 255, (12, 12, 3), np.uint8), "d": spaces.Discrete(3),
                          "v": spaces.Box(-1, 1, (2,), np.float32)})
DICT_CNN = {"channels": [8], "kernel_sizes": [3], "strides": [1], "latent_dim": 16}


def _dict_obs(n, rng):
    return {"img": rng.integers(0, 256, (n, 12, 12, 3)).astype(np.uint8), "d": rng.integers(0, 3, n),
            "v": rng.uniform(-1, 1, (n, 2)).astype(np.float32)}


def test_dict_observation_gets_an_encoder_per_key_feeding_one_head():
    spec = ObsSpec(DICT_SPACE)
    cfg = NetworkConfig(cnn=DICT_CNN, vector_encoder={"hidden_sizes": [16], "latent_dim": 8})
    arch = initial_arch(spec, 4, cfg)
    assert [k for k, _ in arch.encoders] == ["d", "v"] and [k for k, _ in arch.cnns] == ["img"]
    assert [s.in_dim for _, s in arch.encoders] == [3, 2]  # one-hot Discrete(3), Box(2)
    assert arch.mlp.in_dim == 8 + 8 + 16  # two key latents and the image latent
    net = EvolvableNetwork(spec, arch, torch.Generator().manual_seed(0))
    assert set(net.encoders) == {"d", "v"} and set(net.cnns) == {"img"}
    rng = np.random.default_rng(0)
    obs = _dict_obs(6, rng)
    other_v = {**obs, "v": rng.uniform(-1, 1, (6, 2)).astype(np.float32)}
    assert not torch.allclose(net(spec.to_tensors(obs)), net(spec.to_tensors(other_v)))
    # key "v" reaches the head only through its own encoder: silence that encoder and "v" no longer matters
    with torch.no_grad():
        net.encoders["v"].out.weight.zero_()
    torch.testing.assert_close(net(spec.to_tensors(obs)), net(spec.to_tensors(other_v)), rtol=0, atol=0)
    # ... while "d" still does
    other_d = {**obs, "d": (obs["d"] + 1) % 3}
    assert not torch.allclose(net(spec.to_tensors(obs)), net(spec.to_tensors(other_d)))


def test_dict_observation_can_be_flattened_instead():
    spec = ObsSpec(DICT_SPACE)
    arch = initial_arch(spec, 4, NetworkConfig(cnn=DICT_CNN, vector_encoder={"per_key": False}))
    assert arch.encoders == () and arch.mlp.in_dim == 3 + 2 + 16
    assert "encoders" not in arch.to_dict()  # flat layouts keep the checkpoint format they always had
    # a plain vector observation never gets key encoders
    assert initial_arch(ObsSpec(spaces.Box(-1, 1, (6,))), 2, NetworkConfig()).encoders == ()


def test_encoder_mutations_keep_the_function_and_respect_bounds():
    spec = ObsSpec(DICT_SPACE)
    cfg = NetworkConfig(cnn=DICT_CNN, vector_encoder={"hidden_sizes": [32], "latent_dim": 8})
    arch = initial_arch(spec, 4, cfg)
    gen = torch.Generator().manual_seed(1)
    net = EvolvableNetwork(spec, arch, gen)
    obs = spec.to_tensors(_dict_obs(5, np.random.default_rng(2)))
    bounds = ArchBounds(min_nodes=16, max_nodes=48, node_changes=(16,))
    rng = np.random.default_rng(0)
    grown, desc = propose_mutation(arch, "enc.add_nodes", bounds, rng)
    assert desc == "enc.add_nodes(layer=0, +16)"
    assert all(s.hidden == (48,) and s.out_dim == 8 for _, s in grown.encoders)  # every key's encoder, same latent
    assert grown.mlp == arch.mlp
    new = net.rebuilt(grown, gen)
    _assert_kept(net.encoders["v"], new.encoders["v"])
    torch.testing.assert_close(new(obs), net(obs), rtol=0, atol=1e-6)  # new units start with zero outgoing weights
    assert propose_mutation(grown, "enc.add_nodes", bounds, rng) is None  # at max_nodes
    shrunk, _ = propose_mutation(grown, "enc.remove_nodes", bounds, rng)
    assert all(s.hidden == (32,) for _, s in shrunk.encoders)
    assert ArchSpec.from_dict(shrunk.to_dict()) == shrunk
    relu_free = with_activation(shrunk, "tanh")
    assert {s.activation for _, s in relu_free.encoders} == {"tanh"}
    # flat observations never offer encoder mutations; Dict ones do
    from agilerl_core.networks.arch_mutation import applicable_mutations

    flat = initial_arch(ObsSpec(spaces.Box(-1, 1, (6,))), 2, NetworkConfig())
    assert applicable_mutations(flat, NODE_MUTATIONS) == ["mlp.add_nodes", "mlp.remove_nodes"]
    assert "enc.add_nodes" in applicable_mutations(arch, NODE_MUTATIONS)


def test_dict_agent_round_trips_through_its_state():
    from agilerl_core.algorithms.dqn import DQN
    from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters

    spec = ObsSpec(DICT_SPACE)
    arch = initial_arch(spec, 3, NetworkConfig(cnn=DICT_CNN))
    agent = DQN(spec, 3, arch, DQNHyperparameters(), seed=0)
    obs = spec.to_tensors(_dict_obs(4, np.random.default_rng(3)))
    tensors, meta = agent.state()
    assert any(k.startswith("net/q/encoders.v.") for k in tensors)
    again = DQN.from_state(spec, tensors, meta)
    torch.testing.assert_close(again.networks["q"](obs), agent.networks["q"](obs), rtol=0, atol=0)


# ---- stacked networks: K members in one batched pass ---------------------------------------------------
IMAGE_CNN = {"channels": [8, 16], "kernel_sizes": [3, 3], "strides": [2, 1]}


@pytest.mark.parametrize("case", [
    (spaces.Box(-1, 1, (4,), np.float32), {}, {}),
    (spaces.Box(-1, 1, (4,), np.float32), {}, {"noisy": True, "dueling": 1}),
    (spaces.Box(-1, 1, (4,), np.float32), {}, {"norm": True}),
    (spaces.Box(0, 255, (3, 16, 16), np.uint8), {"cnn": IMAGE_CNN}, {}),
    (spaces.Dict({"img": spaces.Box(0, 255, (12, 12, 3), np.uint8), "v": spaces.Box(-1, 1, (5,), np.float32),
                  "d": spaces.Discrete(3)}), {"cnn": IMAGE_CNN, "vector_encoder": {"per_key": True}}, {}),
], ids=["mlp", "noisy-dueling", "obs-norm", "image", "dict-image-vector-discrete"])
def test_a_stacked_network_computes_what_each_member_computes(case):
    """Members of other hidden widths (zero-padded) with their own weights, noise and normalisation: the
    stacked forward equals each member's own network on its own observations."""
    from dataclasses import replace

    from agilerl_core.algorithms.group_state import padded_shapes, param_shapes, stack_flats
    from agilerl_core.networks.obs_norm import RunningObsNorm, StackedObsNorm
    from agilerl_core.networks.stacked import StackedNetwork

    space, net_cfg, opts = case
    spec = ObsSpec(space)
    nets = []
    for i, hidden in enumerate([(16, 16), (32, 8), (8, 24)]):
        arch = initial_arch(spec, 6, NetworkConfig(hidden_sizes=list(hidden), min_nodes=1, **net_cfg))
        arch = replace(arch, mlp=replace(arch.mlp, noisy=opts.get("noisy", False), dueling=opts.get("dueling", 0)))
        net = EvolvableNetwork(spec, arch, torch.Generator().manual_seed(i))
        if opts.get("norm"):
            net.obs_norm = RunningObsNorm(spec.vector_dim)
            net.obs_norm.update(torch.randn(50, spec.vector_dim) * 3 + i)
        nets.append(net)
    shapes = [param_shapes(n) for n in nets]
    padded = padded_shapes(shapes)
    flats = [torch.cat([p.detach().reshape(-1) for p in n.parameters()]) for n in nets]
    norm = StackedObsNorm([n.obs_norm for n in nets], "cpu") if opts.get("norm") else None  # the group's statistics
    stacked = StackedNetwork([n.layout() for n in nets], stack_flats(flats, shapes, padded), padded, norm=norm)
    keys = list(space.spaces) if isinstance(space, spaces.Dict) else ["obs"]
    sub = (lambda k: space[k]) if isinstance(space, spaces.Dict) else (lambda k: space)
    obs = [{k: torch.as_tensor(np.stack([sub(k).sample() for _ in range(5)])) for k in keys} for _ in nets]
    if opts.get("noisy"):  # the group's keyed noise: member i's layers take the first of its layer's values
        stacked.resample_noise(MemberDraws(torch.tensor([5, 6, 7]), 1), torch.ones(3, dtype=torch.bool))
        for i, n in enumerate(nets):
            modules = dict(n.named_modules())
            for name, n_in, n_out in stacked.noisy_layers[i]:
                modules[name].eps_in.copy_(stacked.eps[name][0][i, :n_in])
                modules[name].eps_out.copy_(stacked.eps[name][1][i, :n_out])
                modules[name].noise_on = True
                assert not stacked.eps[name][0][i, n_in:].any()
    for grouped in (False, True) if spec.has_images else (False,):  # convolutions: each member's, or grouped
        stacked.grouped_convs = grouped
        out = stacked({k: torch.cat([o[k] for o in obs]) for k in keys})
        assert out.shape == (3, 5, 6)
        for i, n in enumerate(nets):
            torch.testing.assert_close(out[i], n(obs[i]), rtol=1e-5, atol=1e-5)
