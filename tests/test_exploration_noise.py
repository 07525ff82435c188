"""SAC's correlated exploration: generalized state-dependent exploration (gSDE) and a unit-variance
Ornstein-Uhlenbeck draw, beside the white and pink noise tested with the population (test_population_major,
test_search_space)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from agilerl_core.algorithms.actor_critic.maths import SDE_MEAN_CLIP
from agilerl_core.algorithms.gsde import sde_log_std
from agilerl_core.arenas import build_arena
from agilerl_core.errors import ConfigError
from tests.conftest import greedy, tiny_config


def _sac(**over):
    return tiny_config(**{"env_id": "Pendulum-v1", "algorithm": "sac", "population_size": 3, "evo_steps": 96,
                          "hyperparameters.learning_delay": 32, "hyperparameters.random_steps": 8, **over})


def _gsde(**over):
    return _sac(**{"hyperparameters.noise_type": "gsde", "hyperparameters.sde_sample_freq": 5, **over})


def _weights(agent) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for n in agent.online_networks for p in agent.networks[n].parameters()])


def _widened(agent, hidden):
    agent.apply_architecture(replace(agent.arch, mlp=replace(agent.arch.mlp, hidden=tuple(hidden))))


def test_the_state_dependent_scale_is_the_std_of_the_noise_it_draws():
    """latent . (sigma * W) with W standard normal is Gaussian with variance sum_l latent_l^2 sigma_l^2."""
    g = torch.Generator().manual_seed(0)
    latent = torch.rand(3, 7, generator=g) * 2  # [B, L]
    log_sigma = torch.randn(2, 7, generator=g) * 0.5 - 1.0  # [dim, L]
    w = torch.randn(200_000, 7, 2, generator=g)
    noise = torch.einsum("bl,al,nla->nba", latent, log_sigma.exp(), w)
    assert torch.allclose(noise.std(0).log(), sde_log_std(latent, log_sigma), atol=0.01)
    # stacked over members: one batched product gives each member's own
    stacked = sde_log_std(torch.stack([latent, 2 * latent]), torch.stack([log_sigma, log_sigma]))
    assert torch.allclose(stacked[1], sde_log_std(2 * latent, log_sigma), atol=1e-6)


def test_a_gsde_actor_starts_at_log_std_init_and_learns_its_scales():
    cfg = _gsde(**{"hyperparameters.log_std_init": -2.0})
    agent = build_arena(cfg).build_members([3])[0]
    out = agent.networks["actor"].mlp.out
    dim = agent.action_dim
    assert agent.gsde and torch.count_nonzero(out.weight[dim:]) == 0 and torch.count_nonzero(out.bias[dim:]) == 0
    x = torch.randn(16, 3)
    obs = {"obs": x}
    group = type(agent).group([agent])
    mean, log_std = (t[0] for t in group.distribution("actor", obs))
    latent = agent.networks["actor"].mlp.trunk(x)
    assert torch.allclose(log_std, 0.5 * torch.log(latent.square().sum(1, keepdim=True) * torch.exp(torch.tensor(-4.0))
                                                   + 1e-6), atol=1e-5)
    assert float(mean.detach().abs().max()) <= SDE_MEAN_CLIP
    # the log-probability's gradient reaches the scales (the rows after the mean), not through the features
    _, logp = group.sample_action(obs, torch.randn(1, 16, dim))
    weight = group.nets["actor"].p["mlp.out.weight"]
    assert torch.autograd.grad(logp.sum(), weight)[0][0, dim:].abs().sum() > 0
    white = build_arena(_sac()).build_members([3])[0]
    assert not white.gsde and torch.count_nonzero(white.networks["actor"].mlp.out.weight[dim:]) > 0


def test_gsde_noise_holds_for_sde_sample_freq_steps_then_is_drawn_again():
    arena = build_arena(_gsde(**{"hyperparameters.random_steps": 0, "hyperparameters.sde_sample_freq": 3}))
    members = arena.build_members([1, 2])
    group = arena.algo_cls.group(members)
    group.begin_phase()
    obs = {"obs": torch.randn(1, 4, 3).expand(2, 4, 3).reshape(8, 3)}  # the same states at every step
    acts = [group.explore_group(obs, None) for _ in range(4)]
    assert torch.equal(acts[0], acts[1]) and torch.equal(acts[1], acts[2])  # one draw of W: a function of s
    assert not torch.allclose(acts[2], acts[3])  # the fourth step draws W again
    assert not torch.allclose(acts[0][:, 0], acts[0][:, 1])  # each env its own W
    best = group.greedy(obs, None)
    assert not torch.allclose(acts[0], best)


def _ppo_gsde(backend: str = "gymnasium", **over):
    return tiny_config(**{"algorithm": "ppo", "env_id": "Pendulum-v1", "env_backend": backend, "population_size": 3,
                          "num_envs": 4, "evo_steps": 96,
                          "hyperparameters": {"rollout_steps": 16, "update_epochs": 2, "num_minibatches": 2,
                                              "noise_type": "gsde", "sde_sample_freq": 4}, **over})


@pytest.mark.parametrize("algorithm,backend", [("sac", "gymnasium"), ("ppo", "gymnasium"), ("ppo", "torch")])
def test_gsde_members_of_different_widths_explore_and_learn_the_same_alone_and_in_a_group(algorithm, backend):
    """W is drawn hidden-unit-major, so a narrower member's weights are its own whatever the widest member."""
    cfg = _gsde() if algorithm == "sac" else _ppo_gsde(backend)
    arena = build_arena(cfg)
    members = arena.build_members([11, 12, 13])
    _widened(members[1], [24, 40])
    _widened(members[2], [32, 56])
    alone = members[1].clone()
    before = _weights(alone)
    arena.begin_generation(3)
    together = arena.train_group(members, [0, 1, 2], [101, 102, 103], cfg.evo_steps)
    group_shard = arena.shard(1) if algorithm == "sac" else None
    arena.begin_generation(3)
    own = arena.train_group([alone], [1], [102], cfg.evo_steps)[0]
    assert together[1].learn_steps == own.learn_steps > 0 and together[1].episodes == own.episodes
    if group_shard is not None:
        assert torch.allclose(group_shard["action"].float(), arena.shard(1)["action"].float(), atol=1e-5)
    assert torch.allclose(_weights(members[1]), _weights(alone), atol=1e-5)
    assert not torch.allclose(_weights(alone), before)
    # the scales learned (the rows after the means moved off zero)
    dim = alone.action_dim
    assert torch.count_nonzero(alone.networks["actor"].mlp.out.weight[dim:]) > 0


