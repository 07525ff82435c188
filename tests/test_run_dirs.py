"""Every run keeps its own directory (a latest link per name), and a run returns the best member it ever
evaluated beside its final elite."""

from __future__ import annotations

import torch

import agilerl_core as ac
from agilerl_core.api.evolving import env_run_name
from tests.test_api import Corridor, corridor_config


def test_runs_never_overwrite_each_other_and_latest_points_at_the_newest(tmp_path):
    cfg = corridor_config(output_dir=str(tmp_path), max_env_steps=600, evo_steps=300, population_size=2)
    first = ac.evolve(cfg, env=Corridor, progress=False)
    second = ac.evolve(cfg, env=Corridor, progress=False)
    assert first.run_dir != second.run_dir and first.run_dir.parent == second.run_dir.parent == tmp_path
    for res in (first, second):
        assert res.run_dir.name.startswith("corridor-s0-")
        for part in ("elite", "best", "population"):
            assert (res.run_dir / part).is_dir()
    latest = tmp_path / "corridor-latest"
    assert latest.is_symlink() and latest.resolve() == second.run_dir.resolve()
    assert ac.load(latest / "elite").predict(Corridor().reset(seed=0)[0]) in (0, 1)
    # an explicit run_dir is used as given and moves no pointer
    mine = ac.evolve(cfg, env=Corridor, progress=False, run_dir=tmp_path / "mine")
    assert mine.run_dir == tmp_path / "mine" and latest.resolve() == second.run_dir.resolve()


def test_an_unnamed_run_is_named_after_its_env():
    assert env_run_name(Corridor, "experiment") == "corridor"
    assert env_run_name("ALE/Pong-v5", "experiment") == "ale-pong-v5"
    assert env_run_name(lambda: None, "experiment") == "lambda"
    assert env_run_name("///", "experiment") == "experiment"


def _always(policy, action: int) -> None:
    """Make a DQN member's greedy action `action` in every state (its output layer: a constant preference)."""
    out = dict(policy.agent.networks["q"].named_parameters())
    with torch.no_grad():
        out["mlp.out.weight"].zero_()
        out["mlp.out.bias"].copy_(torch.tensor([10.0, 0.0] if action == 0 else [0.0, 10.0]))


class Collapse(ac.Callback):
    """Every member walks right (reaches the goal: 0.96) in generation 0, then left (never: -0.5)."""

    def __init__(self) -> None:
        self.generation = 0

    def on_member_trained(self, slot, member, result):
        _always(member, 1 if self.generation == 0 else 0)

    def on_generation(self, stats, population):
        self.generation = stats.generation + 1


def test_the_best_member_ever_is_returned_when_the_population_collapses(tmp_path):
    res = ac.evolve(corridor_config(output_dir=str(tmp_path), max_env_steps=1800), env=Corridor,
                    callbacks=[Collapse()], progress=False)
    assert [round(h.best_fitness, 2) for h in res.history] == [0.96, -0.5]
    assert round(res.elite.fitness, 2) == -0.5
    champion = res.run.champion
    assert champion["chosen"] == "best_ever" and champion["generation"] == 0 and round(champion["fitness"], 2) == 0.96
    assert [c["role"] for c in champion["candidates"]] == ["final_elite", "best_ever"]
    obs = Corridor().reset(seed=0)[0]
    assert res.best.predict(obs) == 1 and res.elite.predict(obs) == 0
    saved = ac.load(res.run_dir / "best")  # saved beside the elite, and named in the summary
    assert saved.predict(obs) == 1 and res.summary["best_uri"] == str((res.run_dir / "best").resolve())


def test_a_run_whose_last_generation_is_its_best_returns_its_final_elite_as_best(tmp_path):
    class Improve(Collapse):
        def on_member_trained(self, slot, member, result):
            _always(member, 0 if self.generation == 0 else 1)

    res = ac.evolve(corridor_config(output_dir=str(tmp_path), max_env_steps=1800), env=Corridor,
                    callbacks=[Improve()], progress=False)
    assert [round(h.best_fitness, 2) for h in res.history] == [-0.5, 0.96]
    assert res.run.champion["chosen"] == "final_elite" and len(res.run.champion["candidates"]) == 1
    assert res.best is res.elite
