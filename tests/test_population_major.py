"""The member axis through the whole loop (issue 39): counter-based random streams that do not depend on the
group, the on-policy loop on [T, K, N] tensors with the group's envs stepped as one (Gymnasium and on-device
torch envs), batched evaluation, and no host round trip per step or per member inside the loop."""

from __future__ import annotations

import pytest
import torch

from agilerl_core import rng
from agilerl_core.arenas import build_arena
from tests.conftest import HostReads, tiny_config


def test_keyed_streams_are_uniform_and_independent_of_the_group():
    u = rng.uniform(torch.tensor([3, 4]), 1, 200_000)
    assert torch.allclose(u.mean(1), torch.full((2,), 0.5), atol=0.005)
    assert torch.allclose(u.var(1), torch.full((2,), 1 / 12), atol=0.002)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    z = rng.normal(torch.tensor(9), 2, 200_000)
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1.0) < 0.01
    assert abs(float(torch.corrcoef(torch.stack([u[0], u[1]]))[0, 1])) < 0.01
    alone = rng.KeyedStream(torch.tensor([77]))
    group = rng.KeyedStream(torch.tensor([5, 77, 6]))
    for _ in range(3):  # the same key draws the same values whoever shares its group
        assert torch.equal(alone.uniform(4, 2)[0], group.uniform(4, 2)[1])
    perms = group.permutations(50)
    assert torch.equal(perms.sort(1).values, torch.arange(50).expand(3, 50))
    assert not torch.equal(perms[0], perms[2])
    # element j depends only on (key, counter, j): a longer draw starts with the shorter one
    assert torch.equal(rng.normal(4, 2, 10), rng.normal(4, 2, 30)[:10])
    assert torch.equal(rng.below(4, 2, 10, 7), rng.below(4, 2, 30, 7)[:10])
    big = rng.below(torch.tensor([1, 2]), 0, 50_000, torch.tensor([3, 10**9]))
    assert big[0].max() == 2 and big[1].max() > 9 * 10**8 and big.min() >= 0  # beyond float32's 2^24 steps
    # another counter gives other values; int64 wrap-around is the same on every call
    assert not torch.equal(rng.uniform(1, 0, 8), rng.uniform(1, 1, 8))
    assert torch.equal(rng.bits(2**62, 5, 4), rng.bits(2**62, 5, 4))


def _ppo(backend: str, **over):
    return tiny_config(**{"algorithm": "ppo", "env_backend": backend, "population_size": 3, "num_envs": 4,
                          "evo_steps": 96,
                          "hyperparameters": {"rollout_steps": 16, "update_epochs": 2, "num_minibatches": 2}, **over})


def _weights(agent) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for n in agent.online_networks for p in agent.networks[n].parameters()])


@pytest.mark.parametrize("backend", ["gymnasium", "torch"])
def test_a_member_trains_the_same_alone_and_in_a_group(backend):
    cfg = _ppo(backend)
    arena = build_arena(cfg)
    members = arena.build_members([11, 12, 13])
    alone = members[1].clone()
    together = arena.train_group(members, [0, 1, 2], [101, 102, 103], cfg.evo_steps)
    own = arena.train_group([alone], [1], [102], cfg.evo_steps)[0]
    assert together[1].episodes == own.episodes and together[1].learn_steps == own.learn_steps
    assert together[1].mean_return == pytest.approx(own.mean_return, rel=1e-6)
    assert torch.allclose(_weights(members[1]), _weights(alone), atol=1e-5)
    assert not torch.allclose(_weights(members[0]), _weights(members[1]))
    # the same seeds give the same result, bit for bit
    again = arena.build_members([11, 12, 13])
    arena.train_group(again, [0, 1, 2], [101, 102, 103], cfg.evo_steps)
    assert all(torch.equal(_weights(a), _weights(b)) for a, b in zip(members, again, strict=True))


@pytest.mark.parametrize("algorithm,backend", [("dqn", "gymnasium"), ("dqn", "torch"), ("td3", "torch"),
                                               ("sac", "gymnasium"), ("rainbow", "gymnasium"), ("rainbow", "torch"),
                                               ("td3-pink", "torch"), ("sac-pink", "gymnasium")])
