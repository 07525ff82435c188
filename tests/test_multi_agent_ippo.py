"""Multi-agent PPO teams (IPPO, MAPPO), action masks from infos, env workers that fail, and groups of teams
training as each team alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gymnasium import spaces

from agilerl_core.envs.multi_agent import make_parallel_vector_env
from agilerl_core.envs.spaces import MultiAgentSpec
from agilerl_core.errors import ConfigError
from agilerl_core.experiment import build_evolution, train_local
from tasks.config import validate_config
from tests.conftest import greedy
from tests.test_multi_agent import ARCH, ma_config


# ---- IPPO ----------------------------------------------------------------------------------------------------
def test_ippo_with_one_agent_is_ppo(tmp_path):
    """Same seed, same hyperparameters: IPPO on a one-agent wrapper of CartPole ends exactly as PPO on CartPole
    (rollouts, GAE with truncation bootstrap, the PPO update, mutations, evaluation)."""
    common = {"population_size": 2, "evo_steps": 256, "eval_episodes": 3, "max_env_steps": 1536, "seed": 4,
              "num_envs": 4, "network": {"hidden_sizes": [32, 32], "min_nodes": 8},
              "mutation": {"architecture": 0.5, "rl_hp": 0.5, "parameters": 0.3, "activation": 0.3},
              "hyperparameters": {"rollout_steps": 32, "update_epochs": 2, "ent_coef": 0.01}}
    ppo = validate_config({**common, "name": "ppo", "env_id": "CartPole-v1", "algorithm": "ppo"})
    ippo = validate_config({**common, "name": "ippo", "kind": "multi_agent", "env_id": "tests.ma_envs:solo",
                            "algorithm": "ippo"})
    a = train_local(ppo, progress=False, run_dir=tmp_path / "ppo")
    b = train_local(ippo, progress=False, run_dir=tmp_path / "ippo")
    assert [h.fitnesses for h in a.history] == [h.fitnesses for h in b.history]
    assert [h.mutations for h in a.history] == [h.mutations for h in b.history]
    assert [h.train_returns for h in a.history] == [h.train_returns for h in b.history]
    assert len(a.history) == 3


def test_ippo_shares_a_policy_per_group_and_round_trips():
    from agilerl_core.algorithms.hyperparameters.ippo import IPPOHyperparameters
    from agilerl_core.algorithms.ippo import IPPO, policy_units

    spread = MultiAgentSpec.from_spaces(
        ["agent_0", "agent_1", "adversary_0"],
        {"agent_0": spaces.Box(-1, 1, (4,)), "agent_1": spaces.Box(-1, 1, (4,)), "adversary_0": spaces.Box(-1, 1, (6,))},
        {"agent_0": spaces.Discrete(3), "agent_1": spaces.Discrete(3), "adversary_0": spaces.Discrete(2)})
    assert policy_units(spread, "group") == {"agent": ("agent_0", "agent_1"), "adversary": ("adversary_0",)}
    assert set(policy_units(spread, "agent")) == {"agent_0", "agent_1", "adversary_0"}
    with pytest.raises(ConfigError, match="share_policy: group 'listener' mixes spaces"):
        policy_units(MultiAgentSpec.from_spaces(
            ["listener_0", "listener_1"], {"listener_0": spaces.Box(-1, 1, (2,)), "listener_1": spaces.Box(-1, 1, (3,))},
            {"listener_0": spaces.Discrete(2), "listener_1": spaces.Discrete(2)}), "group")
    team = IPPO(spread, None, ARCH, IPPOHyperparameters(share_policy="group"), seed=0)
    assert set(team.learners) == {"agent", "adversary"}
    obs = {a: torch.randn(5, spread.obs[a].vector_dim) for a in spread.agents}
    acts = greedy(team, obs)
    assert {a: v.shape for a, v in acts.items()} == {"agent_0": (5,), "agent_1": (5,), "adversary_0": (5,)}
    from agilerl_core.hpo.evolvable import MutationSettings
    from agilerl_core.networks.evolvable import ArchBounds

    team.mutate("architecture", np.random.default_rng(1), MutationSettings(1.0, 0.1, ArchBounds(min_nodes=8)))
    assert len({learner.arch.mlp.hidden for learner in team.learners.values()}) == 1  # every unit alike
    team.set_hyperparameter("lr", 1e-3)
    assert all(learner.hp.lr == 1e-3 for learner in team.learners.values())
    tensors, meta = team.state()
    again = IPPO.from_state(spread, tensors, meta)
    b = greedy(again, obs)
    assert all(np.array_equal(acts2, b[a]) for a, acts2 in greedy(team, obs).items())
    assert again.describe() == team.describe() and "x2 policies" in team.describe()


def test_mappo_critics_read_the_joint_observation_and_actors_their_own():
    from agilerl_core.algorithms.hyperparameters.ippo import MAPPOHyperparameters
    from agilerl_core.algorithms.ippo import MAPPO

    spread = MultiAgentSpec.from_spaces(
        ["agent_0", "agent_1", "adversary_0"],
        {"agent_0": spaces.Box(-1, 1, (4,)), "agent_1": spaces.Box(-1, 1, (4,)), "adversary_0": spaces.Discrete(3)},
        {"agent_0": spaces.Discrete(3), "agent_1": spaces.Discrete(3), "adversary_0": spaces.Discrete(2)})
    team = MAPPO(spread, None, ARCH, MAPPOHyperparameters(share_policy="group"), seed=0)
    agent, adversary = team.learners["agent"], team.learners["adversary"]
    # joint = 4 + 4 + one-hot 3 = 11; the shared "agent" unit adds its agents' one-hot index (2)
    assert agent.networks["critic"].arch.mlp.in_dim == 13 and adversary.networks["critic"].arch.mlp.in_dim == 11
    assert agent.networks["actor"].arch.mlp.in_dim == 4 and adversary.networks["actor"].arch.mlp.in_dim == 3
    obs = {"agent_0": torch.randn(5, 4), "agent_1": torch.randn(5, 4), "adversary_0": torch.tensor([0, 2, 1, 1, 0])}
    x = team.critic_input("agent", obs)["obs"]
    joint = torch.cat([obs["agent_0"], obs["agent_1"], F.one_hot(obs["adversary_0"], 3).float()], dim=1)
    torch.testing.assert_close(x[:5], torch.cat([joint, torch.tensor([[1.0, 0.0]]).expand(5, 2)], dim=1))
    torch.testing.assert_close(x[5:], torch.cat([joint, torch.tensor([[0.0, 1.0]]).expand(5, 2)], dim=1))
    torch.testing.assert_close(team.critic_input("adversary", obs)["obs"], joint)
    tensors, meta = team.state()
    again = MAPPO.from_state(spread, tensors, meta)
    assert again.learners["agent"].critic_obs_spec.vector_dim == 13
    central = team.critic_input("agent", obs)
    values = [type(u).group([u]).values_all(central) for u in (again.learners["agent"], agent)]  # groups of one
    torch.testing.assert_close(*values)
    assert team.batch_key() != MAPPO(spread, None, ARCH, MAPPOHyperparameters(share_policy="agent"), seed=0).batch_key()


@pytest.mark.parametrize("algorithm", ["maddpg", "ippo", "mappo"])
def test_action_masks_from_infos_are_respected(tmp_path, algorithm):
    # the env raises on a masked action: exploration, learning-time sampling and greedy evaluation obey
    cfg = ma_config(algorithm=algorithm, env_kwargs={"masked": True}, evo_steps=200, max_env_steps=800,
                    **({"hyperparameters": {"rollout_steps": 16}} if algorithm.endswith("ppo") else {}))
    res = train_local(cfg, progress=False, run_dir=tmp_path)
    assert res.generations == 2


def test_an_env_failing_in_a_worker_is_reported_with_its_traceback():
    env = make_parallel_vector_env("tests.ma_envs:cue_team", 2, {"masked": True}, workers=1)
    try:
        env.reset(seed=0)
        env.step({"pointer_0": np.zeros((2, 1), np.float32), "chooser_0": np.zeros(2, np.int64)})  # t=1: odd
        with pytest.raises(RuntimeError, match="(?s)env worker 0 of tests.ma_envs:cue_team failed.*masked action 2"):
            env.step({"pointer_0": np.zeros((2, 1), np.float32), "chooser_0": np.full(2, 2)})
    finally:
        env.close()


@pytest.mark.parametrize("algorithm", ["ippo", "mappo"])
def test_ppo_teams_train_with_agents_dying_early(tmp_path, algorithm):
    cfg = ma_config(algorithm=algorithm, env_kwargs={"length": 6, "chooser_dies_at": 2},
                    hyperparameters={"rollout_steps": 16})
    res = train_local(cfg, progress=False, run_dir=tmp_path)
    assert res.generations == 2 and all(np.isfinite(h.fitnesses).all() for h in res.history)


# ---- population-batched teams ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("algorithm", "env"), [
    ("matd3", None), ("ippo", None), ("mappo", None),
    ("matd3", "pointers"), ("maddpg", "pointers"), ("mappo", "pointers")])  # pointers: identical agents sharing
def test_a_group_of_teams_trains_as_each_team_alone(algorithm, env):
    """Three teams of other widths and hyperparameters, an agent out of its episode early and action masks:
    one generation's training as a stacked group (batched acting and learning) ends where each team's own
    training ends, up to float rounding, with the same episodes and returns. (Over longer phases Adam can turn
    a rounding-level sign difference of a near-zero gradient into an lr-sized step: seen at lr 3e-3 after
    three rollouts; the unit tests in test_group.py pin the maths step by step.)"""
    from tests.test_group import assert_same_members

    hp = {"hyperparameters": {"rollout_steps": 16}} if algorithm.endswith("ppo") else {"hyperparameters.learn_step": 2}
    env_kwargs = {"length": 6, "chooser_dies_at": 2, "masked": True}
    if env == "pointers":  # two identical pointers act through one shared policy
        env_kwargs = {"n": 2, "length": 6}
        hp = {**hp, "env_id": "tests.ma_envs:pointers", "hyperparameters.share_policy": "group"}
    evo = build_evolution(ma_config(algorithm=algorithm, population_size=3, evo_steps=240, env_kwargs=env_kwargs, **hp))
    arena, members = evo.arena, [m.agent for m in evo.population.members]
    lr = "lr" if algorithm.endswith("ppo") else "lr_critic"
    members[1].set_hyperparameter(lr, 2e-3)
    members[2].set_hyperparameter("gamma", 0.9)
    from agilerl_core.hpo.evolvable import MutationSettings
    from agilerl_core.networks.evolvable import ArchBounds

    members[2].mutate("architecture", np.random.default_rng(3), MutationSettings(0.0, 0.1, ArchBounds(min_nodes=8)))
    assert members[2].arch != members[0].arch and len({m.batch_key() for m in members}) == 1
    if env == "pointers":
        shared = members[0].learners if algorithm == "mappo" else members[0].networks
        assert "pointer" in shared and "pointer_0" not in shared if algorithm == "mappo" else \
            "actor.pointer" in shared and "actor.pointer_0" not in shared and "critic_1.pointer_1" in shared
    alone = [m.clone() for m in members]
    seeds = [11, 12, 13]
    if arena.shares_experience:
        arena.begin_generation(3)
    own = [arena.train_group([m], [s], [seed], 240)[0] for s, (m, seed) in enumerate(zip(alone, seeds, strict=True))]
    together = arena.train_group(members, [0, 1, 2], seeds, 240)
    assert_same_members(alone, members, atol=1e-4)
    for a, b in zip(own, together, strict=True):
        assert (a.env_steps, a.learn_steps, a.episodes) == (b.env_steps, b.learn_steps, b.episodes)
        assert a.learn_steps > 0
        assert a.mean_return == pytest.approx(b.mean_return, abs=1e-6)
