"""Evolution off (``selection: {method: none}``, issue 67 item 2): every member continues itself in its own slot,
never mutated, crossed or replaced, whatever the mutation settings; the ablation beside which a run with
selection shows what evolution adds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agilerl_core.errors import ConfigError
from agilerl_core.evolution import selection_of
from agilerl_core.experiment import build_evolution
from agilerl_core.hpo.tournament import NoSelection, Placement
from tests.conftest import tiny_config

# every mutation kind as likely as it can be: with selection on, every slot but the elite would change
EAGER = {"mutation.no_mutation": 0.0, "mutation.architecture": 0.4, "mutation.activation": 0.2,
         "mutation.parameters": 0.2, "mutation.rl_hp": 0.2}


def test_every_slot_keeps_its_own_member():
    sel = NoSelection()
    rng = np.random.default_rng(0)
    assert sel.plan([3.0, float("nan"), 9.0], 0, rng) == [Placement(0, "kept"), Placement(1, "kept"),
                                                          Placement(2, "kept")]
    assert sel.second_parent([3.0, 9.0], 0, rng) == 0 and not sel.elitism
    assert isinstance(selection_of(tiny_config(**{"selection.method": "none"})), NoSelection)


def test_a_run_without_evolution_never_changes_a_member_but_by_learning():
    cfg = tiny_config(population_size=3, **{"selection.method": "none"}, **EAGER)
    evo = build_evolution(cfg)
    start = [(m.member_id, m.agent.hp.model_dump(), m.agent.describe()) for m in evo.population.members]
    weights = []
    for _ in range(3):
        evo.run_generation()
        weights.append([{k: t.clone() for k, t in m.agent.state()[0].items()} for m in evo.population.members])
        evo.evolve()
    by_gen = {}
    for e in evo.population.lineage:
        by_gen.setdefault(e.generation, []).append(e)
    ids = [m_id for m_id, _, _ in start]
    for g in range(1, 4):  # slot s of generation g is the member of slot s of generation g-1, carried on as it was
        events = sorted(by_gen[g], key=lambda e: e.slot)
        assert [e.mutation for e in events] == ["kept"] * 3
        assert [e.parent_id for e in events] == ids
        ids = [e.member_id for e in events]
    for (_, hp, arch), m in zip(start, evo.population.members, strict=True):
        assert m.agent.hp.model_dump() == hp and m.agent.describe() == arch  # no hyperparameter or network mutation
    # the weights move only by learning: every slot's tensors keep their names and shapes, and they learned
    for first, last in zip(weights[0], weights[-1], strict=True):
        assert {k: t.shape for k, t in first.items()} == {k: t.shape for k, t in last.items()}
        assert any(not torch.equal(first[k], last[k]) for k in first)


def test_a_run_without_evolution_is_deterministic():
    cfg = tiny_config(population_size=2, **{"selection.method": "none"}, **EAGER)
    runs = []
    for _ in range(2):
        evo = build_evolution(cfg)
        for _ in range(2):
            evo.run_generation()
            evo.evolve()
        runs.append([h.fitnesses for h in evo.history])
    assert runs[0] == runs[1]


def test_periods_belong_to_multi_frequency_only():
    with pytest.raises(ConfigError, match=r"selection\.periods: only multi_frequency"):
        tiny_config(**{"selection.method": "none", "selection.periods": [1, 2]})


def test_every_nth_evaluation_evolves_and_the_ones_between_carry_on():
    """``selection.every`` (issue 67 item 5): evaluated every generation, selected and mutated after every N-th
    evaluation only, so a short evo_steps judges the population early without selecting on every short phase."""
    from agilerl_core.hpo.tournament import EveryNth

    cfg = tiny_config(population_size=3, max_env_steps=3600, **{"selection.every": 3}, **EAGER)
    evo = build_evolution(cfg)
    assert isinstance(evo.settings.selection, EveryNth) and evo.settings.selection.every == 3
    for _ in range(6):
        evo.run_generation()
        evo.evolve()
    by_gen: dict[int, list[str]] = {}
    for e in evo.population.lineage:
        by_gen.setdefault(e.generation, []).append(e.mutation)
    for gen in (1, 2, 4, 5):  # born after evaluations 0, 1, 3, 4: carried on
        assert by_gen[gen] == ["kept"] * 3, (gen, by_gen[gen])
    for gen in (3, 6):  # born after evaluations 2 and 5: a tournament, the elite in slot 0, the rest mutated
        assert by_gen[gen][0] == "elite" and all(m != "kept" for m in by_gen[gen][1:]), (gen, by_gen[gen])
    assert type(selection_of(tiny_config())).__name__ == "TournamentSelection"  # every: 1 is the plain tournament
    with pytest.raises(ConfigError, match="selection.every: only tournament selection"):
        tiny_config(**{"selection.method": "multi_frequency", "selection.every": 2})
