"""Selection as a gather: a selection's clones are rows of one state, gathered from their parents' in one op per
buffer (`RLAlgorithm.clone_many`, `Population.evolve`), each equal to what `clone` makes and independent of its
parent and siblings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agilerl_core.algorithms.group_state import gather_rows, rows_of
from agilerl_core.hpo.evolvable import MutationSettings
from agilerl_core.hpo.population import clone_all
from tests.test_group import dqn, filled_buffer, ppo, td3
from tests.test_group_teams import team


def _sac(seed):
    from agilerl_core.algorithms.actor_critic import SAC

    return td3(seed, SAC)


def _team(seed):
    from tests.test_multi_agent import SPEAKER_LISTENER

    return team(SPEAKER_LISTENER, seed)


FAMILIES = {"dqn": dqn, "rainbow": lambda s: dqn(s, n_step=3, per=True, noisy=True, dueling=True, distributional=True),
            "obs-norm": lambda s: dqn(s, normalize_obs=True), "td3": td3, "sac": _sac, "ppo": ppo,
            "ppo-box": lambda s: ppo(s, continuous=True), "matd3": _team}


def _trained(make, seeds):
    """Members that differ in weights, Adam state, step powers, targets and generators (a few steps each)."""
    agents = [make(s) for s in seeds]
    for i, a in enumerate(agents):
        a.mutate("parameters", np.random.default_rng(i), MutationSettings(0.0, 0.2, None))
        for adam in a._adams().values():  # as after learning: moments and powers of their own
            g = torch.Generator().manual_seed(100 + i)
            adam.m.copy_(torch.randn(adam.m.shape, generator=g))
            adam.v.copy_(torch.rand(adam.v.shape, generator=g))
            adam.beta1_pow.mul_(0.9 ** (i + 1))
        for flat in a.target_buffers().values():  # targets of their own too
            flat.mul_(0.5)
        a.env_steps, a.learn_steps = 100 * (i + 1), 7 * i
        a.np_rng.random(i + 1)
        torch.rand(i + 1, generator=a.torch_gen)
    return agents


def _same(a, b):
    ta, ma = a.state()
    tb, mb = b.state()
    assert ma == mb
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


@pytest.mark.parametrize("family", list(FAMILIES))
def test_clones_gathered_as_rows_equal_clones_one_by_one(family):
    """Every child (a parent picked twice, one not at all) is what `clone` makes of its parent, to the bit; the
    children's buffers are the rows of one state in slot order (their next group adopts them as they are), their
    networks read those rows, and a child changed in place changes neither its parent nor its twin."""
    parents = _trained(FAMILIES[family], [11, 12, 13])
    if family != "matd3":  # as after a training phase: the parents are rows of one group's state
        type(parents[0]).group(parents)
    picks = [parents[2], parents[0], parents[2]]
    expected = [p.clone() for p in picks]
    children = type(parents[0]).clone_many(picks)
    for child, want in zip(children, expected, strict=True):
        _same(child, want)
    # a child is its buffers: no module built for it (its checkpoint state read through its layouts)
    assert all(c._networks is None for c in children)
    names = list(children[0].flat_buffers())
    for name in names:
        state = rows_of([c.flat_buffers()[name] for c in children])
        assert state is not None and state.shape[0] == 3, name
    for c in children:  # each network parameter a view of the child's rows
        ptrs = {b.untyped_storage().data_ptr() for b in c.flat_buffers().values()}
        assert all(p.untyped_storage().data_ptr() in ptrs for net in c.networks.values() for p in net.parameters())
    before = [p.state()[0] for p in parents]
    children[0].mutate("parameters", np.random.default_rng(5), MutationSettings(0.0, 0.5, None))
    for p, b in zip(parents, before, strict=True):
        assert all(torch.equal(v, b[k]) for k, v in p.state()[0].items())
    _same(children[2], expected[2])
    group = type(children[0]).group(children)  # adopted as they are: no stack
    first = names[0].split("/")[1]
    adam = group.adams.get(first) or next(iter(group.adams.values()))
    assert any(adam.flat is rows_of([c.flat_buffers()[n] for c in children]) for n in names if n.endswith("/flat"))


def test_a_selection_of_mixed_architectures_gathers_each_architecture_apart():
    """Children of parents of two widths: each width's children are rows of a state of their own, in slot
    order, and every child equals its parent's clone."""
    parents = [dqn(1), dqn(2, hidden=(8, 8)), dqn(3)]
    picks = [parents[1], parents[0], parents[2], parents[1]]
    children = clone_all(picks)
    for child, parent in zip(children, picks, strict=True):
        _same(child, parent.clone())
    wide = [children[1].optimizers["q"].flat, children[2].optimizers["q"].flat]
    narrow = [children[0].optimizers["q"].flat, children[3].optimizers["q"].flat]
    assert rows_of(wide) is not None and rows_of(narrow) is not None


def test_gather_rows_is_one_index_gather_over_a_state_and_a_stack_otherwise():
    state = torch.arange(12.0).view(3, 4)
    rows = gather_rows([state[2], state[0], state[2]])
    assert torch.equal(rows, state[[2, 0, 2]]) and rows.untyped_storage().data_ptr() != state.untyped_storage().data_ptr()
    loose = [torch.ones(4), torch.zeros(4)]
    assert torch.equal(gather_rows(loose), torch.stack(loose))
    assert torch.equal(gather_rows([state[1][:4], state[0]]), state[[1, 0]])  # whole rows of one state
    part = gather_rows([state[0][1:3], state[1][1:3]])  # parts of rows: stacked, not gathered
    assert torch.equal(part, state[:2, 1:3])


def test_children_learn_as_their_parents_clones_do():
    """A gathered child and its parent's clone take the same learn steps to the same weights (the rows are
    a member's whole state, nothing left behind in the shell)."""
    parents = _trained(dqn, [4, 5])
    type(parents[0]).group(parents)
    children = type(parents[0]).clone_many([parents[1], parents[1]])
    twins = [parents[1].clone(), parents[1].clone()]
    buf = filled_buffer(2)
    for members in (children, twins):
        group = type(members[0]).group(members)
        for _ in range(3):
            group.learn_step(buf, [0, 1], [True, True])
        group.update_targets([0.5, 0.5])
        group.write_back()
    assert all(c._networks is None for c in children)  # trained, checked and saved without a module built
    for a, b in zip(children, twins, strict=True):
        _same(a, b)
    obs = {"obs": torch.randn(5, 3)}
    nets = children[0].networks  # built on first use over its rows: the twin's function
    assert torch.equal(nets["q"](obs), twins[0].networks["q"](obs))
    group = type(children[0]).group(children)  # a built network follows its member into the next group's rows
    group.learn_step(buf, [0, 1], [True, True])
    group.write_back()
    assert children[0].networks is nets and not torch.equal(nets["q"](obs), twins[0].networks["q"](obs))
    want = {k: v for k, v in children[0].state()[0].items() if k.startswith("net/q/")}
    assert all(torch.equal(p.detach(), want[f"net/q/{k}"]) for k, p in nets["q"].named_parameters())