def test_an_off_policy_member_collects_and_learns_the_same_alone_and_in_a_group(algorithm, backend):
    """One env step for the group, exploration drawn on the device (epsilon-greedy; Gaussian or OU noise;
    SAC's samples and warm-up actions), one staging write for every slot, every member's minibatch in one
    draw: a member's transitions and weights are the same alone and in a group."""
    own = {"dqn": {"hyperparameters.eps_decay_steps": 200},
           "td3": {"env_id": "Pendulum-v1", "hyperparameters.noise_type": "ou", "hyperparameters.random_steps": 40},
           "sac": {"env_id": "Pendulum-v1", "hyperparameters.random_steps": 40},
           "rainbow": {"hyperparameters.n_step": 3},  # n-step windows for the group's envs at once
           # colored noise: whole sequences drawn at once, a new one every noise_length steps (here within the phase)
           "td3-pink": {"env_id": "Pendulum-v1", "hyperparameters.noise_type": "pink",
                        "hyperparameters.noise_length": 10, "hyperparameters.random_steps": 8},
           "sac-pink": {"env_id": "Pendulum-v1", "hyperparameters.noise_type": "pink",
                        "hyperparameters.noise_length": 10, "hyperparameters.random_steps": 8}}[algorithm]
    algorithm = algorithm.removesuffix("-pink")
    cfg = tiny_config(algorithm=algorithm, env_backend=backend, population_size=3, evo_steps=96,
                      **{"hyperparameters.learning_delay": 32, **own})
    if (algorithm, backend) == ("rainbow", "torch"):  # a member whose n-step windows fill first earns its first
        # learn step alone, before the others drew (their sum trees must still stack: one size for the group)
        cfg = tiny_config(algorithm=algorithm, env_backend=backend, population_size=3, evo_steps=128,
                          **{"hyperparameters.learning_delay": 16, "hyperparameters.buffer_size": 2000})
    arena = build_arena(cfg)
    members = arena.build_members([11, 12, 13])
    alone = members[1].clone()
    arena.begin_generation(3)
    together = arena.train_group(members, [0, 1, 2], [101, 102, 103], cfg.evo_steps)
    group_shard = arena.shard(1)
    arena.begin_generation(3)
    own = arena.train_group([alone], [1], [102], cfg.evo_steps)[0]
    assert together[1].learn_steps == own.learn_steps > 0 and together[1].episodes == own.episodes
    # the same exploration, alone or not (continuous actions up to the stacked forward's rounding)
    assert torch.allclose(group_shard["action"].float(), arena.shard(1)["action"].float(), atol=1e-5)
    for key in ("reward", "obs.obs", "next_obs.obs") + (("step_rewards", "length") if algorithm == "rainbow" else ()):
        assert torch.allclose(group_shard[key], arena.shard(1)[key]), key
    assert torch.allclose(_weights(members[1]), _weights(alone), atol=1e-5)


@pytest.mark.parametrize("algorithm,backend", [("ppo", "gymnasium"), ("ppo", "torch"), ("dqn", "gymnasium")])
def test_batched_evaluation_equals_member_by_member(algorithm, backend):
    extra = {"hyperparameters": {"rollout_steps": 16}} if algorithm == "ppo" else {}
    cfg = tiny_config(algorithm=algorithm, env_backend=backend, eval_episodes=3, eval_max_steps=60, **extra)
    arena = build_arena(cfg)
    members = arena.build_members([1, 2, 3])
    arena.begin_generation(3)
    arena.train_group(members, [0, 1, 2], [5, 6, 7], 64)
    together = arena.evaluate_group(members, 9, [0, 1, 2])
    one_by_one = [arena.evaluate(m, 9, s) for m, s in zip(members, [0, 1, 2], strict=True)]
    assert together == pytest.approx(one_by_one, rel=1e-6)


def _host_reads(k: int, evo_steps: int, backend: str = "torch") -> int:
    cfg = _ppo(backend, population_size=k, evo_steps=evo_steps)
    arena = build_arena(cfg)
    members = arena.build_members(list(range(k)))
    group = arena.algo_cls.group(members)
    env = arena.group_env(list(range(k)), group.device)
    from agilerl_core.loops.on_policy import train_group_on_policy

    with HostReads() as mode:
        train_group_on_policy(group, list(range(k)), env, evo_steps, list(range(k)))
    return mode.count


def test_the_on_device_loop_reads_nothing_back_per_step_or_per_member():
    small, more_members, more_steps = _host_reads(2, 64), _host_reads(6, 64), _host_reads(2, 256)
    assert more_members == small and more_steps == small, (small, more_members, more_steps)
    assert small <= 16  # the phase's numbers, read once at its end (each read counts .cpu() and .tolist())
    # Python envs take the group's actions on the host: one read per step for the whole group, none per member
    host, host_more_members = _host_reads(2, 64, "gymnasium"), _host_reads(6, 64, "gymnasium")
    assert host == host_more_members and host <= 16 + 2 * (64 // 4), (host, host_more_members)  # .cpu(), .numpy()


def test_torch_backend_learns_cartpole():
    from agilerl_core.experiment import train_local

    cfg = tiny_config(algorithm="ppo", env_backend="torch", population_size=4, num_envs=16, evo_steps=8192,
                      max_env_steps=4 * 8192 * 3, eval_episodes=4, target_fitness=300,
                      network={"hidden_sizes": [64, 64], "activation": "tanh"},
                      hyperparameters={"rollout_steps": 64, "update_epochs": 4, "num_minibatches": 4, "lr": 2.5e-3})
    result = train_local(cfg, progress=False)
    assert max(max(h.fitnesses) for h in result.history) >= 300
