"""Teams population-major (issue 39, multi-agent): a group's teams step as one vector (TeamGroupEnv), act through
one forward per policy unit, draw every random number from keyed streams (a team collects and learns the same
alone or in any group), learn by hand-written gradients equal to autograd's, and are evaluated as one vector."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agilerl_core import rng
from agilerl_core.algorithms.group import StackedRows
from agilerl_core.algorithms.maddpg.group import SALT_GUMBEL
from agilerl_core.algorithms.maddpg.maths import gumbel_of
from agilerl_core.envs.multi_agent import ParallelVectorEnv, make_parallel_vector_env
from agilerl_core.envs.spaces import MultiAgentSpec
from agilerl_core.envs.team_group import TeamGroupEnv
from agilerl_core.errors import NonFiniteError
from agilerl_core.experiment import build_evolution
from agilerl_core.hpo.evolvable import MutationSettings
from agilerl_core.networks.evolvable import ArchBounds
from tests.conftest import HostReads
from tests.ma_envs import CueTeam
from tests.test_group import assert_same_members, learn_alone_and_together
from tests.test_group_teams import team, team_buffer
from tests.test_multi_agent import MIXED, ma_config

MASKED = {"length": 6, "chooser_dies_at": 2, "masked": True}  # a Box and a masked Discrete agent, one dying early


def _arena(algorithm: str, **over):
    extra = {"hyperparameters": {"rollout_steps": 8}} if algorithm.endswith("ppo") else \
        {"hyperparameters.learning_delay": 16, "hyperparameters.learn_step": 4}
    evo = build_evolution(ma_config(algorithm=algorithm, population_size=3, evo_steps=64, eval_episodes=3,
                                    env_kwargs=MASKED, **{**extra, **over}))
    members = [m.agent for m in evo.population.members]
    members[2].mutate("architecture", np.random.default_rng(3), MutationSettings(0.0, 0.1, ArchBounds(min_nodes=8)))
    return evo.arena, members


def _spec(env) -> MultiAgentSpec:
    return MultiAgentSpec.from_spaces(env.agents, env.observation_spaces, env.action_spaces)


# ---- the group's envs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 1])
def test_a_group_of_team_envs_steps_as_each_members_envs_alone(workers):
    """Member-major rows, each member's envs reset with its own seed (worker processes: every member's step
    started before any is waited for), final observations and masks kept apart where an episode ended."""
    group = [make_parallel_vector_env("tests.ma_envs:cue_team", 2, MASKED, workers) for _ in range(2)]
    alone = [ParallelVectorEnv([lambda: CueTeam(**MASKED)] * 2) for _ in range(2)]
    try:
        env = TeamGroupEnv(group, [4, 7], _spec(alone[0]), "cpu")
        obs, masks, alive = env.reset([10, 20])
        own = [e.reset(seed=s) for e, s in zip(alone, [10, 20], strict=True)]
        assert torch.equal(obs["pointer_0"], torch.as_tensor(np.concatenate([o["pointer_0"] for o, _ in own])))
        assert masks["pointer_0"] is None and masks["chooser_0"].shape == (4, 3) and alive["chooser_0"].all()
        g = np.random.default_rng(0)
        ended = False
        for _ in range(7):  # through agents dying and an autoreset
            act = {"pointer_0": torch.as_tensor(g.uniform(-1, 1, (4, 1)), dtype=torch.float32),
                   "chooser_0": torch.as_tensor(g.integers(0, 2, 4))}
            step = env.step(act)
            host = {a: env.spec.actions[a].to_env(x.numpy()) for a, x in act.items()}  # the Box's bounds
            own = [e.step({a: x[2 * i: 2 * i + 2] for a, x in host.items()}) for i, e in enumerate(alone)]
            for a in ("pointer_0", "chooser_0"):
                assert torch.equal(step.obs[a], torch.as_tensor(np.concatenate([o[0][a] for o in own])))
                assert torch.equal(step.final_obs[a], torch.as_tensor(np.concatenate([o[4]["final_obs"][a] for o in own])))
                assert np.array_equal(step.reward[a], np.concatenate([o[1][a] for o in own]))
                assert np.array_equal(step.acted[a], np.concatenate([o[4]["acted"][a] for o in own]))
            assert torch.equal(step.mask["chooser_0"],
                               torch.as_tensor(np.concatenate([o[4]["action_mask"]["chooser_0"] for o in own])))
            assert np.array_equal(step.env_done, np.concatenate([o[4]["env_done"] for o in own]))
            ended |= bool(step.env_done.any())
        assert ended
    finally:
        for e in group + alone:
            e.close()


@pytest.mark.parametrize("continuous", [True, False])
def test_copies_stepped_directly_check_their_actions_once_per_vector_step(continuous):
    """The checking wrappers' work (Box actions clipped, Discrete ones refused out of range) done for every copy's
    actions at once gives what each copy's own checks give."""
    from mpe2 import simple_speaker_listener_v4

    from agilerl_core.envs.aec_direct import direct_parallel

    def make():
        return direct_parallel(simple_speaker_listener_v4.parallel_env(max_cycles=4, continuous_actions=continuous))

    vec, own = ParallelVectorEnv([make] * 3), [make() for _ in range(3)]
    assert vec._batch_checks
    vec.reset(seed=5)
    for i, e in enumerate(own):
        e.reset(seed=5 + i)
    g = np.random.default_rng(1)
    for _ in range(6):  # through an autoreset
        if continuous:  # out of bounds too: clipped alike
            act = {a: g.uniform(-0.3, 1.3, (3, *vec.action_spaces[a].shape)).astype(np.float32) for a in vec.agents}
        else:
            act = {a: g.integers(0, vec.action_spaces[a].n, 3) for a in vec.agents}
        got = vec.step(act)
        for i, e in enumerate(own):
            o, r, *_ = e.step({a: act[a][i] for a in e.agents})
            assert all(np.array_equal(got[4]["final_obs"][a][i], o[a]) and got[1][a][i] == np.float32(r[a]) for a in o)
            if not e.agents:
                e.reset()
    if not continuous:
        with pytest.raises(ValueError, match="speaker_0.*not in its space"):
            vec.step({"speaker_0": np.array([0, 3, 0]), "listener_0": np.zeros(3, np.int64)})


