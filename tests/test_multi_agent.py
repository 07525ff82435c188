"""Multi-agent: the PettingZoo vector env, MADDPG/MATD3 maths, the shared buffer, learning, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gymnasium import spaces

from agilerl_core import rng
from agilerl_core.algorithms.group import StackedRows
from agilerl_core.algorithms.hyperparameters.maddpg import MADDPGHyperparameters, MATD3Hyperparameters
from agilerl_core.algorithms.maddpg import MADDPG, MATD3, gumbel_softmax
from agilerl_core.algorithms.maddpg.group import SALT_GUMBEL
from agilerl_core.algorithms.maddpg.maths import gumbel_of
from agilerl_core.buffers.replay import MultiAgentBatch, ReplayBuffer, multi_agent_fields
from agilerl_core.envs.multi_agent import ParallelVectorEnv, agent_group, make_parallel_vector_env
from agilerl_core.envs.spaces import MultiAgentSpec
from agilerl_core.errors import ConfigError
from agilerl_core.experiment import build_evolution, train_local
from agilerl_core.networks.evolvable import ArchSpec
from agilerl_core.networks.mlp import MLPSpec
from tasks.config import validate_config
from tests.conftest import cli_summary, greedy, learn_alone, with_overrides
from tests.ma_envs import CueTeam

SPEAKER_LISTENER = MultiAgentSpec.from_spaces(
    ["speaker_0", "listener_0"],
    {"speaker_0": spaces.Box(-np.inf, np.inf, (3,), np.float32), "listener_0": spaces.Box(-np.inf, np.inf, (11,),
                                                                                         np.float32)},
    {"speaker_0": spaces.Box(0, 1, (3,), np.float32), "listener_0": spaces.Box(0, 1, (5,), np.float32)})
MIXED = MultiAgentSpec.from_spaces(
    ["pointer_0", "chooser_0"],
    {"pointer_0": spaces.Box(-1, 1, (1,), np.float32), "chooser_0": spaces.Discrete(2)},
    {"pointer_0": spaces.Box(-1, 1, (1,), np.float32), "chooser_0": spaces.Discrete(2)})
ARCH = ArchSpec(MLPSpec(0, 0, (32, 32), "relu"))


def ma_config(**overrides):
    data = {"kind": "multi_agent", "name": "ma-test", "env_id": "tests.ma_envs:cue_team", "algorithm": "matd3",
            "num_envs": 4, "population_size": 2, "evo_steps": 400, "eval_episodes": 4, "max_env_steps": 1600,
            "seed": 0, "hyperparameters": {"batch_size": 32, "learning_delay": 64, "learn_step": 4,
                                           "buffer_size": 5000},
            "network": {"hidden_sizes": [32, 32], "min_nodes": 8}}
    with_overrides(data, overrides)
    return validate_config(data)


def _batch(spec: MultiAgentSpec, b: int, seed: int = 0) -> MultiAgentBatch:
    g = torch.Generator().manual_seed(seed)

    def obs():
        out = {}
        for a in spec.agents:
            part = spec.obs[a].parts[0]
            out[a] = torch.randint(0, part.n, (b,), generator=g) if part.kind == "discrete" else \
                torch.randn((b, *part.shape), generator=g)
        return out
    action = {a: (torch.randint(0, s.dim, (b,), generator=g) if s.discrete else torch.rand((b, s.dim), generator=g) * 2 - 1)
              for a, s in spec.actions.items()}
    reward = {a: torch.randn(b, generator=g) for a in spec.agents}
    term = {a: (torch.rand(b, generator=g) < 0.3).float() for a in spec.agents}
    acted = {a: torch.ones(b) for a in spec.agents}
    return MultiAgentBatch(obs(), action, reward, obs(), term, acted)


# ---- the vector env ----------------------------------------------------------------------------------------
def test_groups_are_ids_without_their_index():
    assert agent_group("speaker_0") == "speaker" and agent_group("adversary_12") == "adversary"
    assert agent_group("solo") == "solo" and agent_group("agent_x") == "agent_x"


def test_vector_env_autoresets_with_agents_dying_early():
    env = ParallelVectorEnv([lambda: CueTeam(length=4, chooser_dies_at=2)] * 3)
    obs, info = env.reset(seed=7)
    assert obs["pointer_0"].shape == (3, 1) and obs["chooser_0"].shape == (3,)
    assert info["alive"]["chooser_0"].all() and info["action_mask"]["chooser_0"].shape == (3, 2)
    act = {"pointer_0": np.zeros((3, 1), np.float32), "chooser_0": np.zeros(3, np.int64)}
    _, rew, term, _, info = env.step(act)  # step 1: both act
    assert info["acted"]["chooser_0"].all() and not info["env_done"].any()
    obs, rew, term, _, info = env.step(act)  # step 2: chooser acts, then terminates
    assert info["acted"]["chooser_0"].all() and term["chooser_0"].all() and not info["alive"]["chooser_0"].any()
    assert info["alive"]["pointer_0"].all()
    obs, rew, term, _, info = env.step(act)  # step 3: chooser is dead: no reward, zeros, did not act
    assert not info["acted"]["chooser_0"].any() and (rew["chooser_0"] == 0).all() and (obs["chooser_0"] == 0).all()
    assert (rew["pointer_0"] != 0).all()
    before = obs["pointer_0"].copy()
    obs, rew, _, trunc, info = env.step(act)  # step 4: the episode ends; every copy resets in the same step
    assert info["env_done"].all() and trunc["pointer_0"].all()
    assert info["alive"]["chooser_0"].all() and info["alive"]["pointer_0"].all()  # a fresh episode
    assert not np.array_equal(info["final_obs"]["pointer_0"], obs["pointer_0"])  # last obs kept apart
    assert before.shape == obs["pointer_0"].shape


def test_vector_env_is_seeded_and_process_copies_match():
    a = ParallelVectorEnv([lambda: CueTeam()] * 3)
    b = make_parallel_vector_env("tests.ma_envs:cue_team", 3, workers=2)  # blocks of 2 and 1 copies
    try:
        oa, _ = a.reset(seed=3)
        ob, _ = b.reset(seed=3)
        assert all(np.array_equal(oa[k], ob[k]) for k in oa)
        act = {"pointer_0": np.full((3, 1), 0.5, np.float32), "chooser_0": np.ones(3, np.int64)}
        for _ in range(7):  # through an autoreset
            ra, rb = a.step(act), b.step(act)
            assert all(np.array_equal(ra[0][k], rb[0][k]) and np.array_equal(ra[1][k], rb[1][k]) for k in oa)
            assert np.array_equal(ra[4]["env_done"], rb[4]["env_done"])
    finally:
        a.close()
        b.close()


# ---- MADDPG / MATD3 maths -----------------------------------------------------------------------------------
def test_centralised_critics_read_every_agent_and_actors_their_own():
    agent = MADDPG(SPEAKER_LISTENER, None, ARCH, MADDPGHyperparameters(), seed=0)
    nets = agent.networks
    assert nets["actor.speaker_0"].arch.mlp.in_dim == 3 and nets["actor.speaker_0"].arch.mlp.out_dim == 3
    assert nets["actor.listener_0"].arch.mlp.in_dim == 11 and nets["actor.listener_0"].arch.mlp.out_dim == 5
    for a in ("speaker_0", "listener_0"):  # all observations (3 + 11) and all actions (3 + 5)
        assert nets[f"critic_1.{a}"].arch.mlp.in_dim == 22 and nets[f"critic_1.{a}"].arch.mlp.out_dim == 1
    assert "critic_2.speaker_0" not in nets
    batch = _batch(SPEAKER_LISTENER, 16)
    joint = agent.joint_action(batch.action)
    assert joint.shape == (16, 8)
    assert agent.q("critic_1", "listener_0", batch.obs, joint).shape == (16,)
    # Discrete actions enter the critics one-hot
    mixed = MATD3(MIXED, None, ARCH, MATD3Hyperparameters(), seed=0)
    mb = _batch(MIXED, 8)
    j = mixed.joint_action(mb.action)
    assert j.shape == (8, 1 + 2) and torch.equal(j[:, 1:].sum(1), torch.ones(8))
    assert mixed.networks["critic_2.chooser_0"].arch.mlp.in_dim == (1 + 2) + (1 + 2)


def test_matd3_target_on_a_known_batch():
    hp = MATD3Hyperparameters(gamma=0.9, target_noise=0.2, target_noise_clip=0.3)
    agent = MATD3(SPEAKER_LISTENER, None, ARCH, hp, seed=1)
    for n, net in agent.networks.items():  # targets differ from the online networks, as after training
        if n.endswith(".target"):
            with torch.no_grad():
                for p in net.parameters():
                    p.add_(0.05)
    batch = _batch(SPEAKER_LISTENER, 12, seed=3)
    noise = {a: torch.randn(12, agent.action_specs[a].dim, generator=torch.Generator().manual_seed(9))
             for a in agent.agents}
    rows = StackedRows([torch.arange(12)], torch.device("cpu"))
    y = MATD3.group([agent]).target_values(batch, rows, {a: n.unsqueeze(0) for a, n in noise.items()})
    got = {a: y[0, i] for i, a in enumerate(agent.agents)}
    with torch.no_grad():
        acts = []
        for a in ("speaker_0", "listener_0"):
            mu = torch.tanh(agent.networks[f"actor.{a}.target"]({"obs": batch.next_obs[a]}))
            acts.append((mu + (0.2 * noise[a]).clamp(-0.3, 0.3)).clamp(-1, 1))
        joint = torch.cat(acts, dim=1)
        for a in ("speaker_0", "listener_0"):
            q1 = agent.networks[f"critic_1.{a}.target"](batch.next_obs, joint).squeeze(1)
            q2 = agent.networks[f"critic_2.{a}.target"](batch.next_obs, joint).squeeze(1)
            want = batch.reward[a] + 0.9 * (1 - batch.terminated[a]) * torch.minimum(q1, q2)
            torch.testing.assert_close(got[a], want)


@pytest.mark.parametrize("spec", [SPEAKER_LISTENER, MIXED], ids=["box", "mixed"])
def test_stacked_learn_step_equals_each_networks_own_update(spec):
    """One learn step (critics stacked in one batched pass and one Adam step) against every network updated
    on its own with autograd and torch's Adam: critics, actors (Gumbel-softmax for Discrete) and targets."""
    hp = MATD3Hyperparameters(policy_freq=1, lr_actor=1e-3, lr_critic=3e-3, tau=0.1, max_grad_norm=0.5)
    agent = MATD3(spec, None, ARCH, hp, seed=4)
    batch = _batch(spec, 24, seed=5)
    batch.acted[spec.agents[1]][:7] = 0.0  # some rows where an agent did not act
    ref = {}
    for n, net in agent.networks.items():  # standalone copies with parameters of their own
        ref[n] = type(net)(net.obs_spec, net.arch)
        ref[n].load_state_dict(net.state_dict())
    gen = torch.Generator().manual_seed(0)
    gen.set_state(agent.torch_gen.get_state())
    phase_key = rng.member_keys([gen], "cpu")[0]
    noise_key = rng.mix(phase_key ^ rng.SALT_NOISE)  # the group's keyed target noise
    gumbel_key = rng.mix(phase_key ^ SALT_GUMBEL)
    drawn = 0

    learn_alone(agent, batch)

    agents = spec.agents
    # the reference: the module doc's formulas, network by network, drawing what the group draws
    with torch.no_grad():
        nxt = {}
        for a in agents:
            y = ref[f"actor.{a}.target"]({"obs": batch.next_obs[a]})
            if agent.action_specs[a].discrete:
                nxt[a] = F.one_hot(y.argmax(-1), y.shape[-1]).float()
            else:
                eps = rng.normal(noise_key, drawn, y.numel()).view(y.shape)
                drawn += 1
                nxt[a] = (torch.tanh(y) + (eps * hp.target_noise).clamp(-hp.target_noise_clip, hp.target_noise_clip)
                          ).clamp(-1, 1)
        joint_next = torch.cat([nxt[a] for a in agents], 1)
        y = {a: batch.reward[a] + hp.gamma * (1 - batch.terminated[a]) * torch.minimum(
            ref[f"critic_1.{a}.target"](batch.next_obs, joint_next).squeeze(1),
            ref[f"critic_2.{a}.target"](batch.next_obs, joint_next).squeeze(1)) for a in agents}
    joint = agent.joint_action(batch.action)
    for c in ("critic_1", "critic_2"):
        for a in agents:
            net = ref[f"{c}.{a}"]
            w = batch.acted[a]
            loss = (w * (net(batch.obs, joint).squeeze(1) - y[a]).pow(2)).sum() / w.sum()
            opt = torch.optim.Adam(net.parameters(), lr=hp.lr_critic)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), hp.max_grad_norm)
            opt.step()
    for a in agents:
        out = ref[f"actor.{a}"]({"obs": batch.obs[a]})
        if agent.action_specs[a].discrete:
            u = (rng.below(gumbel_key, 0, out.numel(), 1 << 24).float() + 0.5) / (1 << 24)
            mine = gumbel_softmax(out, hp.gumbel_temperature, noise=gumbel_of(u).view(out.shape))
        else:
            mine = torch.tanh(out)
        x = agent.joint_action({b: mine if b == a else batch.action[b] for b in agents})
        w = batch.acted[a]
        loss = -(w * ref[f"critic_1.{a}"](batch.obs, x).squeeze(1)).sum() / w.sum()
        net = ref[f"actor.{a}"]
        opt = torch.optim.Adam(net.parameters(), lr=hp.lr_actor)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), hp.max_grad_norm)
        opt.step()
    with torch.no_grad():
        for n in agent.target_networks:
            for p, q in zip(ref[n].parameters(), ref[n[: -len(".target")]].parameters(), strict=True):
                p.lerp_(q, hp.tau)
    for n, net in agent.networks.items():
        for (k, p), q in zip(net.named_parameters(), ref[n].parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=f"{n}.{k}")


