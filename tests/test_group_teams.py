"""Population-batched learning for teams (MADDPG/MATD3): a group of teams updates, adopts and explores as
each team does alone."""

from __future__ import annotations

import pytest
import torch

from agilerl_core.buffers import ReplayBuffer
from tests.test_group import assert_same_members, learn_alone_and_together


def team(spec, seed, algo="matd3", hidden=(16, 16), **hp):
    from agilerl_core.algorithms.maddpg import MADDPG, MATD3
    from agilerl_core.networks.evolvable import ArchSpec
    from agilerl_core.networks.mlp import MLPSpec

    cls = MATD3 if algo == "matd3" else MADDPG
    return cls(spec, spec.actions, ArchSpec(MLPSpec(0, 0, tuple(hidden), "relu")), cls.hp_model(**hp), seed)


def team_buffer(spec, slots: int) -> ReplayBuffer:
    """Random multi-agent rows (some agents out of their episode: acted 0), committed and in every slot."""
    from agilerl_core.buffers.replay import multi_agent_fields

    g = torch.Generator().manual_seed(5)
    fields = multi_agent_fields(spec)
    buf = ReplayBuffer(fields, 500)

    def rows(n):
        data = {}
        for name, f in fields.items():
            kind, _, agent = name.partition(".")
            if kind in ("obs", "next_obs") and spec.obs[agent].parts[0].kind == "discrete":
                data[name] = torch.randint(0, spec.obs[agent].parts[0].n, (n,), generator=g)
            elif kind == "action" and spec.actions[agent].discrete:
                data[name] = torch.randint(0, spec.actions[agent].dim, (n,), generator=g)
            elif kind in ("terminated", "acted"):
                data[name] = (torch.rand(n, generator=g) < (0.2 if kind == "terminated" else 0.85)).float()
            elif kind in ("mask", "next_mask"):  # action masks: some actions barred, one always allowed
                m = torch.rand((n, *f.shape), generator=g) < 0.6
                m[torch.arange(n), torch.randint(0, f.shape[0], (n,), generator=g)] = True
                data[name] = m
            else:
                data[name] = (torch.rand((n, *f.shape), generator=g) * 2 - 1).to(f.dtype)
        return data

    buf.commit([rows(300)])
    buf.reserve_staging(slots, 64)
    for s in range(slots):
        buf.add(s, rows(40))
    return buf


@pytest.mark.parametrize("algo", ["matd3", "maddpg"])
@pytest.mark.parametrize("mixed", [True, False], ids=["discrete+box", "box"])
def test_team_group_update_equals_each_members_own(algo, mixed):
    """MADDPG/MATD3 teams with their own learning rates, gamma, tau, batch size, policy_freq, smoothing
    noise and Gumbel temperature, other widths (zero-padded), per-critic gradient clipping, agents out of
    their episodes, action masks and a member sitting a step out: the batched critic, actor (tanh and
    straight-through Gumbel-softmax among allowed actions) and target updates equal each team's own."""
    from tests.test_multi_agent import MIXED, SPEAKER_LISTENER

    spec = MIXED if mixed else SPEAKER_LISTENER
    hps = [{"lr_actor": 1e-3, "lr_critic": 2e-3, "batch_size": 32, "tau": 0.01, "max_grad_norm": 0.5},
           {"lr_actor": 3e-3, "lr_critic": 1e-3, "batch_size": 24, "policy_freq": 1, "gamma": 0.9, "tau": 0.05,
            "gumbel_temperature": 0.5, "max_grad_norm": 0.5},
           {"lr_actor": 5e-4, "lr_critic": 5e-4, "batch_size": 16, "policy_freq": 3, "target_noise": 0.0,
            "max_grad_norm": 0.5}]
    if algo == "maddpg":
        hps = [{**h, "policy_freq": 1} for h in hps]
    solo = [team(spec, 60 + i, algo, hidden=(16, 16) if i != 1 else (24, 8), **hp) for i, hp in enumerate(hps)]
    plan = [[True, True, True], [True, False, True], [True, True, True], [True, True, False], [True, True, True]]
    batched, losses = learn_alone_and_together(solo, team_buffer(spec, 3), plan)
    assert_same_members(solo, batched, atol=1e-5)
    assert losses[1][1] == 0.0 and losses[1][0] > 0.0


def test_a_team_group_adopts_its_critics_and_their_targets():
    """MATD3 teams: each team's stacked critics, their targets (one buffer for the C x N critics) and its actors
    become rows of the group's state, every network's parameters views of them; the next group of the teams
    copies nothing."""
    from agilerl_core.algorithms.group_state import rows_of
    from tests.test_multi_agent import SPEAKER_LISTENER

    teams = [team(SPEAKER_LISTENER, 70 + i) for i in range(3)]
    group = type(teams[0]).group(teams)
    assert rows_of([t.critic_adam.flat for t in teams]) is group.adams["critics"].flat
    assert rows_of([t.critic_target_flat for t in teams]) is group.targets["critics.target"]
    for i, t in enumerate(teams):
        for name, net in t.networks.items():
            state = group.targets["critics.target"] if name.startswith("critic") and name.endswith(".target") else \
                group.adams["critics"].flat if name.startswith("critic") else None
            if state is not None:
                ptr = state.untyped_storage().data_ptr()
                assert all(p.untyped_storage().data_ptr() == ptr for p in net.parameters()), name
        assert torch.equal(t.critic_target_flat, group.targets["critics.target"][i])
    again = type(teams[0]).group(teams)
    assert again.targets["critics.target"] is group.targets["critics.target"]
    assert all(again.adams[n].flat is group.adams[n].flat for n in group.adams)


def test_team_group_explores_as_each_member_would():
    from tests.test_multi_agent import MIXED

    agents = [team(MIXED, s, expl_noise=0.3) for s in range(3)]
    twins = [a.clone() for a in agents]
    g = torch.Generator().manual_seed(1)
    obs = [{"pointer_0": torch.rand(4, 1, generator=g), "chooser_0": torch.randint(0, 2, (4,), generator=g)}
           for _ in range(3)]
    masks = [torch.tensor([[True, False]] * 4), torch.ones(4, 2, dtype=torch.bool), torch.ones(4, 2, dtype=torch.bool)]

    def explore(members, obs, masks):  # the first step of a phase: fresh keys and noise processes
        group = type(members[0]).group(members)
        group.begin_acting(4)
        return group.explore_group({x: torch.cat([o[x] for o in obs]) for x in obs[0]}, {"chooser_0": torch.cat(masks)})

    own = [explore([a], [o], [m]) for a, o, m in zip(agents, obs, masks, strict=True)]
    together = explore(twins, obs, masks)
    for i, x in enumerate(own):
        for agent in x:
            torch.testing.assert_close(x[agent], together[agent][4 * i: 4 * (i + 1)], atol=1e-6, rtol=0)
    assert (together["chooser_0"][:4] == 0).all()  # the mask held
