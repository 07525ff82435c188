"""Issue 38 case 8 (training side): a non-finite reward, observation, loss or weight stops the member's training
with a NonFiniteError naming the env or dataset, the member and the step, before anything is committed; a NaN
fitness never wins selection; a member with NaN weights is never saved, committed or registered as the elite."""

from __future__ import annotations

import math
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from agilerl_core.errors import NonFiniteError
from agilerl_core.evolution import finite_max
from agilerl_core.experiment import build_evolution, train_local
from agilerl_core.hpo.tournament import TournamentSelection, elite_index
from agilerl_core.io.run_store import RunStore
from agilerl_core.io.storage import LocalStorage
from tasks.generation import (
    WORKER_RUNS,
    GenerationJob,
    MemberState,
    by_slot,
    commit_generation_task,
    evaluate_group_task,
    fold_generation_task,
    group_label,
    select_and_mutate_task,
    train_group_task,
    train_shipped_group_task,
)
from tests.conftest import tiny_config

ENV_ID = "agilerl_test/NonFinite-v0"


class NonFiniteEnv(gym.Env):
    """A 3-float observation, two actions, reward 1 for action 0. At episode step `nan_reward_at` the reward is
    NaN, at `nan_obs_at` the observation; `poisoned` (class-wide) switches both on or off between generations."""

    observation_space = spaces.Box(-1, 1, (3,), np.float32)
    action_space = spaces.Discrete(2)
    poisoned = True

    def __init__(self, nan_reward_at: int | None = None, nan_obs_at: int | None = None, bad: float = math.nan):
        self.nan_reward_at, self.nan_obs_at, self.bad = nan_reward_at, nan_obs_at, bad

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action):
        self.t += 1
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        reward = float(action == 0)
        if NonFiniteEnv.poisoned and self.t == self.nan_reward_at:
            reward = self.bad
        if NonFiniteEnv.poisoned and self.t == self.nan_obs_at:
            obs[1] = self.bad
        return obs, reward, False, False, {}


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=NonFiniteEnv, max_episode_steps=20)


@pytest.fixture(autouse=True)
def _poisoned():
    NonFiniteEnv.poisoned = True
    yield
    NonFiniteEnv.poisoned = True


def _dqn(**env_kwargs):
    return tiny_config(env_id=ENV_ID, env_kwargs=env_kwargs, population_size=2, num_envs=2, evo_steps=48,
                       max_env_steps=192, **{"hyperparameters.learning_delay": 8, "hyperparameters.batch_size": 32,
                                             "hyperparameters.buffer_size": 500})


def _ppo(**env_kwargs):
    from tasks.config import validate_config

    return validate_config({"name": "nan-ppo", "env_id": ENV_ID, "env_kwargs": env_kwargs, "algorithm": "ppo",
                            "num_envs": 2, "population_size": 2, "evo_steps": 64, "eval_episodes": 1,
                            "max_env_steps": 256, "seed": 0, "hyperparameters": {"rollout_steps": 8},
                            "network": {"hidden_sizes": [16], "min_nodes": 8}})


def _raises_naming(fn, *parts: str) -> NonFiniteError:
    with pytest.raises(NonFiniteError) as info:
        fn()
    for p in parts:
        assert p in str(info.value), (p, str(info.value))
    return info.value


# ---- the attack as written: an env returning NaN, a run that used to end with rc 0 --------------------------
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_nan_reward_stops_the_local_run_before_anything_is_saved(tmp_path, bad):
    cfg = _dqn(nan_reward_at=7, bad=bad)
    err = _raises_naming(lambda: train_local(cfg, progress=False, run_dir=tmp_path / "run"),
                         f"env {ENV_ID}", "member 0 (slot 0) of generation 0", "reward is not finite",
                         "env step 7")
    assert (err.slot, err.member_id, err.step, err.generation) == (0, 0, 7, 0)
    assert not (tmp_path / "run").exists()  # neither elite nor population saved


def test_a_nan_observation_stops_the_run_through_the_api(tmp_path):
    import agilerl_core

    cfg = _dqn(nan_obs_at=5)
    _raises_naming(lambda: agilerl_core.evolve(cfg, progress=False, run_dir=tmp_path / "run"),
                   f"env {ENV_ID}", "member 0 (slot 0)", "observation is not finite", "env step 5")
    assert not (tmp_path / "run").exists()


