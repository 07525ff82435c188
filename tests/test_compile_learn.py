"""compile_learn: DQN's gradient step as one compiled graph computes what the eager step computes."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from agilerl_core.config import GymExperimentConfig
from agilerl_core.experiment import build_evolution
from tests.test_group import assert_same_members, dqn, filled_buffer

# aot_eager: Dynamo's and AOT autograd's capture of the whole step (what Inductor compiles) without generating code
BACKEND = "aot_eager"


def run_plan(members, buf, plan, compiled: bool):
    group = type(members[0]).group(members)
    if compiled:
        assert group.compile_learn(BACKEND)
    losses = [group.learn_step(buf, list(range(len(members))), active) for active in plan]
    group.write_back()
    return losses


@pytest.mark.parametrize("options", [
    {},  # soft targets, double Q, MSE
    {"hard_update_every": 2, "double": False, "loss": "huber", "max_grad_norm": 0.5},
    {"per": True, "n_step": 3},
], ids=["soft", "hard-huber-clipped", "per-nstep"])
def test_compiled_step_learns_as_the_eager_step(options):
    """Every member's weights, Adam state, targets and losses after steps with members sitting out, of two batch
    sizes and two widths (zero-padded), equal the eager group's."""
    def members():
        return [dqn(0, hidden=(16, 16), batch_size=32, lr=1e-3, **options),
                dqn(1, hidden=(16, 12), batch_size=24, lr=3e-3, **options),
                dqn(2, hidden=(16, 16), batch_size=32, lr=2e-3, **options)]
    n_step = options.get("n_step", 1)
    plan = [[True, True, True], [True, False, True], [False, True, True], [True, True, True]]
    eager_members, compiled_members = members(), members()
    eager = run_plan(eager_members, filled_buffer(3, n_step=n_step), plan, compiled=False)
    compiled = run_plan(compiled_members, filled_buffer(3, n_step=n_step), plan, compiled=True)
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert_same_members(eager_members, compiled_members)
    if options.get("per"):  # the priorities the compiled step's signal wrote are the eager step's
        for a, b in zip(eager_members, compiled_members, strict=True):
            assert a.per.tree.leaves.any()
            torch.testing.assert_close(torch.as_tensor(a.per.tree.leaves), torch.as_tensor(b.per.tree.leaves),
                                       atol=1e-5, rtol=1e-4)


def test_a_step_the_graph_does_not_cover_stays_eager():
    """Noisy, dueling or C51 heads (and CQN's penalty) are not the plain TD step: compile_learn says so and the
    group learns eagerly."""
    group = type(dqn(0)).group([dqn(0, noisy=True), dqn(1, noisy=True)])
    assert not group.compile_learn(BACKEND) and group.compiled is None
    group.learn_step(filled_buffer(2), [0, 1], [True, True])


@pytest.mark.parametrize(("overrides", "names"), [
    ({"algorithm": "ppo", "hyperparameters": {}}, "algorithm: dqn"),
    ({"hyperparameters": {"dueling": True}}, "dueling"),
    ({"network": {"activation": "elu"}}, "network.activation"),
])
def test_configs_the_compiled_step_cannot_serve_are_refused(overrides, names):
    with pytest.raises(ValidationError) as err:
        GymExperimentConfig(env_id="CartPole-v1", compile_learn=True, **overrides)
    assert "compile_learn" in str(err.value) and names in str(err.value)


def test_the_arena_compiles_the_groups_it_trains_when_asked():
    cfg = GymExperimentConfig(env_id="CartPole-v1", compile_learn=True, population_size=2, num_envs=2,
                              network={"hidden_sizes": [16]})
    evo = build_evolution(cfg)
    members = evo.arena.build_members([0, 1])
    assert evo.arena.learning_group(members).compiled == "inductor"
    plain = GymExperimentConfig(env_id="CartPole-v1", population_size=2, num_envs=2, network={"hidden_sizes": [16]})
    assert build_evolution(plain).arena.learning_group(members).compiled is None
