"""Every algorithm trains from its shipped config, and its checkpoint round-trips and resumes exactly."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from agilerl_core.buffers.rollout import compute_gae
from agilerl_core.experiment import build_evolution, train_local
from tasks.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "deployments" / "configs"
SHIPPED = sorted(p.name for p in CONFIGS.glob("*.yaml"))


_DATASETS: dict[str, str] = {}


def _dataset_for(env_id: str) -> str:
    """A small random-policy dataset of `env_id` (offline configs name files the user records)."""
    if env_id not in _DATASETS:
        from agilerl_core.data.collect import collect_episodes, write_dataset

        path = Path(tempfile.mkdtemp(prefix="agilerl-test-data-")) / f"{env_id}.hdf5"
        _DATASETS[env_id] = write_dataset(str(path), collect_episodes(env_id, "random", 6, seed=0), env_id, "random")
    return _DATASETS[env_id]


def _arithmetic_set(preferences: bool) -> str:
    key = f"arithmetic-{preferences}"
    if key not in _DATASETS:
        from agilerl_core.data.prompts import make_arithmetic, write_jsonl

        path = Path(tempfile.mkdtemp(prefix="agilerl-test-data-")) / "add.jsonl"
        _DATASETS[key] = str(write_jsonl(path, make_arithmetic(60, 1, 0, preferences)))
    return _DATASETS[key]


TINY_LM = {"config": {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 96},
           "tokenizer_chars": "0123456789+= ?WhatisAnwerthumbly.", "lora": {"rank": 4, "alpha": 8, "max_rank": 8}}


def _tiny_llm(cfg, name: str, **extra):
    """An LLM config with its base swapped for a tiny config-built model (the shipped ones name SmolLM2, which
    CI does not install) and a small generated arithmetic set: its algorithm, rewards and evolution stay."""
    data = {"dataset.uri": _arithmetic_set(cfg.algorithm == "dpo")}
    if cfg.dataset.source == "wordle":  # whole games of a small Wordle, read by a tokenizer of every letter
        import string

        data = {"dataset.options": {"vocabulary": 60, "max_guesses": 2}, "dataset.held_out": 0.2,
                "model": {**TINY_LM, "config": {**TINY_LM["config"], "n_positions": 512},
                          "tokenizer_chars": string.ascii_letters + string.digits + " -!>.,;:'\n"}}
        extra = {"hyperparameters.max_new_tokens": 6, **extra}
    if cfg.dataset.source == "reasoning_gym":  # its own generated task, smaller, read by a tokenizer of every letter
        import string

        data = {"dataset.size": 60, "model": {**TINY_LM, "config": {**TINY_LM["config"], "n_positions": 128},
                                              "tokenizer_chars": string.digits + string.ascii_letters + " +-=:.?<>/"}}
    over = {"model": TINY_LM, "dataset.held_out": 10, **data,
            "population_size": 3, "evo_steps": 32, "max_env_steps": 288, "eval_prompts": 4,
            "target_fitness": None, "mutation.adapter_rank": 1.0, "mutation.rl_hp": 1.0, "torch_threads": 1,
            "hyperparameters.batch_size": 4, **extra}
    if cfg.algorithm in ("llm_bc", "llm_ilql"):  # offline: a few recorded games, a whole guess (5 letters, EOS)
        over.update({"dataset.games": {"games": 40}, "evo_steps": 8, "max_env_steps": 72,
                     "hyperparameters.max_new_tokens": 6})
    elif cfg.algorithm not in ("dpo", "sft"):  # (they sample no groups)
        over.update({"hyperparameters.group_size": 4, "hyperparameters.max_new_tokens": 4})
    return load_config(CONFIGS / name, over)


def _tiny(name: str, **extra):
    """The shipped config, shrunk to a few hundred steps per member (offline: gradient steps on a small
    random-policy dataset; LLM: a tiny base model)."""
    cfg = load_config(CONFIGS / name)
    if cfg.kind == "llm":
        return _tiny_llm(cfg, name, **{k: v for k, v in extra.items() if k != "mutation.parameters"})
    if cfg.kind == "language":  # a small game, a few played games and a tiny GPT: its algorithm and evolution stay
        return load_config(CONFIGS / name, {
            "population_size": 3, "evo_steps": 4, "max_env_steps": 36, "eval_games": 4, "target_fitness": None,
            "env.vocabulary": 60, "dataset.games": 40, "dataset.sha256": None, "dataset.min_return": None,
            "hyperparameters.batch_size": 8, "mutation.architecture": 1.0, "mutation.rl_hp": 1.0,
            "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "head_dim": 8, "mlp_hidden": 32}, **extra})
    over = {"population_size": 3, "evo_steps": 160, "max_env_steps": 1440, "eval_episodes": 2,
            "target_fitness": None, "eval_max_steps": 100, "network.hidden_sizes": [32, 32],
            "network.min_nodes": 16, "mutation.architecture": 1.0, "mutation.rl_hp": 1.0}
    hp = cfg.hyperparameters
    if cfg.kind in ("gym", "multi_agent"):
        over["num_envs"] = 2
    if hasattr(hp, "learning_delay"):
        over.update({"hyperparameters.learning_delay": 40, "hyperparameters.batch_size": 32,
                     "hyperparameters.buffer_size": 2000})
    if hasattr(hp, "random_steps"):
        over["hyperparameters.random_steps"] = 40
    if hasattr(hp, "rollout_steps"):
        over["hyperparameters.rollout_steps"] = 32
    if name.startswith(("carracing", "pong", "breakout")):  # pixels: slow here, so fewer steps and a small encoder
        over.update({"evo_steps": 32, "max_env_steps": 288, "eval_max_steps": 8,
                     "network.cnn.channels": [8, 8], "network.cnn.kernel_sizes": [8, 4],
                     "network.cnn.strides": [4, 2], "network.cnn.latent_dim": 32})
        over.update({"hyperparameters.rollout_steps": 8} if hasattr(hp, "rollout_steps") else
                    {"hyperparameters.learning_delay": 8, "hyperparameters.hard_update_every": 4})
    if cfg.kind == "offline":
        over["dataset.uri"] = _dataset_for(cfg.env_id)
        if hasattr(hp, "cql_n_actions"):
            over["hyperparameters.cql_n_actions"] = 2
    over.update(extra)
    return load_config(CONFIGS / name, over)


def _agent_tensors(exp):
    return [m.agent.state()[0] for m in exp.population.members]


# pixel configs: the ALE reloads its ROM at every env build and reset (~0.1 s each), so theirs are in the slow tier
PIXELS = ("breakout", "pong", "carracing")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n.startswith(PIXELS) else n
                                  for n in SHIPPED])
def test_every_shipped_config_trains_and_resumes_identically(name, tmp_path):
    """Each shipped config (shrunk) trains three generations through the local loop, saves its elite, learns as
    groups; and a run saved after its first generation and restored into a fresh evolution ends bit-identical to
    the straight one (every mutation kind drawn, weight noise included)."""
    cfg = _tiny(name, **{"mutation.parameters": 1.0})
    straight = build_evolution(cfg)
    res = train_local(cfg, progress=False, run_dir=tmp_path / "run", evolution=straight)
    if cfg.kind == "llm":  # a member's last learn step is whole: a generation may pass its share by less than one
        step = cfg.hyperparameters.batch_size * getattr(cfg.hyperparameters, "group_size", 1) * 2  # (group mutates)
        assert res.generations == 3 and 0 <= res.global_steps - cfg.max_env_steps < cfg.population_size * step
    else:
        assert res.generations == 3 and res.global_steps == cfg.max_env_steps
    assert all(np.isfinite(h.fitnesses).all() for h in res.history)
    assert (tmp_path / "run" / "elite" / "weights.safetensors").is_file()
    assert res.batching.startswith("on"), res.batching  # every shipped config's members learn as groups

    first = build_evolution(cfg)
    first.run_generation()
    first.save(tmp_path / "ckpt")
    resumed = build_evolution(cfg)
    resumed.restore(tmp_path / "ckpt")
    for a, b in zip(_agent_tensors(first), _agent_tensors(resumed), strict=True):  # the round trip itself
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    while not resumed.finished():
        resumed.evolve()
        resumed.run_generation()
    assert [h.fitnesses for h in resumed.history] == [h.fitnesses for h in straight.history]
    assert [h.mutations for h in resumed.history] == [h.mutations for h in straight.history]
    for a, b in zip(_agent_tensors(straight), _agent_tensors(resumed), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_gae_against_a_hand_computation():
    g, lam = 0.9, 0.8
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    dones = torch.tensor([[0.0], [1.0], [0.0]])  # the episode ends at t=1; t=2 starts a new one
    last = torch.tensor([2.0])
    adv, ret = compute_gae(rewards, values, dones, last, g, lam)
    d2 = 3 + g * 2.0 - 1.5
    d1 = 2 - 1.0  # done: no bootstrap, no carry
    d0 = 1 + g * 1.0 - 0.5
    expected = [d0 + g * lam * d1, d1, d2]
    assert adv[:, 0].tolist() == pytest.approx(expected)
    assert ret[:, 0].tolist() == pytest.approx([e + v for e, v in zip(expected, [0.5, 1.0, 1.5], strict=True)])


def test_ppo_clip_known_answers():
    from agilerl_core.algorithms.ppo import ppo_loss, value_loss

    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 0.5, 1.5, 0.5]))  # ratios
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    # per sample: A>0, r=1.5 -> clipped at 1.2: -1.2; A>0, r=0.5 -> -0.5; A<0, r=1.5 -> 1.5; A<0, r=0.5 -> 0.8
    assert ppo_loss(new, old, adv, 0.2).item() == pytest.approx((-1.2 - 0.5 + 1.5 + 0.8) / 4)
    v, ret, old_v = torch.tensor([3.0]), torch.tensor([0.0]), torch.tensor([1.0])
    assert value_loss(v, ret, old_v, None).item() == pytest.approx(4.5)
    assert value_loss(v, ret, old_v, 0.5).item() == pytest.approx(4.5)  # max(9, 1.5^2) / 2
    assert value_loss(torch.tensor([-1.0]), ret, old_v, 0.5).item() == pytest.approx(0.5)  # max(1, 0.5^2) / 2
    assert value_loss(torch.tensor([0.2]), ret, old_v, 0.5).item() == pytest.approx(0.125)  # clipped: 0.5^2 / 2


# ---- observation normalisation ----------------------------------------------------------------------


def test_running_obs_norm_matches_the_statistics_of_all_batches():
    from agilerl_core.networks.obs_norm import RunningObsNorm

    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(k, 3, generator=g) * torch.tensor([1.0, 5.0, 0.1]) + 2.0 for k in (1, 7, 30)]
    norm = RunningObsNorm(3, clip=3.0)
    for b in batches:
        norm.update(b)
    every = torch.cat(batches).double()
    assert torch.allclose(norm.mean, every.mean(0), atol=1e-12)
    assert torch.allclose(norm.var, every.var(0, unbiased=False), atol=1e-12)
    assert norm.count.item() == 38
    x = torch.tensor([[2.0, 2.0, 2.0], [1e6, -1e6, 0.0]])
    expected = ((x.double() - every.mean(0)) / torch.sqrt(every.var(0, unbiased=False) + 1e-8)).clamp(-3, 3)
    assert torch.allclose(norm(x), expected.float(), atol=1e-5)
    assert norm(x)[1].tolist()[:2] == [3.0, -3.0]  # clipped


@pytest.mark.parametrize("name", ["cartpole_dqn.yaml", "cartpole_ppo.yaml", "pendulum_sac.yaml"])
def test_normalize_obs_trains_saves_and_resumes_identically(name, tmp_path):
    cfg = _tiny(name, **{"hyperparameters.normalize_obs": True, "mutation.parameters": 1.0})
    straight = build_evolution(cfg)
    for g in range(3):
        if g:
            straight.evolve()
        straight.run_generation()
    for m in straight.population.members:
        norm = m.agent.obs_norm
        assert norm is not None and norm.count.item() > 0 and not torch.equal(norm.mean, torch.zeros(norm.dim))
        # every network of the agent (targets too, after architecture mutations) reads the same statistics
        assert all(net.obs_norm is norm for net in m.agent.networks.values())
        tensors, _ = m.agent.state()
        assert torch.equal(tensors["obs_norm/mean"], norm.mean)
    first = build_evolution(cfg)
    first.run_generation()
    first.save(tmp_path / "ckpt")
    resumed = build_evolution(cfg)
    resumed.restore(tmp_path / "ckpt")
    for _ in range(2):
        resumed.evolve()
        resumed.run_generation()
    assert [h.fitnesses for h in resumed.history] == [h.fitnesses for h in straight.history]
    for a, b in zip(_agent_tensors(straight), _agent_tensors(resumed), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_normalize_obs_changes_what_the_networks_see():
    cfg = _tiny("cartpole_dqn.yaml", **{"hyperparameters.normalize_obs": True})
    agent = build_evolution(cfg).population.members[0].agent
    obs = {"obs": torch.tensor([[0.1, 2.0, -0.2, 3.0], [0.3, -2.0, 0.2, 1.0]])}
    net = agent.networks["q"]
    assert torch.equal(net.features(obs), obs["obs"])  # no statistics yet: identity
    agent.observe(obs)
    feats = net.features(obs)
    assert torch.allclose(feats, torch.tensor([[-1.0, 1.0, -1.0, 1.0], [1.0, -1.0, 1.0, -1.0]]), atol=1e-4)
    clone = agent.clone()
    assert torch.equal(clone.networks["q"].features(obs), feats)  # a clone (selection) keeps the scale