def test_on_policy_ppo_stops_at_the_nan_reward(tmp_path):
    cfg = _ppo(nan_reward_at=11)
    evo = build_evolution(cfg)
    _raises_naming(lambda: evo.run_generation(), f"env {ENV_ID}", "member 0 (slot 0) of generation 0",
                   "reward is not finite", "env step 11")
    assert evo.history == []  # no fitness recorded, nothing folded


def test_a_member_alone_names_its_own_slot_and_id():
    cfg = _dqn(nan_obs_at=3)
    evo = build_evolution(cfg, batch_members=False)
    evo.population.members[1].member_id = 41
    evo.begin_generation()
    _raises_naming(lambda: evo.train(1), "member 41 (slot 1) of generation 0", "observation", "env step 3")


# ---- nothing committed: the previous generation stays intact and the run resumes -----------------------------
def _generation(evo, store, cfg, g: int) -> None:
    job = GenerationJob("r", cfg, store.storage.uri, g, evo.generation_steps(), "threads")
    if evo.history:
        select_and_mutate_task.fn(job, evo)
    evo.begin_generation()
    groups = evo.groups()
    outs = [train_group_task.fn(job, grp, group_label(grp), evo) for grp in groups]
    fits = [evaluate_group_task.fn(job, grp, group_label(grp), evo) for grp in groups]
    outs, fits = by_slot(groups, outs, fits)
    shards = fold_generation_task.fn(job, evo, store, outs, fits)
    commit_generation_task.fn(job, evo, store, shards)


def test_the_failing_generation_is_not_committed_and_the_run_resumes(tmp_path):
    cfg = _dqn(nan_reward_at=4)
    store = RunStore(LocalStorage(tmp_path), "r")
    NonFiniteEnv.poisoned = False
    evo = build_evolution(cfg)
    _generation(evo, store, cfg, 0)
    assert store.committed_generations() == [0]
    NonFiniteEnv.poisoned = True
    _raises_naming(lambda: _generation(evo, store, cfg, 1), "of generation 1", "reward", "env step 4")
    assert store.committed_generations() == [0]
    NonFiniteEnv.poisoned = False  # the env fixed: the run resumes from its last commit
    resumed = build_evolution(cfg)
    resumed.resume(store, 0)
    _generation(resumed, store, cfg, 1)
    assert store.committed_generations()[-1] == 1
    assert all(math.isfinite(f) for f in resumed.history[-1].fitnesses)


def test_a_worker_process_names_the_flows_member_id(tmp_path):
    cfg = _dqn(nan_reward_at=6)
    evo = build_evolution(cfg)
    job = GenerationJob("w", cfg, str(tmp_path), 0, evo.generation_steps(), "process")
    members = [MemberState(*evo.population.members[s].agent.state(), 100 + s) for s in (0, 1)]
    try:
        err = _raises_naming(lambda: train_shipped_group_task.fn(job, (0, 1), "m0-1", members),
                             "member 100 (slot 0) of generation 0", "reward", "env step 6")
    finally:
        WORKER_RUNS.drop("w")
    again = pickle.loads(pickle.dumps(err))  # travels back from Dask / Ray workers whole
    assert isinstance(again, NonFiniteError) and str(again) == str(err) and again.member_id == 100


# ---- losses: offline learning (a dataset run) and the device-side first-bad-step record -----------------------
class _NaNLossGroup:
    """A stacked group whose member 1 gets a NaN loss from learn step 3 on."""

    k, device = 2, torch.device("cpu")

    def learn_step(self, dataset, slots, active):
        self.n = getattr(self, "n", 0) + 1
        return torch.tensor([0.5, math.nan if self.n >= 3 else 0.5])

    def write_back(self):
        raise AssertionError("members with a NaN loss are not written back")


def test_an_offline_nan_loss_names_the_member_and_learn_step():
    from agilerl_core.loops.offline import train_group_offline

    err = _raises_naming(lambda: train_group_offline(_NaNLossGroup(), [4, 7], None, 6),
                         "slot 7", "the loss is not finite", "learn step 3")
    assert err.step == 3