def test_a_non_finite_reward_names_the_member_that_met_it():
    envs = [ParallelVectorEnv([lambda: CueTeam(**MASKED)] * 2) for _ in range(2)]
    finish = envs[1]._finish_step

    def nan_reward(results):
        out = finish(results)
        out[1]["chooser_0"][1] = np.nan
        return out

    envs[1]._finish_step = nan_reward
    env = TeamGroupEnv(envs, [3, 5], _spec(envs[0]), "cpu")
    env.reset([0, 1])
    act = {"pointer_0": torch.zeros(4, 1), "chooser_0": torch.zeros(4, dtype=torch.int64)}
    with pytest.raises(NonFiniteError, match="slot 5: reward is not finite.*env step 1"):
        env.step(act)
    TeamGroupEnv(envs, [3, 5], _spec(envs[0]), "cpu", checked=False).step(act)  # evaluation does not check


# ---- keyed randomness: a team collects and learns the same alone or in any group ------------------------------
@pytest.mark.parametrize("algorithm,noise", [("matd3", "ou"), ("maddpg", "gaussian")])
def test_a_team_collects_and_learns_the_same_alone_and_in_any_group(algorithm, noise):
    """One env step for the group, exploration (Box noise, Discrete samples among allowed actions), minibatches,
    target smoothing and Gumbel noise from keyed streams: a team's transitions and weights are the same alone,
    in a group of three and beside another partner (up to the stacked forward's rounding)."""
    arena, members = _arena(algorithm, **{"hyperparameters.noise_type": noise})
    twins, others = [m.clone() for m in members], [m.clone() for m in members]
    seeds = [101, 102, 103]
    arena.begin_generation(3)
    together = arena.train_group(members, [0, 1, 2], seeds, 64)
    in_group = arena.shard(1)
    arena.begin_generation(3)
    alone = arena.train_group([twins[1]], [1], [102], 64)[0]
    own = arena.shard(1)
    arena.begin_generation(3)
    arena.train_group([others[1], others[0]], [1, 2], [102, 103], 64)  # another partner, another order
    partnered = arena.shard(1)
    assert together[1].learn_steps == alone.learn_steps > 0 and together[1].episodes == alone.episodes
    for shard in (own, partnered):
        assert torch.equal(shard["action.chooser_0"], in_group["action.chooser_0"])  # the same samples
        assert torch.equal(shard["mask.chooser_0"], in_group["mask.chooser_0"])
        torch.testing.assert_close(shard["action.pointer_0"], in_group["action.pointer_0"], atol=1e-5, rtol=0)
        torch.testing.assert_close(shard["reward.pointer_0"], in_group["reward.pointer_0"], atol=1e-5, rtol=0)
    assert_same_members([twins[1], others[1]], [members[1], members[1]], atol=1e-5)
    assert not torch.equal(in_group["action.pointer_0"], arena.shard(2)["action.pointer_0"])  # members differ