def test_delayed_actor_and_rows_where_an_agent_did_not_act():
    agent = MATD3(MIXED, None, ARCH, MATD3Hyperparameters(), seed=0)
    batch = _batch(MIXED, 32)
    actor_before = [p.clone() for p in agent.networks["actor.pointer_0"].parameters()]
    learn_alone(agent, batch)  # critic step only (policy_freq 2)
    assert all(torch.equal(a, b) for a, b in zip(actor_before, agent.networks["actor.pointer_0"].parameters(),
                                                  strict=True))
    learn_alone(agent, batch)
    assert not all(torch.equal(a, b) for a, b in zip(actor_before, agent.networks["actor.pointer_0"].parameters(),
                                                      strict=True))
    # a dead agent's rows (acted 0) give its critic no gradient at all (a fresh agent: no Adam momentum)
    fresh = MATD3(MIXED, None, ARCH, MATD3Hyperparameters(), seed=0)
    dead = MultiAgentBatch(batch.obs, batch.action, batch.reward, batch.next_obs, batch.terminated,
                           {**batch.acted, "chooser_0": torch.zeros(32)})
    critic = [p.clone() for p in fresh.networks["critic_1.chooser_0"].parameters()]
    other = [p.clone() for p in fresh.networks["critic_1.pointer_0"].parameters()]
    learn_alone(fresh, dead)
    assert all(torch.equal(a, b) for a, b in zip(critic, fresh.networks["critic_1.chooser_0"].parameters(),
                                                  strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(other, fresh.networks["critic_1.pointer_0"].parameters(),
                                                      strict=True))


def test_team_mutates_together_and_round_trips():
    agent = MATD3(SPEAKER_LISTENER, None, ARCH, MATD3Hyperparameters(), seed=0)
    from agilerl_core.hpo.evolvable import MutationSettings
    from agilerl_core.networks.evolvable import ArchBounds

    settings = MutationSettings(arch_bounds=ArchBounds(min_nodes=8), new_layer_share=1.0, parameter_strength=0.1)
    desc = agent.mutate("architecture", np.random.default_rng(0), settings)
    assert desc.startswith("arch:mlp.add_layer")
    hidden = {n: net.arch.mlp.hidden for n, net in agent.networks.items()}
    assert len(set(hidden.values())) == 1 and len(next(iter(hidden.values()))) == 3  # every network alike
    tensors, meta = agent.state()
    again = MATD3.from_state(SPEAKER_LISTENER, tensors, meta)
    obs = _batch(SPEAKER_LISTENER, 5).obs
    a, b = greedy(agent, obs), greedy(again, obs)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_buffer_ring_wraps_with_per_agent_fields():
    fields = multi_agent_fields(MIXED)
    assert {"obs.pointer_0", "action.chooser_0", "acted.chooser_0", "next_obs.pointer_0"} <= set(fields)
    buf = ReplayBuffer(fields, capacity=10)
    buf.reserve_staging(1, 8)
    for start in (0, 8):  # 16 rows into a ring of 10: the oldest 6 are overwritten
        for i in range(start, start + 8, 4):
            data = {k: torch.zeros((4, *f.shape), dtype=f.dtype) for k, f in fields.items()}
            data["reward.pointer_0"] = torch.arange(i, i + 4, dtype=torch.float32)
            data["action.chooser_0"] = torch.arange(i, i + 4) % 2
            buf.add(0, data)
        buf.commit([buf.shard(0)])
    assert buf.size == 10 and buf.pos == 6
    kept = buf.committed()
    assert kept["reward.pointer_0"].tolist() == list(range(6, 16))
    assert kept["action.chooser_0"].tolist() == [i % 2 for i in range(6, 16)]


# ---- the arena, learning ------------------------------------------------------------------------------------
def test_identical_agents_learn_through_one_shared_actor(tmp_path):
    cfg = ma_config(algorithm="matd3", env_id="tests.ma_envs:pointers", env_kwargs={"n": 3, "length": 5},
                    evo_steps=1500, max_env_steps=6000, target_fitness=17.5,
                    **{"hyperparameters.learn_step": 2, "hyperparameters.lr_actor": 3e-3, "hyperparameters.share_policy":
                       "group", "hyperparameters.lr_critic": 3e-3, "hyperparameters.expl_noise": 0.3})
    res = train_local(cfg, progress=False, run_dir=tmp_path)
    # random play: ~1.7 per pointer and 2.5 for the chooser (7.5 in all); the optimum is 20
    assert res.best_fitness >= 17.5, [h.fitnesses for h in res.history]


@pytest.mark.parametrize("algorithm", ["matd3", "maddpg"])
def test_a_two_agent_probe_env_is_learned_in_seconds(tmp_path, algorithm):
    # random play scores ~8.3 (team reward per step ~0.83, both agents' returns summed); the optimum is 20
    cfg = ma_config(algorithm=algorithm, evo_steps=1500, max_env_steps=6000, target_fitness=17.0,
                    **{"hyperparameters.learn_step": 2, "hyperparameters.lr_actor": 3e-3,
                       "hyperparameters.lr_critic": 3e-3, "hyperparameters.expl_noise": 0.3})
    res = train_local(cfg, progress=False, run_dir=tmp_path)
    assert res.best_fitness >= 17.0, [h.fitnesses for h in res.history]


def test_same_seed_same_team_result(tmp_path):
    cfg = ma_config(**{"mutation.architecture": 1.0})
    a = train_local(cfg, progress=False, run_dir=tmp_path / "a")
    b = train_local(cfg, progress=False, run_dir=tmp_path / "b")
    assert [h.fitnesses for h in a.history] == [h.fitnesses for h in b.history]
    assert [h.mutations for h in a.history] == [h.mutations for h in b.history]
    # with the env copies in a worker process the run is the same
    c = train_local(ma_config(vector_workers=1, **{"mutation.architecture": 1.0}), progress=False,
                    run_dir=tmp_path / "c")
    assert [h.fitnesses for h in c.history] == [h.fitnesses for h in a.history]


def test_fitness_of_one_group_and_per_agent_returns():
    evo = build_evolution(ma_config(fitness={"reduce": "sum", "agents": ["chooser"]}))
    assert evo.arena.fitness.agents == ("chooser_0",)
    member = evo.population.members[0].agent
    fit = evo.arena.evaluate(member, seed=0)
    assert fit == member.agent_returns["chooser_0"] and set(member.agent_returns) == {"pointer_0", "chooser_0"}


# ---- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, match", [
    ({"env_id": "tests.ma_envs:no_such_env"}, "env_id: module 'tests.ma_envs' has no env 'no_such_env'"),
    ({"env_id": "no_such_pkg:env"}, "env_id: .*cannot be imported"),
    ({"env_id": "simple_spread_v3"}, "env_id: .*module:env"),
    ({"env_id": "tests.ma_envs:not_parallel"}, "not a PettingZoo parallel env"),
    ({"env_kwargs": {"image_obs": True}}, "env_id: agent 'pointer_0' observes .*flat Box vectors or Discrete"),
    ({"env_kwargs": {"colour": 3}}, "env_kwargs: .*colour"),
    ({"fitness": {"agents": ["listener"]}}, "fitness.agents: 'listener' is neither an agent nor a group.*"
                                            "agents: pointer_0, chooser_0; groups: chooser, pointer"),
    ({"hyperparameters.normalize_obs": True}, "hyperparameters.normalize_obs"),
])
def test_bad_input_is_refused_before_any_work(overrides, match):
    with pytest.raises(ConfigError, match=match):
        build_evolution(ma_config(**overrides))


