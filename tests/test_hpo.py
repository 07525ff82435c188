"""Evolution: hyperparameter space, tournament with elitism, mutation probabilities, optimiser state,
lineage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agilerl_core.hpo.evolvable import MUTATION_KINDS
from agilerl_core.hpo.mutation import Mutations
from agilerl_core.hpo.population import Population
from agilerl_core.hpo.space import HyperparameterSpec, merge_space
from agilerl_core.hpo.tournament import TournamentSelection
from agilerl_core.networks import ArchBounds
from agilerl_core.networks.arch_mutation import propose_mutation
from tests.conftest import greedy, learn_alone
from tests.test_dqn import make_dqn


def test_hyperparameter_mutation_stays_in_bounds_and_moves():
    rng = np.random.default_rng(0)
    spec = HyperparameterSpec(min=1, max=8, kind="int", grow=1.5, shrink=0.75)
    v = 4
    values = set()
    for _ in range(200):
        new = spec.mutate(v, rng)
        assert isinstance(new, int) and 1 <= new <= 8
        values.add(new)
        v = new
    assert {1, 8} <= values  # reaches both bounds
    assert HyperparameterSpec(min=1, max=16, kind="int").mutate(1, np.random.default_rng(1)) in (1, 2)
    lr = HyperparameterSpec(min=1e-4, max=1e-2, kind="log", grow=2.0, shrink=0.5)
    for _ in range(100):
        x = lr.mutate(1e-3, rng)
        assert 5e-4 <= x <= 2e-3


def test_bad_space_declarations_are_rejected():
    with pytest.raises(ValueError, match="min"):
        HyperparameterSpec(min=2, max=1)
    with pytest.raises(ValueError, match="log"):
        HyperparameterSpec(min=0, max=1, kind="log")


def test_space_overrides_merge_and_remove():
    base = {"lr": HyperparameterSpec(min=1e-5, max=1e-2, kind="log"), "batch_size": HyperparameterSpec(min=8, max=64)}
    out = merge_space(base, {"lr": {"max": 1e-3}, "batch_size": None})
    assert set(out) == {"lr"} and out["lr"].max == 1e-3 and out["lr"].min == 1e-5 and out["lr"].kind == "log"


def test_tournament_with_elitism_always_keeps_the_best():
    t = TournamentSelection(size=2, elitism=True)
    rng = np.random.default_rng(0)
    for _ in range(500):
        f = rng.normal(size=6).tolist()
        parents = t.select(f, rng)
        assert len(parents) == 6 and parents[0] == int(np.argmax(f))
        # a tournament of 2 never picks the single worst member
        assert int(np.argmin(f)) not in parents[1:]


def test_tournament_without_elitism_and_nan_fitness():
    rng = np.random.default_rng(0)
    parents = TournamentSelection(size=3, elitism=False).select([float("nan"), 1.0, 0.0], rng)
    assert parents == [1, 1, 1]  # size 3 of 3: always the best; NaN counts as worst


def test_mutation_probabilities_are_respected():
    weights = {"none": 0.4, "architecture": 0.2, "parameters": 0.1, "activation": 0.1, "rl_hp": 0.2}
    m = Mutations(weights, 0.5, 0.1, {}, ArchBounds())
    rng = np.random.default_rng(0)
    n = 20_000
    counts = {k: 0 for k in MUTATION_KINDS}
    for _ in range(n):
        counts[m.choose(rng)] += 1
    for k, w in weights.items():
        assert abs(counts[k] / n - w) < 0.015, (k, counts[k] / n)
    zero = Mutations({"none": 0.0, "rl_hp": 1.0}, 0.5, 0.1, {}, ArchBounds())
    assert {zero.choose(rng) for _ in range(100)} == {"rl_hp"}


def test_optimiser_state_is_kept_across_architecture_mutation():
    agent = make_dqn(hidden=(16, 16))
    b_obs = {"obs": torch.randn(32, 3)}
    from agilerl_core.buffers.replay import Transition

    batch = Transition(b_obs, torch.randint(0, 2, (32,)), torch.randn(32), b_obs, torch.zeros(32))
    for _ in range(5):
        learn_alone(agent, batch)
    before = agent.optimizers["q"].state_tensors()
    arch, _ = propose_mutation(agent.arch, "mlp.add_nodes", ArchBounds(node_changes=(16,)), np.random.default_rng(3))
    changed_layer = next(i for i, (a, b) in enumerate(zip(arch.mlp.hidden, agent.arch.mlp.hidden, strict=True)) if a != b)
    kept = agent.apply_architecture(arch)
    after = agent.optimizers["q"].state_tensors()
    for key, value in after.items():
        name = key.split("/", 1)[1]
        if before.get(key) is not None and before[key].shape == value.shape:
            assert torch.equal(value, before[key]), key  # same shape: Adam moments and step kept
            assert f"q.{name}" in kept
        else:  # changed shape: the overlap keeps its moments and step counts, new entries start fresh
            old = before[key]
            overlap = tuple(slice(0, min(a, b)) for a, b in zip(value.shape, old.shape, strict=True))
            assert torch.equal(value[overlap], old[overlap]), key
            fresh = 1.0 if "pow" in key else 0.0
            rest = torch.ones_like(value, dtype=torch.bool)
            rest[overlap] = False
            assert torch.all(value[rest] == fresh), key
    assert f"q.mlp.hidden.{changed_layer}.weight" in kept and len(kept) == len(after) // 4
    learn_alone(agent, batch)  # and it keeps training


def test_mutations_of_every_kind_leave_a_working_agent():
    space = {"lr": HyperparameterSpec(min=1e-4, max=1e-2, kind="log"),
             "batch_size": HyperparameterSpec(min=8, max=64, kind="int")}
    rng = np.random.default_rng(0)
    m = Mutations({"none": 0, "architecture": 1, "parameters": 1, "activation": 1, "rl_hp": 1}, 0.5, 0.1, space,
                  ArchBounds(min_nodes=8, max_nodes=64, node_changes=(8,)))
    agent = make_dqn()
    obs = {"obs": torch.randn(4, 3)}
    kinds = set()
    for _ in range(40):
        desc = m.mutate(agent, rng)
        kinds.add(desc.split(":")[0])
        assert greedy(agent, obs).shape == (4,)
        assert agent.networks["q"].arch == agent.networks["q_target"].arch == agent.arch
        assert 1e-4 <= agent.hp.lr <= 1e-2 and agent.optimizers["q"].lr == agent.hp.lr
    assert {"arch", "params", "activation", "hp"} <= kinds


def test_population_lineage_records_parents_and_mutations():
    agents = [make_dqn(seed=i) for i in range(4)]
    pop = Population.create(agents, seed=0)
    muts = Mutations({"none": 1, "rl_hp": 1}, 0.5, 0.1, {"lr": HyperparameterSpec(min=1e-5, max=1e-1, kind="log")},
                     ArchBounds())
    tour = TournamentSelection(2, True)
    for gen in range(3):
        pop.record_fitness([float(i + gen) for i in range(4)])
        ids = [m.member_id for m in pop.members]
        pop.evolve(tour, muts)
        assert pop.generation == gen + 1
        assert pop.members[0].parent_id == ids[3] and pop.members[0].mutation == "elite"
        assert all(m.parent_id in ids for m in pop.members)
        assert len({m.member_id for m in pop.members}) == 4 and min(m.member_id for m in pop.members) > max(ids)
    events = pop.lineage
    assert len(events) == 16 and [e.generation for e in events] == sorted(e.generation for e in events)
    assert all(e.fitness is not None for e in events if e.generation < 3)
    assert all("lr" in e.hyperparameters for e in events)


def test_partial_hp_space_override_keeps_the_algorithms_kind():
    """{min, max} in a config must not turn an int hyperparameter into a float one (a mutated
    batch_size of 153.6 crashed a run)."""
    import numpy as np

    from agilerl_core.experiment import build_evolution
    from tasks.config import load_config
    from tests.conftest import ROOT_DIR

    cfg = load_config(ROOT_DIR / "deployments/configs/cartpole_dqn.yaml")
    assert cfg.hp_space["batch_size"].kind == "int" and cfg.hp_space["batch_size"].grow == 1.5
    assert cfg.hp_space["lr"].kind == "log"
    exp = build_evolution(cfg.model_copy(update={"population_size": 1}))
    agent = exp.population.members[0].agent
    rng = np.random.default_rng(0)
    for _ in range(30):
        exp.settings.mutations.rl_hp(agent, rng)
        assert isinstance(agent.hp.batch_size, int) and isinstance(agent.hp.learn_step, int)
    agent.set_hyperparameter("batch_size", 100.4)  # a float-kind override on an int field rounds
    assert agent.hp.batch_size == 100