def test_gumbel_noise_is_keyed_per_member():
    """Each member in turn draws its rows' worth from its own key (zeros for padding and members that sit
    out), a counter per member advancing only with its own draws."""
    agents = [team(MIXED, s) for s in range(3)]
    group = type(agents[0]).group(agents)
    rows = StackedRows([torch.arange(5), None, torch.arange(3)], torch.device("cpu"))
    keys = group.stream.keys
    first, second = group._gumbel(rows, [True, False, True], 2), group._gumbel(rows, [True, False, True], 2)
    for i, count in ((0, 5), (2, 3)):
        for got, counter in ((first, 0), (second, 1)):
            bits = rng.below(rng.mix(keys[i] ^ SALT_GUMBEL), counter, 5 * 2, 1 << 24)
            want = gumbel_of((bits.float() + 0.5) / (1 << 24)).view(5, 2)
            assert torch.equal(got[i, :count], want[:count]) and not got[i, count:].any()
    assert not first[1].any() and torch.isfinite(first).all()


# ---- learning by hand equals autograd --------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["matd3", "maddpg"])
def test_hand_written_gradients_equal_autograd(algo):
    """Critic regression and actor terms (tanh and straight-through Gumbel-softmax among allowed actions), other
    widths, members sitting steps out: the hand-written gradients take the steps autograd takes."""
    hps = [{"batch_size": 32}, {"batch_size": 24, "policy_freq": 1, "gumbel_temperature": 0.5},
           {"batch_size": 16, "lr_actor": 3e-3}]
    solo = [team(MIXED, 40 + i, algo, hidden=(16, 16) if i != 1 else (24, 8), max_grad_norm=0.5, **hp)
            for i, hp in enumerate(hps)]
    twins = [a.clone() for a in solo]
    buf = team_buffer(MIXED, 3)
    plan = [[True, True, True], [True, False, True], [True, True, True], [False, True, True]]
    by_hand, _ = learn_alone_and_together(solo, buf, plan)
    group = type(twins[0]).group(twins)
    assert group.critic_net.hand_backward
    group.critic_net._hand = False  # every gradient through autograd
    for active in plan:
        group.learn_step(buf, [0, 1, 2], active)
    group.write_back()
    assert_same_members(by_hand, twins, atol=1e-5)


# ---- evaluation as one vector ------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["matd3", "ippo", "mappo"])
def test_batched_evaluation_equals_member_by_member(algorithm):
    arena, members = _arena(algorithm)
    if arena.shares_experience:
        arena.begin_generation(3)
    arena.train_group(members, [0, 1, 2], [5, 6, 7], 64)
    together = arena.evaluate_group(members, 9, [0, 1, 2])
    returns = [dict(m.agent_returns) for m in members]
    one_by_one = [arena.evaluate(m, 9, s) for m, s in zip(members, [0, 1, 2], strict=True)]
    assert together == pytest.approx(one_by_one, rel=1e-6)
    assert returns == [pytest.approx(m.agent_returns, rel=1e-6) for m in members]
    assert arena.evaluate(members[1], 9) == pytest.approx(one_by_one[1], rel=1e-6)  # the shared evaluation env
    assert len(set(together)) == 3


# ---- no host round trip per member -------------------------------------------------------------------------------
def test_a_group_phase_reads_back_per_step_not_per_member():
    """Acting, stepping, staging and learning read the device back per step for the whole group (the actions the
    host envs take), never once per member and step: more steps add as many reads for 5 members as for 2."""
    from agilerl_core.arenas import build_arena

    def reads(k: int, steps: int) -> int:
        arena = build_arena(ma_config(population_size=k, evo_steps=steps, **{"hyperparameters.learning_delay": 8}))
        members = arena.build_members(list(range(k)))
        arena.begin_generation(k)
        with HostReads() as mode:
            arena.train_group(members, list(range(k)), list(range(k)), steps)
        return mode.count

    more_steps = [reads(k, 96) - reads(k, 48) for k in (2, 5)]
    assert more_steps[0] == more_steps[1] > 0, more_steps