def test_config_refuses_what_does_not_fit_a_multi_agent_experiment():
    with pytest.raises(ConfigError, match="algorithm: dqn does not train in multi_agent experiments"):
        ma_config(algorithm="dqn")
    with pytest.raises(ConfigError, match="env_entry_point"):
        ma_config(env_entry_point="tests.ma_envs:CueTeam")
    with pytest.raises(ConfigError, match="hyperparameters.normalize_obs: mappo's centralised critic"):
        ma_config(algorithm="mappo", hyperparameters={"normalize_obs": True})
    with pytest.raises(ConfigError, match="network.rnn: a recurrent core trains with PPO on a gym experiment only"):
        ma_config(algorithm="ippo", hyperparameters={}, network={"hidden_sizes": [32], "rnn": {"cell": "gru"}})


# ---- through the flow ---------------------------------------------------------------------------------------
MA_YAML = """\
kind: multi_agent
name: ma-flow
env_id: tests.ma_envs:cue_team
algorithm: matd3
num_envs: 4
population_size: 2
evo_steps: 800
eval_episodes: 4
max_env_steps: 12800
seed: 2
hyperparameters: {batch_size: 32, learning_delay: 64, learn_step: 4, buffer_size: 3000}
network: {hidden_sizes: [32, 32], min_nodes: 8}
storage: {keep_generations: 2}
"""


