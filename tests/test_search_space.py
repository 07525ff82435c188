"""A population that searches (issue 67 item 3): the default mutable space as wide as the zoo's samplers where a
member can change a value mid-run, discounts moved on their horizon, the first generation drawn from the space
or spread around the config, a resample move beside the scaling one; and (item 6) what a run found handed over:
the champion's hyperparameters, their moves along its line, and a config that re-runs from them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from agilerl_core.algorithms.registry import ALGORITHMS
from agilerl_core.arenas.base import checked_space
from agilerl_core.errors import ConfigError
from agilerl_core.experiment import build_evolution, train_local
from agilerl_core.hpo.found import found_hyperparameters, found_words, rerun_config
from agilerl_core.hpo.mutation import Mutations
from agilerl_core.hpo.space import HyperparameterSpec, initial_values
from tests.conftest import tiny_config

GAMMA = HyperparameterSpec(min=0.9, max=0.9999, kind="discount", grow=1.5, shrink=1 / 1.5)


def test_a_discount_moves_its_horizon_by_the_factor_and_stays_below_one():
    rng = np.random.default_rng(0)
    for value in (0.9, 0.99, 0.999):
        for _ in range(200):
            new = GAMMA.mutate(value, rng)
            assert GAMMA.min <= new <= GAMMA.max < 1
            ratio = (1 - new) / (1 - value)
            # the factor on the horizon lies in [shrink, grow] unless the bounds clipped it
            assert 1 / 1.5 - 1e-9 <= ratio <= 1.5 + 1e-9 or new in (GAMMA.min, GAMMA.max)
    with pytest.raises(ValueError, match="discount hyperparameter needs 0 <= min and max < 1"):
        HyperparameterSpec(min=0.9, max=1.0, kind="discount")


def test_sampling_covers_the_range_on_the_kind_s_scale():
    rng = np.random.default_rng(1)
    log = HyperparameterSpec(min=1e-5, max=1e-2, kind="log")
    xs = [log.sample(rng) for _ in range(2000)]
    assert min(xs) >= 1e-5 and max(xs) <= 1e-2
    assert abs(np.median(np.log10(xs)) - (-3.5)) < 0.15  # log-uniform: the median at the geometric middle
    hs = [1 / (1 - GAMMA.sample(rng)) for _ in range(2000)]  # horizons from 10 to 10,000 steps
    assert abs(np.median(np.log10(hs)) - 2.5) < 0.15
    ints = [HyperparameterSpec(min=32, max=512, kind="int").sample(rng) for _ in range(500)]
    assert all(isinstance(i, int) and 32 <= i <= 512 for i in ints) and np.median(ints) < 200  # log-uniform
    flt = HyperparameterSpec(min=0.1, max=1.0, kind="float")
    assert abs(np.median([flt.sample(rng) for _ in range(2000)]) - 0.55) < 0.05  # uniform


def test_a_spread_stays_within_its_factor_and_the_bounds():
    rng = np.random.default_rng(2)
    lr = HyperparameterSpec(min=1e-5, max=1e-2, kind="log")
    for _ in range(500):
        x = lr.spread(1e-3, 3.0, rng)
        assert 1e-3 / 3 - 1e-12 <= x <= 3e-3 + 1e-12
        g = GAMMA.spread(0.99, 2.0, rng)
        assert 0.005 / 2 - 1e-12 <= 1 - g <= 0.02 + 1e-12


@pytest.mark.parametrize("algo", ["dqn", "ppo", "td3", "sac"])
def test_every_default_mutable_hyperparameter_is_per_member_within_a_group(algo):
    """A name in an algorithm's default space must be one the stacked group reads per member (never one in the
    batch key: two members differing in it would stop learning together, and a mutation would split a group)."""
    env = "Pendulum-v1" if algo in ("td3", "sac") else "CartPole-v1"
    extra = {"hyperparameters": {"rollout_steps": 32}} if algo == "ppo" else {}
    evo = build_evolution(tiny_config(env_id=env, algorithm=algo, population_size=2, hp_space_preset="wide", **extra))
    space = evo.arena.space
    assert len(space) >= 6, sorted(space)  # the zoo's samplers search this many of these at least
    a, b = (m.agent for m in evo.population.members)
    rng = np.random.default_rng(3)
    for name, spec in space.items():
        b.set_hyperparameter(name, spec.sample(rng))
        assert a.batch_key() == b.batch_key(), f"{algo}: {name} is in the batch key"
    assert "max_grad_norm" not in space and "rollout_steps" not in space


def test_default_bounds_stretch_to_the_config_but_declared_bounds_refuse():
    ppo = ALGORITHMS["ppo"]  # what checked_space reads of an algorithm: its hyperparameter model

    def config(**hp):
        return tiny_config(algorithm="ppo", hp_space_preset="wide", hyperparameters={"rollout_steps": 32, **hp})

    space = checked_space(config(gamma=0.8, ent_coef=0.0), ppo)
    assert space["gamma"].min == 0.8 and space["gamma"].kind == "discount"
    assert "ent_coef" not in space  # a log scale cannot hold 0: left at the config's value
    assert "gamma" not in checked_space(config(gamma=1.0), ppo)
    cfg = tiny_config(algorithm="ppo", hyperparameters={"rollout_steps": 32, "gamma": 0.8},
                      hp_space={"gamma": {"min": 0.9}})  # completed from the wide declaration: a discount
    with pytest.raises(ConfigError, match=r"hyperparameters\.gamma: initial value 0\.8 lies outside hp_space\.gamma"):
        build_evolution(cfg)


@pytest.mark.parametrize("method", ["spread", "sample"])
def test_the_first_generation_is_drawn_and_slot_0_keeps_the_config(method):
    cfg = tiny_config(population_size=4, **{"hp_init.method": method, "hp_init.spread": 3.0})
    evo = build_evolution(cfg)
    space = evo.arena.space
    hps = [m.agent.hp.model_dump() for m in evo.population.members]
    assert {n: hps[0][n] for n in space} == {n: getattr(cfg.hyperparameters, n) for n in space}
    for hp in hps[1:]:
        assert any(hp[n] != hps[0][n] for n in space)
        for n, spec in space.items():
            assert spec.min <= hp[n] <= spec.max, n
            if method == "spread" and spec.kind == "log":
                assert hps[0][n] / 3 - 1e-12 <= hp[n] <= hps[0][n] * 3 + 1e-12, n
    # the lineage records what each member started from; the same config and seed draw the same
    assert [e.hyperparameters for e in evo.population.lineage] == hps
    assert [m.agent.hp.model_dump() for m in build_evolution(cfg).population.members] == hps
    # the optimiser's rate is the drawn one, not the config's
    member = evo.population.members[1].agent
    assert all(opt.lr == getattr(member.hp, member.lr_field_for(n)) for n, opt in member.optimizers.items())


def test_the_default_preset_keeps_the_narrow_space_and_wide_adds_the_zoo_s_names():
    dqn = ALGORITHMS["dqn"]
    assert sorted(checked_space(tiny_config(), dqn)) == ["batch_size", "learn_step", "lr"]
    assert sorted(checked_space(tiny_config(hp_space_preset="wide"), dqn)) == [
        "batch_size", "eps_decay_steps", "eps_end", "gamma", "learn_step", "lr", "tau"]
    # one name from the wide declaration, without the preset: completed with its kind and bounds
    assert checked_space(tiny_config(hp_space={"gamma": {"min": 0.95}}), dqn)["gamma"].kind == "discount"


def test_the_config_method_draws_nothing():
    evo = build_evolution(tiny_config(population_size=3))
    assert len({str(m.agent.hp.model_dump()) for m in evo.population.members}) == 1
    with pytest.raises(ValueError, match="hp_init.method"):
        initial_values({}, {}, "grid", 2.0, np.random.default_rng(0))


class _Member:
    def __init__(self, **hp):
        from types import SimpleNamespace

        self.hp = SimpleNamespace(**hp)

    def set_hyperparameter(self, name, value):
        setattr(self.hp, name, value)


def test_a_resample_draws_from_the_whole_range_and_off_draws_as_before():
    lr = HyperparameterSpec(min=1e-5, max=1e-2, kind="log", grow=1.5, shrink=1 / 1.5)
    on = Mutations({"rl_hp": 1.0}, 0.0, 0.0, {"lr": lr}, None, resample=1.0)
    rng = np.random.default_rng(4)
    seen = []
    for _ in range(200):
        m = _Member(lr=1e-3)
        what = on.rl_hp(m, rng)
        assert what.startswith("hp:lr~") and 1e-5 <= m.hp.lr <= 1e-2
        seen.append(m.hp.lr)
    assert min(seen) < 1e-4 and max(seen) > 5e-3  # far beyond one scaling step (x1.5)
    off = Mutations({"rl_hp": 1.0}, 0.0, 0.0, {"lr": lr}, None)
    r1, r2 = np.random.default_rng(5), np.random.default_rng(5)
    m = _Member(lr=1e-3)
    assert off.rl_hp(m, r1).startswith("hp:lr=")
    assert m.hp.lr == lr.mutate(1e-3, r2) and r1.random() == r2.random()  # no extra draw when resampling is off


# ---- what the run found -----------------------------------------------------------------------------------
def _event(gen, slot, mid, parent, mutation, lr, gamma):
    return {"generation": gen, "slot": slot, "member_id": mid, "parent_id": parent, "mutation": mutation,
            "hyperparameters": {"lr": lr, "gamma": gamma, "double": True}, "architecture": "mlp", "fitness": 1.0}


def test_found_follows_the_champion_s_line_and_reports_the_population():
    lineage = [_event(0, 0, 0, None, "init", 1e-3, 0.99), _event(0, 1, 1, None, "init", 2e-3, 0.95),
               _event(1, 0, 2, 1, "elite", 2e-3, 0.95), _event(1, 1, 3, 1, "hp:gamma=0.97", 2e-3, 0.97),
               _event(2, 0, 4, 3, "elite", 2e-3, 0.97), _event(2, 1, 5, 3, "hp:lr=0.003", 3e-3, 0.97)]
    found = found_hyperparameters(lineage, 5, ["lr", "gamma"])
    assert found["values"] == {"gamma": 0.97, "lr": 3e-3} and found["started_from"] == {"gamma": 0.95, "lr": 2e-3}
    assert [(m["generation"], m["member_id"], m["changed"]) for m in found["moves"]] == [
        (1, 3, {"gamma": [0.95, 0.97]}), (2, 5, {"lr": [2e-3, 3e-3]})]
    assert found["population"]["lr"] == {"min": 2e-3, "median": 2.5e-3, "max": 3e-3}
    words = found_words(found)
    assert "gamma 0.97 (from 0.95)" in words and "lr 0.003 (from 0.002)" in words and "2 changes" in words
    with pytest.raises(KeyError, match="member 9"):
        found_hyperparameters(lineage, 9, ["lr"])
    looped = [{**lineage[0], "parent_id": 0}]  # a damaged record whose member is its own parent
    assert found_hyperparameters(looped, 0, ["lr"])["values"] == {"lr": 1e-3}
    cfg = rerun_config({"name": "x", "hyperparameters": {"lr": 1e-3, "batch_size": 32}, "seed": 3}, found["values"])
    assert cfg == {"name": "x", "hyperparameters": {"lr": 3e-3, "batch_size": 32, "gamma": 0.97}, "seed": 3,
                   "hp_init": {"method": "config"}}


def test_a_run_writes_the_config_that_re_runs_from_its_champion(tmp_path):
    from agilerl_core.algorithms.saved import load_member
    from tasks.config import load_config

    cfg = tiny_config(population_size=3, output_dir=str(tmp_path), max_env_steps=1800,
                      **{"hp_init.method": "sample", "mutation.rl_hp": 1.0, "mutation.no_mutation": 0.0,
                         "mutation.architecture": 0.0, "mutation.parameters": 0.0})
    res = train_local(cfg, progress=False, run_dir=tmp_path / "run")
    found = res.summary()["found"]
    assert found["member_id"] == res.champion["member_id"]
    champion, _ = load_member(res.best_uri)
    assert found["values"] == {n: getattr(champion.agent.hp, n) for n in found["values"]}
    assert res.summary()["found_config_uri"] == str((tmp_path / "run" / "found_config.yaml").resolve())
    text = (tmp_path / "run" / "found_config.yaml").read_text()
    assert text.startswith("# What run run found")
    again = load_config(tmp_path / "run" / "found_config.yaml")
    assert {n: getattr(again.hyperparameters, n) for n in found["values"]} == found["values"]
    assert again.hp_init.method == "config" and again.seed == cfg.seed and again.env_id == cfg.env_id
    assert again.max_env_steps == cfg.max_env_steps and again.population_size == 3
    assert all(math.isfinite(v) for v in found["values"].values())
    assert yaml.safe_load(text)["hyperparameters"]["buffer_size"] == 5000  # the config's own settings carry over


# ---- colored exploration noise (item 4) ----------------------------------------------------------------------
def test_colored_sequences_have_unit_variance_and_more_memory_as_beta_grows():
    import torch

    from agilerl_core.algorithms.actor_critic.colored import colored_sequences

    white = torch.randn(4000, 500, generator=torch.Generator().manual_seed(0))
    lag = {}
    for beta in (0.0, 1.0, 2.0):
        x = colored_sequences(white, beta)
        assert x.shape == white.shape and abs(float(x.var()) - 1.0) < 0.03, beta
        lag[beta] = float((x[:, :-20] * x[:, 20:]).mean())  # correlation 20 steps apart
    assert abs(lag[0.0]) < 0.01 and 0.2 < lag[1.0] < lag[2.0]
    per_member = colored_sequences(white[:3], torch.tensor([0.0, 1.0, 2.0]).view(3, 1))
    assert torch.allclose(per_member[1], colored_sequences(white[1:2], 1.0)[0], atol=1e-6)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_pink_exploration_is_a_config_option_whose_groups_stay_apart(algo):
    base = {"env_id": "Pendulum-v1", "algorithm": algo}
    pink = build_evolution(tiny_config(**base, **{"hyperparameters.noise_type": "pink"})).population.members[0].agent
    white = build_evolution(tiny_config(**base)).population.members[0].agent
    assert pink.hp.noise_type == "pink" and pink.batch_key() != white.batch_key()  # never one group: draws differ
    with pytest.raises(ConfigError, match="noise_type"):
        tiny_config(**base, **{"hyperparameters.noise_type": "purple"})
