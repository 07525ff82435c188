"""Multi-frequency selection (MF-PBT): subpopulations that evolve at their own rhythm, brackets, asymmetric
migration, and the whole loop run with it (deterministic, resumable, recorded in the lineage)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from agilerl_core.errors import ConfigError
from agilerl_core.experiment import build_evolution
from agilerl_core.hpo.multi_frequency import MultiFrequencySelection, subpopulations
from agilerl_core.hpo.tournament import Placement
from tests.conftest import tiny_config

NAN = float("nan")


def test_subpopulations_are_contiguous_and_near_equal():
    assert subpopulations(4, 2) == [[0, 1], [2, 3]]
    assert subpopulations(7, 3) == [[0, 1, 2], [3, 4], [5, 6]]
    with pytest.raises(ValueError, match="3 subpopulations need at least 3 members"):
        MultiFrequencySelection([1, 2, 3]).groups(2)


@pytest.mark.parametrize(("n", "sizes"), [(1, (1, 0, 0, 0)), (2, (1, 0, 0, 1)), (3, (1, 0, 1, 1)),
                                          (4, (1, 1, 1, 1)), (8, (2, 2, 2, 2)), (10, (3, 1, 3, 3))])
def test_brackets_by_rank(n, sizes):
    f = np.arange(n, dtype=float)[::-1].copy()  # slot 0 best
    b = MultiFrequencySelection([1]).brackets(list(range(n)), f)
    assert (len(b.winners), len(b.survivors), len(b.migration), len(b.losers)) == sizes
    assert b.winners + b.survivors + b.migration + b.losers == list(range(n))  # best first, every slot once


def test_a_subpopulation_waits_for_its_period_and_nan_counts_as_worst():
    sel = MultiFrequencySelection([1, 3])
    rng = np.random.default_rng(0)
    f = [1.0, 2.0, NAN, 0.5]
    for generation, slow_evolves in ((0, False), (1, False), (2, True), (5, True)):
        plan = sel.plan(f, generation, rng)
        assert plan[1] == Placement(1, "kept") and plan[0] == Placement(1, "mutate")  # fast: loser <- winner
        if slow_evolves:
            assert plan[3] == Placement(3, "kept") and plan[2] == Placement(3, "mutate")  # NaN lost to 0.5
        else:
            assert plan[2:] == [Placement(2, "kept"), Placement(3, "kept")]


def test_migration_is_asymmetric_and_only_when_stronger():
    sel = MultiFrequencySelection([1, 4])  # slots 0-3 fast, 4-7 slow
    rng = np.random.default_rng(0)
    fast_strong = [9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0]
    plan = sel.plan(fast_strong, 3, rng)  # both evolve
    # the slow subpopulation's migration slot (its third, slot 6) takes the fast best's weights, the slow best's hp
    assert plan[6] == Placement(0, "migrant_weights", 4)
    assert plan[7].action == "mutate" and plan[7].parent == 4
    assert plan[2] == Placement(2, "kept")  # the fast one: nobody outside is stronger than its slot 2
    slow_strong = [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    plan = sel.plan(slow_strong, 3, rng)
    assert plan[1] == Placement(7, "migrant")  # fast ranks 3, 2, 1, 0: slot 1 is open, takes a whole clone
    assert plan[0].action == "mutate" and plan[0].parent == 3


def test_bad_shares_are_refused():
    with pytest.raises(ValueError, match="at most 1"):
        MultiFrequencySelection([1], winners=0.5, losers=0.5, migration=0.5)
    with pytest.raises(ValueError, match="periods"):
        MultiFrequencySelection([0])


def test_config_names_the_field():
    with pytest.raises(ConfigError, match=r"selection\.periods: 3 subpopulations need at least as many members"):
        tiny_config(population_size=2, **{"selection.method": "multi_frequency", "selection.periods": [1, 2, 3]})
    with pytest.raises(ConfigError, match=r"selection\.periods: only multi_frequency"):
        tiny_config(**{"selection.periods": [1, 2]})
    with pytest.raises(ConfigError, match="selection.*at most 1"):
        tiny_config(**{"selection.method": "multi_frequency", "selection.winners": 0.9, "selection.losers": 0.2})


def _mf_config(**extra):
    data = {"population_size": 4, "selection.method": "multi_frequency", "selection.periods": [1, 2],
            "mutation.no_mutation": 0.0, "mutation.architecture": 0.0, "mutation.activation": 0.0,
            "mutation.parameters": 0.0, "mutation.rl_hp": 1.0}
    return tiny_config(**{**data, **extra})


def test_weights_only_migrant_takes_the_hosts_hyperparameters():
    evo = build_evolution(_mf_config(population_size=8, **{"selection.periods": [1, 1]}))
    members = evo.population.members
    for i, m in enumerate(members):
        m.agent.set_hyperparameter("lr", 1e-4 * (i + 1))
    evo.population.record_fitness([9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0])
    donor, host = members[0], members[4]
    weights = {k: v.clone() for k, v in donor.agent.state()[0].items() if k.startswith("net/")}
    evo.evolve()
    # equal periods: a whole clone from the other subpopulation (hp included)
    migrant = evo.population.members[6]
    assert migrant.mutation == f"migrant({donor.member_id})" and migrant.agent.hp.lr == donor.agent.hp.lr
    sel = MultiFrequencySelection([1, 2])
    evo.settings = replace(evo.settings, selection=sel)
    evo.population.members = members
    evo.population.generation = 1
    evo.evolve()
    migrant = evo.population.members[6]
    assert migrant.mutation == f"migrant(weights of {donor.member_id}, hp of {host.member_id})"
    assert migrant.agent.hp.lr == host.agent.hp.lr
    tensors = migrant.agent.state()[0]
    assert weights and all(torch.equal(tensors[k], v) for k, v in weights.items())


def _run(cfg, gens):
    evo = build_evolution(cfg)
    for _ in range(gens):
        evo.run_generation()
        evo.evolve()
    return evo


def test_the_loop_runs_deterministically_with_subpopulations():
    cfg = _mf_config()
    a, b = _run(cfg, 3), _run(cfg, 3)
    assert [h.fitnesses for h in a.history] == [h.fitnesses for h in b.history]
    events = [(e.generation, e.slot, e.mutation) for e in a.population.lineage]
    assert events == [(e.generation, e.slot, e.mutation) for e in b.population.lineage]
    by_gen = {g: [m for (gg, _, m) in events if gg == g] for g in range(1, 4)}
    # the fast pair (slots 0-1) evolves every generation: one kept, one mutated; the slow pair every second one
    assert all(sorted(k.split(":")[0] for k in by_gen[g][:2]) == ["hp", "kept"] for g in (1, 2, 3))
    assert by_gen[1][2:] == ["kept", "kept"] and by_gen[3][2:] == ["kept", "kept"]
    assert sorted(k.split(":")[0] for k in by_gen[2][2:]) == ["hp", "kept"]