def test_a_team_run_through_the_cli_tracks_each_agent_and_serves_its_champion(tmp_path, cli):
    """Through the flow on the embedded default (ephemeral Prefect, SQLite MLflow, local storage): teams learn
    stacked, MLflow has each agent's return, the champion serves dicts of actions. (Resuming a team run is proven
    in process: tests/test_tasks.py.)"""
    cfg = tmp_path / "ma.yaml"
    cfg.write_text(MA_YAML)
    straight = cli_summary(cli.run("run", cfg, "--run-id", "straight", "--storage", tmp_path / "store",
                                   "--no-progress", "--set", f"output_dir={tmp_path / 'out'}"))
    assert straight["generations"] == 8
    assert straight["batching"] == "on" and sum(straight["group_sizes"]) == 2  # teams learn stacked

    from mlflow.tracking import MlflowClient  # per-agent returns beside each member's fitness

    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    children = client.search_runs([client.get_experiment_by_name("ma-flow").experiment_id],
                                  filter_string=f"tags.`agilerl.parent` = '{straight['mlflow_run_id']}'")
    assert len(children) == 2
    for run in children:
        assert {"return.pointer_0", "return.chooser_0", "fitness"} <= set(run.data.metrics)
    # the champion takes a dict of observations (one array per agent) and returns a dict of actions
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    champion = mlflow.pyfunc.load_model(straight["champion_uri"])
    acts = champion.predict({"pointer_0": np.zeros((3, 1), np.float32), "chooser_0": np.array([0, 1, 1])})
    assert acts["pointer_0"].shape == (3, 1) and acts["chooser_0"].shape == (3,)
    assert acts["chooser_0"].dtype == np.int64 and (np.abs(acts["pointer_0"]) <= 1).all()