def test_a_ppo_gsde_actor_explores_smoothly_and_acts_on_its_means():
    arena = build_arena(_ppo_gsde(**{"hyperparameters.sde_sample_freq": 3}))
    members = arena.build_members([1, 2])
    agent = members[0]
    assert agent.gsde and agent.networks["actor"].mlp.out.out_features == 2 * agent.action_dim
    group = arena.algo_cls.group(members)
    group.begin_phase()
    obs = {"obs": torch.randn(1, 4, 3).expand(2, 4, 3).reshape(8, 3)}
    acts = [group.explore_group(obs, None) for _ in range(4)]
    assert torch.equal(acts[0], acts[1]) and torch.equal(acts[1], acts[2]) and not torch.allclose(acts[2], acts[3])
    best = group.greedy(obs, None)
    assert best.shape == acts[0].shape
    one = greedy(agent, {"obs": obs["obs"][:4]})
    assert one.shape == (4, agent.action_dim) and torch.allclose(torch.as_tensor(one), best[0], atol=1e-6)
    white = build_arena(_ppo_gsde(**{"hyperparameters.noise_type": "gaussian"})).build_members([1])[0]
    assert white.networks["actor"].mlp.out.out_features == white.action_dim and white.batch_key() != agent.batch_key()
    with pytest.raises(ConfigError, match="noise_type"):
        tiny_config(algorithm="ippo", kind="multi_agent", env_id="mpe2:simple_speaker_listener_v4",
                    **{"hyperparameters.noise_type": "gsde"})


def test_a_unit_added_by_a_mutation_starts_at_log_std_init_and_leaves_the_policy_unchanged():
    agent = build_arena(_gsde()).build_members([4])[0]
    obs = {"obs": torch.randn(32, 3)}

    def mean():  # the policy's mean, through a group of one
        return type(agent).group([agent]).distribution("actor", obs)[0][0]

    before = mean()
    _widened(agent, [agent.arch.mlp.hidden[0], agent.arch.mlp.hidden[1] + 16])
    out, dim = agent.networks["actor"].mlp.out, agent.action_dim
    assert torch.count_nonzero(out.weight[dim:, -16:]) == 0  # the new units' log scales: log_std_init
    assert torch.allclose(mean(), before, atol=1e-6)


def test_gsde_groups_stay_apart_and_refuse_what_it_cannot_read():
    gsde = build_arena(_gsde()).build_members([1])[0]
    white = build_arena(_sac()).build_members([1])[0]
    other_freq = build_arena(_gsde(**{"hyperparameters.sde_sample_freq": 7})).build_members([1])[0]
    assert len({gsde.batch_key(), white.batch_key(), other_freq.batch_key()}) == 3
    with pytest.raises(ConfigError, match="sde_sample_freq"):
        _gsde(**{"hyperparameters.sde_sample_freq": 0})
    with pytest.raises(ConfigError, match="log_std_init"):
        _gsde(**{"hyperparameters.log_std_init": 5.0})


def test_sac_ou_noise_is_unit_variance_and_correlated_and_restarts_with_an_episode():
    arena = build_arena(_sac(**{"hyperparameters.noise_type": "ou", "hyperparameters.random_steps": 0,
                                "hyperparameters.ou_theta": 1.0, "hyperparameters.ou_dt": 0.05}))
    members = arena.build_members([1, 2])
    group = arena.algo_cls.group(members)
    group.begin_phase()
    obs = {"obs": torch.zeros(2 * 64, 3)}
    with torch.no_grad():
        mean, log_std = group.distribution("actor", obs)
    z = []
    for _ in range(400):
        a = group.explore_group(obs, None)
        z.append((torch.atanh(a.clamp(-0.999999, 0.999999)) - mean) / log_std.exp())
    z = torch.stack(z[100:])  # past the start from 0: stationary
    assert abs(float(z.var()) - 1.0) < 0.25
    lag = float((z[:-1] * z[1:]).mean() / z.var())
    assert abs(lag - 0.95) < 0.05  # keep = 1 - theta dt
    group.episodes_done(torch.ones(2 * 64, dtype=torch.bool))
    assert torch.count_nonzero(group.ou_state) == 0
    white = arena.algo_cls.group(build_arena(_sac(**{"hyperparameters.random_steps": 0})).build_members([1, 2]))
    white.begin_phase()
    w = torch.stack([white.explore_group(obs, None) for _ in range(50)])
    wz = torch.atanh(w.clamp(-0.999999, 0.999999))
    assert abs(float((wz[:-1] * wz[1:]).mean() / wz.var())) < 0.2  # white: uncorrelated step to step