def test_the_first_bad_step_is_found_across_chunks():
    from agilerl_core.finite import FirstBad

    watch = FirstBad(3, "cpu", chunk=4)
    for step in range(1, 12):
        watch.see(torch.tensor([1.0, math.inf if step >= 10 else 1.0, math.nan if step in (6, 9) else 1.0]), step)
    err = _raises_naming(lambda: watch.check([5, 6, 7], "the loss"), "slot 6", "learn step 10")
    assert err.step == 10  # the first member in slot order; member 7 (first bad at step 6) comes after
    late = FirstBad(2, "cpu", chunk=4)
    for step in range(1, 12):
        late.see(torch.tensor([0.0, math.nan if step in (6, 9) else 1.0]), step)
    assert _raises_naming(lambda: late.check([0, 1], "the loss"), "slot 1", "learn step 6").step == 6
    clean = FirstBad(2, "cpu", chunk=4)
    for step in range(1, 10):
        clean.see(torch.tensor([0.0, 1.0]), step)
    clean.check([0, 1], "the loss")


# ---- selection, elite, champion -----------------------------------------------------------------------------
def test_a_nan_or_infinite_fitness_never_wins_selection():
    fitness = [math.nan, math.inf, 1.0, 2.0, -math.inf]
    assert elite_index(fitness) == 3
    parents = TournamentSelection(size=5, elitism=True).select(fitness, np.random.default_rng(0))
    assert parents == [3] * 5  # every tournament sees everyone: the best finite member wins each
    rng = np.random.default_rng(1)
    drawn = TournamentSelection(size=2, elitism=False).select([math.nan, 0.0], rng)
    assert drawn == [1, 1]
    assert TournamentSelection(2).second_parent([math.nan, 5.0, math.nan], 1, rng) in (0, 2)  # no finite other
    assert finite_max([math.nan, 3.0, math.inf]) == 3.0 and math.isnan(finite_max([math.nan]))


def test_best_fitness_reports_and_the_elite_ignore_nan():
    NonFiniteEnv.poisoned = False
    evo = build_evolution(_dqn())
    stats = evo.finish_generation([], [math.nan, 2.0])
    assert stats.best_fitness == 2.0 and evo.best_fitness() == 2.0 and evo.best_generation() == 0
    assert evo.elite() is evo.population.members[1]


def _poison_weights(member) -> None:
    net = member.agent.networks[member.agent.online_networks[0]]
    with torch.no_grad():
        next(net.parameters()).view(-1)[0] = math.nan


def test_an_elite_with_nan_weights_is_never_saved_committed_or_registered(tmp_path):
    from agilerl_core.champion import choose_champion

    NonFiniteEnv.poisoned = False
    cfg = _dqn()
    evo = build_evolution(cfg)
    evo.run_generation()
    elite = evo.elite()
    _poison_weights(elite)
    slot = evo.population.members.index(elite)
    where = f"member {elite.member_id} (slot {slot})"
    _raises_naming(lambda: evo.save_elite(tmp_path / "elite"), where, "weight", "before saving it as the elite")
    assert not (tmp_path / "elite").exists()
    store = RunStore(LocalStorage(tmp_path / "store"), "r")
    _raises_naming(lambda: evo.commit(store, []), where, "before committing")
    assert store.committed_generations() == []
    _raises_naming(lambda: choose_champion(evo, None, 1), where, "before registering it as the champion")


def test_nan_weights_after_training_stop_the_member(monkeypatch):
    NonFiniteEnv.poisoned = False
    evo = build_evolution(_dqn(), batch_members=False)
    real = evo.arena.train_group

    def train_then_poison(members, slots, seeds, steps):
        out = real(members, slots, seeds, steps)
        if 1 in slots:
            _poison_weights(evo.population.members[1])
        return out

    monkeypatch.setattr(evo.arena, "train_group", train_then_poison)
    evo.begin_generation()
    evo.train(0)
    _raises_naming(lambda: evo.train(1), f"env {ENV_ID}", "member 1 (slot 1) of generation 0", "weight ",
                   "after its training phase")


def test_an_off_policy_nan_loss_is_named_at_its_env_step():
    """Weights gone NaN before the phase (so every loss is NaN): the batched learn steps record the first bad one
    on the device and the phase stops naming it (the env step after which the member first learned)."""
    NonFiniteEnv.poisoned = False
    evo = build_evolution(_dqn())
    _poison_weights(evo.population.members[1])
    err = _raises_naming(lambda: evo.run_generation(), f"env {ENV_ID}", "member 1 (slot 1) of generation 0",
                         "the loss of the learn steps taken is not finite", "env step 16")
    assert err.step_kind == "env step" and evo.history == []
