"""Population-batched learning: a stacked group's update equals each member's own update."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from agilerl_core.algorithms.dqn import DQN
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters
from agilerl_core.buffers import ReplayBuffer, transition_fields
from agilerl_core.buffers.replay import n_step_return
from agilerl_core.config import NetworkConfig
from agilerl_core.envs.spaces import ObsSpec
from agilerl_core.evolution import groups_of
from agilerl_core.hpo.evolvable import MutationSettings
from agilerl_core.networks import initial_arch
from tests.conftest import ppo_learn_alone

SPEC = ObsSpec(spaces.Box(-1, 1, (3,), np.float32))


def dqn(seed, hidden=(16, 16), **hp):
    arch = initial_arch(SPEC, 2, NetworkConfig(hidden_sizes=list(hidden), min_nodes=1))
    return DQN(SPEC, 2, arch, DQNHyperparameters(**hp), seed)


def filled_buffer(slots: int, mask: bool = False, n_step: int = 1) -> ReplayBuffer:
    """Committed transitions plus fresh ones in every slot, all random (a fixed generator); with `n_step`,
    n-step rows of random horizons."""
    g = torch.Generator().manual_seed(7)
    buf = ReplayBuffer(transition_fields(SPEC, 2 if mask else None, n_step=n_step), 500)

    def rows(n):
        data = {"obs.obs": torch.rand(n, 3, generator=g) * 2 - 1, "next_obs.obs": torch.rand(n, 3, generator=g) * 2 - 1,
                "action": torch.randint(0, 2, (n,), generator=g), "reward": torch.randn(n, generator=g),
                "terminated": (torch.rand(n, generator=g) < 0.1).float()}
        if mask:
            m = torch.rand(n, 2, generator=g) < 0.7
            data["next_action_mask"] = m
        if n_step > 1:
            length = torch.randint(1, n_step + 1, (n,), generator=g)
            steps = torch.randn(n, n_step, generator=g) * (torch.arange(n_step) < length.unsqueeze(1))
            data.update(step_rewards=steps, length=length.float(), reward=steps[:, 0].clone())
        return data

    buf.commit([rows(300)])
    buf.reserve_staging(slots, 64)
    for s in range(slots):
        buf.add(s, rows(40 + 8 * s))
    return buf


def state_of(agent):
    tensors, _ = agent.state()
    return {k: v for k, v in tensors.items() if not k.startswith("rng/")}


def assert_same_members(a_list, b_list, atol=1e-5):
    for a, b in zip(a_list, b_list, strict=True):
        sa, sb = state_of(a), state_of(b)
        assert sa.keys() == sb.keys()
        for k in sa:
            torch.testing.assert_close(sa[k], sb[k], atol=atol, rtol=1e-4, msg=k)
        assert a.learn_steps == b.learn_steps
        if hasattr(a, "torch_gen"):  # a team's generators are in its state
            assert torch.equal(a.torch_gen.get_state(), b.torch_gen.get_state())


def learn_alone_and_together(solo, buf, plan):
    """Each member's own learn steps per `plan` (rows: which members step), then a clone group's batched
    steps on the same plan; returns (the batched clones, each step's per-member losses)."""
    batched = [a.clone() for a in solo]
    alone = [type(a).group([a]) for a in solo]  # alone: a group of one
    for active in plan:
        for slot, (g, on) in enumerate(zip(alone, active, strict=True)):
            if on:
                g.learn_step(buf, [slot], [True])
    for g in alone:
        g.write_back()
    assert len({a.batch_key() for a in batched}) == 1
    group = type(batched[0]).group(batched)
    losses = [group.learn_step(buf, list(range(len(solo))), active) for active in plan]
    group.write_back()
    return batched, losses


@pytest.mark.parametrize("options", [
    {"double": True, "loss": "mse"},
    {"double": False, "loss": "huber", "max_grad_norm": 0.5},
    {"double": True, "loss": "mse", "hard_update_every": 2},
])
@pytest.mark.parametrize("mask", [False, True])
def test_dqn_group_update_equals_each_members_own(options, mask):
    """Three members with their own lr, gamma, tau and batch size: five batched steps (the third with
    member 1 sitting out, as when its learn_step earns it fewer steps) equal each member's own steps."""
    hps = [{"lr": 1e-3, "gamma": 0.99, "tau": 0.01, "batch_size": 32},
           {"lr": 3e-3, "gamma": 0.9, "tau": 0.05, "batch_size": 48},
           {"lr": 5e-4, "gamma": 0.95, "tau": 0.1, "batch_size": 16}]
    solo = [dqn(10 + i, **hp, **options) for i, hp in enumerate(hps)]
    plan = [[True, True, True], [True, True, True], [True, False, True], [True, True, True], [False, True, True]]
    batched, losses = learn_alone_and_together(solo, filled_buffer(3, mask), plan)
    assert_same_members(solo, batched)
    assert all(loss.shape == (3,) for loss in losses)
    assert losses[2][1] == 0.0 and losses[2][0] > 0.0


def test_n_step_rows_are_discounted_at_each_members_own_gamma_alone_and_batched():
    """Members with gammas 0.99, 0.9 and 0.95 learn from one buffer of 3-step rows: each forms its returns
    and bootstrap discounts with its own gamma, batched exactly as alone."""
    hps = [{"lr": 1e-3, "gamma": 0.99, "batch_size": 32}, {"lr": 3e-3, "gamma": 0.9, "batch_size": 48},
           {"lr": 5e-4, "gamma": 0.95, "batch_size": 16}]
    solo = [dqn(20 + i, **hp) for i, hp in enumerate(hps)]
    buf = filled_buffer(3, n_step=3)
    batch = buf.transitions(buf.sample_rows(solo[1].hp.batch_size, 1, solo[1].torch_gen))
    want = sum(0.9 ** k * batch.step_rewards[:, k] for k in range(3))
    got, discount = n_step_return(batch, 0.9)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(discount, 0.9 ** batch.length)
    plan = [[True, True, True], [True, False, True], [True, True, True]]
    batched, _ = learn_alone_and_together(solo, buf, plan)
    assert_same_members(solo, batched)


def test_members_of_other_widths_learn_zero_padded_as_alone():
    """Hidden widths 16/16, 32/8 and 8/24 in one group: each member's update is its own."""
    solo = [dqn(1, hidden=(16, 16)), dqn(2, hidden=(32, 8), lr=3e-3, batch_size=20), dqn(3, hidden=(8, 24), gamma=0.9)]
    batched, _ = learn_alone_and_together(solo, filled_buffer(3), [[True, True, True]] * 4)
    assert_same_members(solo, batched)


def _rows(agent):
    """Every buffer a group stacks for a DQN member (weights, Adam state, target)."""
    opt = agent.optimizers["q"]
    return [opt.flat, opt.m, opt.v, opt.beta1_pow, opt.beta2_pow, agent.target_flat["q_target"]]


def test_a_group_adopts_its_members_and_the_next_group_of_them_copies_nothing():
    """A group of one shape re-points its members' buffers (and their networks' parameters) to its rows: what it
    learns is in the members with no write-back, the next group of the same members in the same order uses the
    same state (no stack), and a member read as data (state, clone) or mutated in place reads its row."""
    from agilerl_core.algorithms.group_state import rows_of

    solo = [dqn(1), dqn(2, lr=3e-3), dqn(3, gamma=0.9)]
    copies = [a.clone() for a in solo]
    buf = filled_buffer(3)
    group = DQN.group(solo)
    for buffers in zip(*(_rows(a) for a in solo), strict=True):
        assert rows_of(list(buffers)) is not None
    for a, row in zip(solo, group.q.flat, strict=True):  # the network's parameters are views of the row
        weight = next(a.networks["q"].parameters())
        assert weight.untyped_storage().data_ptr() == row.untyped_storage().data_ptr()
    for _ in range(3):
        group.learn_step(buf, [0, 1, 2], [True, True, True])
    group.update_targets([1.0, 1.0, 1.0])
    for i, a in enumerate(solo):  # no write_back: the members are the rows
        assert torch.equal(a.optimizers["q"].flat, group.q.flat[i])
        assert torch.equal(a.target_flat["q_target"], group.targets["q_target"][i])
        assert torch.equal(torch.cat([p.reshape(-1) for p in a.networks["q"].parameters()]), group.q.flat[i])
    again = DQN.group(solo)
    assert again.q.flat is group.q.flat and again.targets["q_target"] is group.targets["q_target"]
    # alone, the same steps: equal (the adopted members learned what they learn alone)
    alone = [DQN.group([c]) for c in copies]
    for _ in range(3):
        for slot, g in enumerate(alone):
            g.learn_step(buf, [slot], [True])
    for g in alone:
        g.update_targets([1.0])
        g.write_back()
    assert_same_members(solo, copies)
    # a mutation in place (parameter noise) moves the member's row; its clone is its own copy
    before = group.q.flat[1].clone()
    solo[1].mutate("parameters", np.random.default_rng(0), MutationSettings(0.0, 0.1, None))
    assert not torch.equal(group.q.flat[1], before) and torch.equal(group.q.flat[0], copies[0].optimizers["q"].flat)
    twin = solo[1].clone()
    assert_same_members([solo[1]], [twin], atol=0.0)
    assert twin.optimizers["q"].flat.untyped_storage().data_ptr() != group.q.flat.untyped_storage().data_ptr()


def test_a_member_taken_into_another_group_keeps_what_each_group_taught_it():
    """Groups in turn over one member (a group of three, then the member alone, then the three again): each
    group's steps land in the member, as write-backs did."""
    solo = [dqn(1), dqn(2), dqn(3)]
    copies = [a.clone() for a in solo]
    buf = filled_buffer(3)
    for agents in (solo, copies):
        first = DQN.group(agents)
        first.learn_step(buf, [0, 1, 2], [True, True, True])
        first.write_back()
        alone = DQN.group([agents[1]])  # adopts member 1 into a state of its own
        alone.learn_step(buf, [1], [True])
        alone.write_back()
        DQN.group(agents).learn_step(buf, [0, 1, 2], [True, True, True])
    assert_same_members(solo, copies, atol=0.0)
    plain = [dqn(1), dqn(2), dqn(3)]  # the same steps with a fresh group each time and nothing adopted twice
    first = DQN.group(plain)
    first.learn_step(buf, [0, 1, 2], [True, True, True])
    DQN.group([plain[1]]).learn_step(buf, [1], [True])
    DQN.group(plain).learn_step(buf, [0, 1, 2], [True, True, True])
    assert_same_members(solo, plain)


def test_a_padded_group_writes_its_narrower_members_back():
    """Members of other widths are copies in a padded state (not adopted): their own buffers change only at
    write_back."""
    solo = [dqn(1, hidden=(16, 16)), dqn(2, hidden=(32, 8))]
    own = [a.optimizers["q"].flat for a in solo]
    before = [f.clone() for f in own]
    group = DQN.group(solo)
    group.learn_step(filled_buffer(2), [0, 1], [True, True])
    assert all(a.optimizers["q"].flat is f for a, f in zip(solo, own, strict=True))
    assert all(torch.equal(f, b) for f, b in zip(own, before, strict=True))
    group.write_back()
    assert not any(torch.equal(f, b) for f, b in zip(own, before, strict=True))


RAINBOW = {"noisy": True, "dueling": True, "distributional": True, "num_atoms": 11, "v_min": -5.0, "v_max": 5.0,
           "per": True, "double": True}


@pytest.mark.parametrize("options", [RAINBOW, {**RAINBOW, "distributional": False}, {"normalize_obs": True}, "cqn"],
                         ids=["rainbow", "noisy-dueling-per", "obs-norm", "cqn"])
def test_every_dqn_variant_learns_batched_as_alone(options):
    """Noisy, dueling and C51 heads with prioritised replay (each member's own noise and priorities), obs
    normalisation (each member's own statistics) and CQN's penalty (each member's own alpha): K = 3 batched
    equals each member alone (K = 1), other widths included."""
    from agilerl_core.algorithms.cql import CQN
    from agilerl_core.algorithms.hyperparameters.cql import CQNHyperparameters

    hps = [{"lr": 1e-3, "gamma": 0.99, "batch_size": 32}, {"lr": 3e-3, "gamma": 0.9, "batch_size": 48},
           {"lr": 5e-4, "gamma": 0.95, "batch_size": 16}]
    widths = [(16, 16), (24, 8), (16, 16)]
    if options == "cqn":
        arch = [initial_arch(SPEC, 2, NetworkConfig(hidden_sizes=list(w), min_nodes=1)) for w in widths]
        solo = [CQN(SPEC, 2, arch[i], CQNHyperparameters(cql_alpha=0.5 + i, **hp), 30 + i) for i, hp in enumerate(hps)]
    else:
        solo = [dqn(30 + i, hidden=widths[i], **hp, **options) for i, hp in enumerate(hps)]
    buf = filled_buffer(3)
    for i, a in enumerate(solo):
        a.committed(0, buf.size)  # prioritised replay: the committed rows enter at max priority
        a.observe({"obs": torch.randn(50, 3, generator=torch.Generator().manual_seed(i)) * (i + 1)})
    plan = [[True, True, True], [True, False, True], [True, True, True], [False, True, True]]
    batched, _ = learn_alone_and_together(solo, buf, plan)
    assert_same_members(solo, batched)


def test_a_group_folds_each_members_own_observations_into_its_statistics():
    """normalize_obs in a group: one update for every member's rows equals each member's own update (float64
    statistics, up to the reduction's rounding); the members' own normalisers change only at write_back."""
    solo = [dqn(30 + i, normalize_obs=True) for i in range(3)]
    together = [a.clone() for a in solo]
    first = {"obs": torch.randn(3 * 20, 3, generator=torch.Generator().manual_seed(0)) * 4 + 1}
    then = {"obs": torch.randn(3 * 7, 3, generator=torch.Generator().manual_seed(1)) - 2}
    for i, a in enumerate(solo):
        a.observe({"obs": first["obs"][20 * i: 20 * (i + 1)]})
        a.observe({"obs": then["obs"][7 * i: 7 * (i + 1)]})
    group = DQN.group(together)
    group.observe(first)
    group.observe(then)
    assert all(float(a.obs_norm.count) == 0 for a in together)  # not yet: the group holds the statistics
    group.write_back()
    for a, b in zip(solo, together, strict=True):
        assert float(b.obs_norm.count) == 27
        torch.testing.assert_close(b.obs_norm.mean, a.obs_norm.mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(b.obs_norm.var, a.obs_norm.var, rtol=1e-12, atol=1e-12)


def test_batch_keys_split_by_architecture_and_structure():
    a, b = dqn(0), dqn(1, lr=5e-3, batch_size=64)  # hyperparameters that are tensors: same group
    wide = dqn(2, hidden=(32, 8))  # other widths, same depth: stacks zero-padded
    deep, huber = dqn(2, hidden=(16, 16, 16)), dqn(3, loss="huber")
    assert a.batch_key() == b.batch_key() == wide.batch_key()
    assert deep.batch_key() != a.batch_key() and huber.batch_key() != a.batch_key()
    variants = {dqn(4, per=True).batch_key(), dqn(5, noisy=True).batch_key(), dqn(6, n_step=3).batch_key()}
    assert len(variants) == 3 and a.batch_key() not in variants and None not in variants


def test_groups_are_a_deterministic_function_of_keys():
    assert groups_of(["a", "b", "a", None, "a", "b"], None) == [(0, 2, 4), (1, 5), (3,)]
    assert groups_of(["a"] * 5, 2) == [(0, 1), (2, 3), (4,)]
    assert groups_of([None, None], None) == [(0,), (1,)]


def td3(seed, cls=None, hidden=(16, 16), **hp):
    from agilerl_core.algorithms.actor_critic import TD3
    from agilerl_core.envs.spaces import action_spec

    cls = cls or TD3
    act = action_spec(spaces.Box(-1, 1, (2,), np.float32))
    arch = initial_arch(SPEC, 2, NetworkConfig(hidden_sizes=list(hidden), min_nodes=1))
    return cls(SPEC, act, arch, cls.hp_model(**hp), seed)


def continuous_buffer(slots: int) -> ReplayBuffer:
    from agilerl_core.envs.spaces import action_spec

    g = torch.Generator().manual_seed(3)
    buf = ReplayBuffer(transition_fields(SPEC, None, action_spec(spaces.Box(-1, 1, (2,), np.float32))), 500)

    def rows(n):
        return {"obs.obs": torch.rand(n, 3, generator=g) * 2 - 1, "next_obs.obs": torch.rand(n, 3, generator=g) * 2 - 1,
                "action": torch.rand(n, 2, generator=g) * 2 - 1, "reward": torch.randn(n, generator=g),
                "terminated": (torch.rand(n, generator=g) < 0.1).float()}

    buf.commit([rows(300)])
    buf.reserve_staging(slots, 64)
    for s in range(slots):
        buf.add(s, rows(40))
    return buf


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_td3_group_update_equals_each_members_own(algo):
    """Own lr, gamma, tau, batch size, policy_freq and smoothing noise; other widths (zero-padded); one
    member sitting a step out: the batched critic, actor and target updates equal each member's own."""
    from agilerl_core.algorithms.actor_critic import DDPG, TD3

    cls = TD3 if algo == "td3" else DDPG
    hps = [{"lr_actor": 1e-3, "lr_critic": 2e-3, "batch_size": 32, "policy_freq": 2, "tau": 0.01},
           {"lr_actor": 3e-3, "lr_critic": 1e-3, "batch_size": 24, "policy_freq": 1, "gamma": 0.9, "tau": 0.05},
           {"lr_actor": 5e-4, "lr_critic": 5e-4, "batch_size": 16, "policy_freq": 3, "target_noise": 0.0,
            "max_grad_norm": None}]
    if algo == "ddpg":
        hps = [{**h, "policy_freq": 1, "target_noise": 0.0} for h in hps]
    solo = [td3(20 + i, cls, hidden=(16, 16) if i != 1 else (24, 8), **hp) for i, hp in enumerate(hps)]
    plan = [[True, True, True], [True, False, True], [True, True, True], [True, True, False], [True, True, True]]
    batched, _ = learn_alone_and_together(solo, continuous_buffer(3), plan)
    assert_same_members(solo, batched, atol=1e-5)


def _sac(seed):
    from agilerl_core.algorithms.actor_critic import SAC

    return td3(seed, SAC)


@pytest.mark.parametrize("make", [lambda s: dqn(s, eps_start=0.5, eps_end=0.5), lambda s: td3(s, random_steps=0),
                                  _sac, lambda s: ppo(s), lambda s: ppo(s, continuous=True)],
                         ids=["dqn", "td3", "sac", "ppo", "ppo-box"])
def test_group_explores_as_each_member_would(make):
    """One batched forward for every member's envs; each member's own exploration draws on top: a member explores
    alone (a group of one, what Policy.predict(deterministic=False) calls) as it does in any group."""
    agents = [make(s) for s in range(3)]
    twins = [a.clone() for a in agents]
    obs = [{"obs": torch.rand(4, 3, generator=torch.Generator().manual_seed(s))} for s in range(3)]
    own = [type(a).group([a]).explore_group(o, None)[0] for a, o in zip(agents, obs, strict=True)]
    together = type(twins[0]).group(twins).explore_group({"obs": torch.cat([o["obs"] for o in obs])}, None)
    for x, y in zip(own, together, strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0)


def ppo(seed, continuous=False, hidden=(16, 16), **hp):
    from agilerl_core.algorithms.hyperparameters.ppo import PPOHyperparameters
    from agilerl_core.algorithms.ppo import PPO
    from agilerl_core.envs.spaces import action_spec

    act = action_spec(spaces.Box(-1, 1, (2,), np.float32)) if continuous else 3
    arch = initial_arch(SPEC, 2 if continuous else 3, NetworkConfig(hidden_sizes=list(hidden), min_nodes=1,
                                                                    activation="tanh"))
    return PPO(SPEC, act, arch, PPOHyperparameters(rollout_steps=8, **hp), seed)


def rollout_data(seed: int, n: int, continuous: bool, mask: bool):
    g = torch.Generator().manual_seed(seed)
    data = {"obs": {"obs": torch.rand(n, 3, generator=g) * 2 - 1},
            "actions": torch.rand(n, 2, generator=g) * 2 - 1 if continuous else torch.randint(0, 3, (n,), generator=g),
            "logprobs": -torch.rand(n, generator=g) * 2, "values": torch.randn(n, generator=g)}
    if mask:
        m = torch.rand(n, 3, generator=g) < 0.7
        m[torch.arange(n), data["actions"]] = True  # the taken action was valid
        data["masks"] = m
    return data, torch.randn(n, generator=g), torch.randn(n, generator=g)


class _Flat:
    """A rollout stand-in whose flat() returns prepared rows (what tests.conftest.ppo_rows reads)."""

    def __init__(self, data):
        self.data = data

    def flat(self, steps):
        return self.data


@pytest.mark.parametrize(("continuous", "mask", "padded"),
                         [(False, False, False), (False, True, False), (True, False, False), (False, True, True)])
def test_ppo_group_update_equals_each_members_own(continuous, mask, padded):
    """Own lr, clip range, entropy/value coefficients, epochs, minibatch count and KL early stop, other widths:
    a batched update of three rollouts equals each member's own update (ppo_learn_alone: a group of one). `padded`: each
    member learns only from some of its rows (a multi-agent member's where its agent acted), a different number
    each, gathered to the front of its stacked rows (the rest garbage that must never be drawn)."""
    hps = [{"lr": 1e-3, "clip_coef": 0.2, "update_epochs": 3, "num_minibatches": 4, "ent_coef": 0.01},
           {"lr": 3e-3, "clip_coef": 0.1, "update_epochs": 2, "num_minibatches": 2, "vf_coef": 1.0},
           {"lr": 5e-4, "clip_coef": 0.3, "update_epochs": 4, "num_minibatches": 3, "target_kl": 0.002}]
    solo = [ppo(30 + i, continuous, hidden=(16, 16) if i != 2 else (24, 8), **hp) for i, hp in enumerate(hps)]
    together = [a.clone() for a in solo]
    rollouts = [rollout_data(40 + i, 48, continuous, mask) for i in range(3)]
    valid = [torch.rand(48, 1, generator=torch.Generator().manual_seed(i)) < 0.3 + 0.2 * i if padded else None
             for i in range(3)]
    own = [ppo_learn_alone(a, _Flat(d), 48, adv.view(48, 1), ret.view(48, 1), v)
           for a, (d, adv, ret), v in zip(solo, rollouts, valid, strict=True)]
    assert len({a.batch_key() for a in together}) == 1
    group = type(together[0]).group(together)
    order = [torch.argsort((~v.view(-1)).to(torch.int8), stable=True) if padded else torch.arange(48) for v in valid]
    rows = [int(v.sum()) for v in valid] if padded else None

    def stacked(get):
        return torch.stack([get(i)[order[i]] for i in range(3)])

    data = {"obs": {"obs": stacked(lambda i: rollouts[i][0]["obs"]["obs"])},
            **{key: stacked(lambda i, key=key: rollouts[i][0][key]) for key in rollouts[0][0] if key != "obs"}}
    stats = group.learn_stacked(data, stacked(lambda i: rollouts[i][1]), stacked(lambda i: rollouts[i][2]), rows)
    group.write_back()
    for a, u in zip(together, stats["updates"].tolist(), strict=True):
        a.learn_steps += u  # (the arenas count them: one read per phase)
    assert_same_members(solo, together, atol=1e-5)
    assert stats["updates"].tolist() == [s["updates"] for s in own]
    for i, o in enumerate(own):
        assert float(stats["loss_sum"][i]) / o["updates"] == pytest.approx(o["loss"], rel=1e-4, abs=1e-6)


def test_ppo_group_samples_as_each_member_would():
    agents = [ppo(s, continuous=True) for s in range(3)]
    twins = [a.clone() for a in agents]
    obs = [{"obs": torch.rand(4, 3, generator=torch.Generator().manual_seed(s))} for s in range(3)]
    own = [type(a).group([a]).act(o, None)[:3] for a, o in zip(agents, obs, strict=True)]
    together = type(twins[0]).group(twins).act({"obs": torch.cat([o["obs"] for o in obs])}, None)[:3]
    for i, mine in enumerate(own):
        for x, y in zip(mine, together, strict=True):
            torch.testing.assert_close(x[0], y[i], atol=1e-5, rtol=1e-5)


def test_sac_group_update_equals_each_members_own():
    """Own learning rates, gamma, tau, batch size, policy_freq, temperature (auto or fixed), target entropy,
    other widths and a member sitting a step out: the batched SAC step equals each member's own."""
    from agilerl_core.algorithms.actor_critic import SAC

    hps = [{"lr_actor": 1e-3, "lr_critic": 2e-3, "batch_size": 32, "policy_freq": 1, "init_alpha": 0.5},
           {"lr_actor": 3e-3, "lr_critic": 1e-3, "batch_size": 24, "policy_freq": 2, "gamma": 0.9, "tau": 0.05,
            "lr_alpha": 1e-3, "target_entropy": -1.0},
           {"lr_actor": 5e-4, "lr_critic": 5e-4, "batch_size": 16, "auto_entropy": False, "max_grad_norm": None}]
    solo = [td3(50 + i, SAC, hidden=(16, 16) if i != 1 else (24, 8), **hp) for i, hp in enumerate(hps)]
    plan = [[True, True, True], [True, False, True], [True, True, True], [True, True, False], [True, True, True]]
    batched, _ = learn_alone_and_together(solo, continuous_buffer(3), plan)
    assert_same_members(solo, batched, atol=1e-5)
    assert td3(1, SAC).batch_key() is not None


def test_cql_learns_batched_as_alone():
    """CQL members with their own penalty weights (one at 0: it draws no penalty actions), other widths and a
    member sitting a step out: the batched step equals each member's own."""
    from agilerl_core.algorithms.cql import CQL

    hps = [{"cql_alpha": 1.0, "batch_size": 16, "cql_n_actions": 3}, {"cql_alpha": 0.0, "batch_size": 24,
                                                                      "cql_n_actions": 3},
           {"cql_alpha": 5.0, "batch_size": 8, "gamma": 0.9, "cql_n_actions": 3}]
    solo = [td3(60 + i, CQL, hidden=(16, 16) if i != 1 else (24, 8), **hp) for i, hp in enumerate(hps)]
    plan = [[True, True, True], [True, False, True], [True, True, True]]
    batched, _ = learn_alone_and_together(solo, continuous_buffer(3), plan)
    assert_same_members(solo, batched, atol=1e-5)


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "box"])
def test_bc_learns_batched_as_alone(continuous):
    """Behaviour cloning members with their own learning rates and batch sizes, other widths and a member
    sitting a step out: the batched step equals each member's own."""
    from agilerl_core.algorithms.bc import BC
    from agilerl_core.algorithms.hyperparameters.bc import BCHyperparameters

    hps = [{"lr": 1e-3, "batch_size": 32}, {"lr": 3e-3, "batch_size": 24}, {"lr": 5e-4, "batch_size": 16}]
    if continuous:
        solo = [td3(70 + i, BC, hidden=(16, 16) if i != 1 else (24, 8), **hp) for i, hp in enumerate(hps)]
    else:
        arch = [initial_arch(SPEC, 2, NetworkConfig(hidden_sizes=list(w), min_nodes=1)) for w in ((16, 16), (24, 8),
                                                                                                  (16, 16))]
        solo = [BC(SPEC, 2, arch[i], BCHyperparameters(**hp), 70 + i) for i, hp in enumerate(hps)]
    plan = [[True, True, True], [True, False, True], [True, True, True]]
    batched, _ = learn_alone_and_together(solo, continuous_buffer(3) if continuous else filled_buffer(3), plan)
    assert_same_members(solo, batched, atol=1e-5)
