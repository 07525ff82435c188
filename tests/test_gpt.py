"""Evolvable GPT: seeded init, causality, growth that keeps the function, hostile specs, bounds, the stacked pass."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from agilerl_core.limits import applied
from agilerl_core.networks.gpt import EvolvableGPT, GPTBounds, GPTSpec, propose_gpt_mutation

SPEC = GPTSpec(vocab_size=40, block_size=32, n_layer=2, n_embd=32, n_head=2, head_dim=8, mlp_hidden=64)


def make(seed: int = 0, spec: GPTSpec = SPEC) -> EvolvableGPT:
    return EvolvableGPT(spec, torch.Generator().manual_seed(seed))


def tokens(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, SPEC.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def test_same_seed_same_weights_and_param_count():
    a, b, c = make(0), make(0), make(1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.wte.weight, c.wte.weight)
    assert SPEC.param_count() == sum(p.numel() for p in a.parameters())
    assert SPEC.describe() == "gpt L2 E32 H2x8 M64"
    assert GPTSpec.from_dict(SPEC.to_dict()) == SPEC


def test_shapes_and_context_limit():
    net, idx = make(), tokens(3, 20)
    assert net.hidden(idx).shape == (3, 20, 32)
    assert net(idx).shape == (3, 20, 40)
    with pytest.raises(ValueError, match="33.*block_size = 32"):
        net(tokens(1, 33))


def test_causal():
    net, idx = make(), tokens(2, 16)
    changed = idx.clone()
    changed[:, 9] = (changed[:, 9] + 1) % SPEC.vocab_size
    with torch.no_grad():
        a, b = net(idx), net(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9], atol=0, rtol=0)
    assert not torch.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("change", [{"n_layer": 4}, {"n_head": 3}, {"mlp_hidden": 96},
                                    {"n_layer": 3, "n_head": 4, "mlp_hidden": 128}])
def test_growth_keeps_the_function(change):
    net, idx = make(), tokens(4, 32)
    for p in net.parameters():  # trained-looking weights: LayerNorms and biases away from their init
        p.data.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    child = net.rebuilt(replace(SPEC, **change), torch.Generator().manual_seed(7))
    with torch.no_grad():
        torch.testing.assert_close(child(idx), net(idx), atol=1e-6, rtol=0)
    if "n_head" in change:  # a new head is alive: random q/k/v rows, so it can learn
        new_rows = child.blocks[0].qkv.weight.view(3, change["n_head"], 8, 32)[:, SPEC.n_head:]
        assert new_rows.abs().min() > 0
    # training reaches the new parts
    F.cross_entropy(child(idx).flatten(0, 1), idx.flatten()).backward()
    assert child.blocks[-1].attn_out.weight.grad.abs().sum() > 0


def test_shrink_keeps_the_remaining_weights():
    net = make()
    child = net.rebuilt(replace(SPEC, n_layer=1, n_head=1, mlp_hidden=32))
    old, new = net.blocks[0], child.blocks[0]
    assert len(child.blocks) == 1
    torch.testing.assert_close(new.qkv.weight.view(3, 8, 32), old.qkv.weight.view(3, 2, 8, 32)[:, 0])
    torch.testing.assert_close(new.attn_out.weight, old.attn_out.weight[:, :8])
    torch.testing.assert_close(new.mlp_in.weight, old.mlp_in.weight[:32])
    torch.testing.assert_close(new.mlp_out.weight, old.mlp_out.weight[:, :32])
    torch.testing.assert_close(child.lm_head.weight, net.lm_head.weight)
    torch.testing.assert_close(child.wte.weight, net.wte.weight)


@pytest.mark.parametrize("change", [{"vocab_size": 41}, {"block_size": 64}, {"n_embd": 48}, {"head_dim": 16}])
def test_rebuild_refuses_fixed_fields(change):
    with pytest.raises(ValueError, match=next(iter(change))):
        make().rebuilt(replace(SPEC, **change))


@pytest.mark.parametrize("bad, match", [
    ({"n_layer": "2"}, "n_layer: expected a whole number"),
    ({"n_embd": 32.0}, "n_embd: expected a whole number"),
    ({"n_head": True}, "n_head: expected a whole number"),
    ({"mlp_hidden": 0}, "mlp_hidden: 0 must be at least 1"),
    ({"head_dim": -8}, "head_dim: -8 must be at least 1"),
    ({"n_embd": 10**6}, "n_embd.*limits.layer_width"),
    ({"n_layer": 65}, "n_layer.*limits.layer_count"),
    ({"dropout": 0.1}, r"unknown fields \['dropout'\]"),
])
def test_from_dict_refuses(bad, match):
    with pytest.raises(ValueError, match=match):
        GPTSpec.from_dict({**SPEC.to_dict(), **bad}, where="member.json: agent.arch")
    with pytest.raises(ValueError, match="expected an object"):
        GPTSpec.from_dict([1, 2])
    with pytest.raises(ValueError, match=r"missing fields \['n_head'\]"):
        GPTSpec.from_dict({k: v for k, v in SPEC.to_dict().items() if k != "n_head"})


def test_from_dict_counts_parameters_before_allocating(monkeypatch):
    huge = {**SPEC.to_dict(), "n_layer": 60, "n_embd": 8000, "mlp_hidden": 8000, "vocab_size": 8000}
    monkeypatch.setattr(EvolvableGPT, "__init__", lambda *a: pytest.fail("allocated"))
    with pytest.raises(ValueError, match="parameters counted from the arch.*limits.network_params"):
        GPTSpec.from_dict(huge)
    with applied({"network_params": SPEC.param_count() - 1}), pytest.raises(ValueError, match="network_params"):
        GPTSpec.from_dict(SPEC.to_dict())
    with applied({"network_params": SPEC.param_count()}):
        assert GPTSpec.from_dict(SPEC.to_dict()) == SPEC


def test_propose_respects_bounds():
    bounds = GPTBounds(min_layers=1, max_layers=3, min_heads=1, max_heads=3, min_mlp_hidden=32, max_mlp_hidden=128,
                       mlp_step=32)
    rng, spec, seen = np.random.default_rng(0), SPEC, set()
    for _ in range(200):
        out = propose_gpt_mutation(spec, bounds, rng)
        assert out is not None
        spec, name = out
        seen.add(name)
        assert 1 <= spec.n_layer <= 3 and 1 <= spec.n_head <= 3 and 32 <= spec.mlp_hidden <= 128
        assert spec.mlp_hidden % 32 == 0
    assert seen == {"add_layer", "remove_layer", "add_head", "remove_head", "grow_mlp", "shrink_mlp"}
    fixed = GPTBounds(2, 2, 2, 2, 64, 64, 32)
    assert propose_gpt_mutation(SPEC, fixed, rng) is None
    with applied({"network_params": SPEC.param_count()}):  # any growth would break the limit: only shrinking
        names = {propose_gpt_mutation(SPEC, bounds, rng)[1] for _ in range(50)}
    assert names == {"remove_layer", "remove_head", "shrink_mlp"}


def test_learns_a_repeated_pattern():
    torch.manual_seed(0)
    net = make(spec=replace(SPEC, n_layer=1))
    pattern = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    idx = pattern.repeat(4)[None, :SPEC.block_size].repeat(8, 1)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(200):
        loss = F.cross_entropy(net(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if loss.item() < losses[0] / 2:
            break
    assert losses[-1] < losses[0] / 2, losses[::20]
