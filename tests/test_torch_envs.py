"""env_backend: torch: the tensor classic-control envs step as Gymnasium's do (same observations, rewards and
flags from the same states and actions), autoreset in the step that ends an episode, draw their start states
from their own seeds only, and refuse what they cannot do with errors naming the field."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from agilerl_core.envs.make import EnvRecipe, bind_env_factory
from agilerl_core.envs.torch_classic import (
    TORCH_ENV_IDS,
    TorchClassicVector,
    TorchGymnasiumVector,
    check_torch_env,
)
from agilerl_core.envs.vector import real_next_obs
from agilerl_core.errors import ConfigError
from tests.conftest import tiny_config

pytestmark = pytest.mark.filterwarnings("ignore:.*CartPole-v0 is out of date")

# rtol = atol for float32 tensors against Gymnasium's float64 maths run freely through whole episodes (re-synced
# only when an episode ends). One step agrees to ~1e-6, Acrobot's ~1e-4 (test_one_step_matches_gymnasium); through an
# episode the rounding grows where the dynamics are unstable. Measured at this test's seeds (max |diff| / (1 +
# |gymnasium's|)): CartPole 5e-7, the mountain cars 2e-7, Acrobot 2e-5, Pendulum 5e-4; over 100 other sub-env
# runs at most CartPole 2e-4, Acrobot 5e-4, Pendulum 3e-2 (a pendulum held near upright for long).
TOLERANCE = {"Acrobot-v1": 1e-3, "Pendulum-v1": 1e-2}
CASES = [  # (env id, env_kwargs for both Gymnasium and torch)
    ("CartPole-v1", {}),
    ("CartPole-v1", {"sutton_barto_reward": True}),
    ("CartPole-v0", {}),
    ("Acrobot-v1", {}),
    ("Pendulum-v1", {}),
    ("Pendulum-v1", {"g": 9.81}),
    ("MountainCar-v0", {}),
    ("MountainCar-v0", {"goal_velocity": 0.01, "max_episode_steps": 120}),
    ("MountainCarContinuous-v0", {"max_episode_steps": 150}),
]


def _gym_state(env: gym.Env) -> torch.Tensor:
    return torch.as_tensor(np.asarray(env.unwrapped.state, dtype=np.float64), dtype=torch.float32)


def _random_actions(space: gym.Space, rs: np.random.Generator, b: int) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rs.integers(space.n, size=b)
    # beyond the bounds too: Gymnasium clips the force/torque (and MountainCarContinuous charges the raw action)
    return rs.uniform(1.5 * space.low, 1.5 * space.high, size=(b, *space.shape)).astype(np.float32)


def _against_gymnasium(env_id: str, kwargs: dict, device: str, steps: int = 300, b: int = 4) -> None:
    gyms = [gym.make(env_id, **kwargs) for _ in range(b)]
    env = TorchClassicVector(env_id, b, device, kwargs)
    assert env.single_observation_space == gyms[0].observation_space
    assert env.single_action_space == gyms[0].action_space
    assert env.max_episode_steps == kwargs.get("max_episode_steps", gym.spec(env_id).max_episode_steps)
    tol = TOLERANCE.get(env_id, 1e-4)
    env.reset(seed=0)
    for i, g in enumerate(gyms):
        g.reset(seed=100 + i)
    env.set_state(torch.stack([_gym_state(g) for g in gyms]), torch.zeros(b, dtype=torch.int64))
    rs = np.random.default_rng(7)
    ends = 0
    for t in range(steps):
        actions = _random_actions(gyms[0].action_space, rs, b)
        obs, reward, terminated, truncated, final = env.step(torch.as_tensor(actions, device=device))
        obs, reward, final = obs.cpu().numpy(), reward.cpu().numpy(), final.cpu().numpy()
        terminated, truncated = terminated.cpu().numpy(), truncated.cpu().numpy()
        assert obs.dtype == final.dtype == reward.dtype == np.float32
        restarted = []
        for i, g in enumerate(gyms):
            g_obs, g_reward, g_term, g_trunc, _ = g.step(actions[i] if env.discrete else actions[i].copy())
            where = f"{env_id} {kwargs} sub-env {i} step {t}"
            assert (bool(terminated[i]), bool(truncated[i])) == (g_term, g_trunc), where
            np.testing.assert_allclose(final[i], g_obs, rtol=tol, atol=tol, err_msg=where)
            np.testing.assert_allclose(reward[i], g_reward, rtol=tol, atol=tol, err_msg=where)
            if g_term or g_trunc:
                ends += 1
                g.reset()
                restarted.append(i)
            else:
                np.testing.assert_array_equal(obs[i], final[i], err_msg=where)
        if restarted:  # re-sync the new episodes to Gymnasium's start states
            state = env.state()
            for i in restarted:
                state[i] = _gym_state(gyms[i]).to(device)
            env.set_state(state)
    if env_id != "Acrobot-v1":  # a random Acrobot seldom swings up within 300 steps
        assert ends > 0, f"{env_id}: no episode ended, the episode ends went untested"


@pytest.mark.parametrize("env_id, kwargs", CASES, ids=[f"{e}{'-' + '-'.join(k) if k else ''}" for e, k in CASES])
def test_trajectories_match_gymnasium(env_id, kwargs):
    _against_gymnasium(env_id, kwargs, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("env_id", TORCH_ENV_IDS)
def test_trajectories_match_gymnasium_on_cuda(env_id):
    _against_gymnasium(env_id, {}, "cuda")


STATE_BOXES = {  # where one-step states are drawn from: each state variable's (low, high)
    "CartPole-v1": [(-2.4, 2.4), (-3.0, 3.0), (-0.21, 0.21), (-3.0, 3.0)],
    "Acrobot-v1": [(-math.pi, math.pi), (-math.pi, math.pi), (-4 * math.pi, 4 * math.pi), (-9 * math.pi, 9 * math.pi)],
    "Pendulum-v1": [(-3 * math.pi, 3 * math.pi), (-8.0, 8.0)],
    "MountainCar-v0": [(-1.2, 0.6), (-0.07, 0.07)],
    "MountainCarContinuous-v0": [(-1.2, 0.6), (-0.07, 0.07)],
}


@pytest.mark.parametrize("env_id", list(STATE_BOXES))
def test_one_step_matches_gymnasium(env_id):
    """From states all over the state space (the same float32 values in both), one step agrees to float32
    rounding: the equations themselves, apart from how chaotic dynamics amplify rounding over an episode.
    Acrobot's accelerations reach hundreds at full speed (float32 rounding ~1e-4 in the next velocities; measured
    at most 8e-5 over 6000 states), the others' one-step rounding stays below 1e-6."""
    tol = 5e-4 if env_id == "Acrobot-v1" else 1e-5
    b = 256
    rs = np.random.default_rng(3)
    states = np.stack([rs.uniform(lo, hi, size=b) for lo, hi in STATE_BOXES[env_id]], -1).astype(np.float32)
    env = TorchClassicVector(env_id, b)
    env.reset(seed=0)
    env.set_state(torch.as_tensor(states))
    actions = _random_actions(env.single_action_space, rs, b)
    _, reward, terminated, _, final = env.step(torch.as_tensor(actions))
    g = gym.make(env_id).unwrapped
    for i in range(b):
        g.reset(seed=i)
        g.state = states[i].astype(np.float64)
        g_obs, g_reward, g_term, _, _ = g.step(int(actions[i]) if env.discrete else actions[i].copy())
        where = f"{env_id} state {states[i]} action {actions[i]}"
        np.testing.assert_allclose(final[i].numpy(), g_obs, rtol=tol, atol=tol, err_msg=where)
        np.testing.assert_allclose(reward[i].item(), g_reward, rtol=tol, atol=tol, err_msg=where)
        assert bool(terminated[i]) == g_term, where
    assert terminated.any() or env_id == "Pendulum-v1"  # the terminal conditions were met somewhere


def test_every_supported_id_is_registered_with_its_time_limit():
    assert set(TORCH_ENV_IDS) == {"CartPole-v1", "CartPole-v0", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0",
                                  "MountainCarContinuous-v0"}
    limits = {i: TorchClassicVector(i, 1).max_episode_steps for i in TORCH_ENV_IDS}
    assert limits == {"CartPole-v1": 500, "CartPole-v0": 200, "Acrobot-v1": 500, "Pendulum-v1": 200,
                      "MountainCar-v0": 200, "MountainCarContinuous-v0": 999}
    env = TorchClassicVector("Acrobot-v1", 5)
    assert env.observation_space == gym.vector.utils.batch_space(env.single_observation_space, 5)
    assert env.action_space == gym.spaces.MultiDiscrete([3] * 5) and env.discrete
    assert env.reset(seed=0).shape == (5, 6) and env.state().shape == (5, 4)


# ---- same-step autoreset ----------------------------------------------------------------------------------------
def _oracle(env_id: str, state: torch.Tensor, action, **kwargs) -> np.ndarray:
    """Gymnasium's next observation from `state` under `action` (no time limit, no reset)."""
    g = gym.make(env_id, **kwargs).unwrapped
    g.reset(seed=0)
    g.state = state.double().numpy()
    return g.step(action)[0]


def test_truncation_restarts_the_episode_in_the_same_step():
    env = TorchClassicVector("Pendulum-v1", 3, env_kwargs={"max_episode_steps": 7})
    env.reset(seed=3)
    env.set_state(env.state(), elapsed=torch.tensor([0, 3, 6]))  # staggered: truncated after 7, 4 and 1 steps
    actions = torch.full((3, 1), 0.5)
    seen = {0: [], 1: [], 2: []}
    for t in range(1, 22):
        before = env.state()
        obs, reward, terminated, truncated, final = env.step(actions)
        assert not terminated.any() and (reward <= 0).all()
        for i in range(3):
            if truncated[i]:
                seen[i].append(t)
                np.testing.assert_allclose(final[i].numpy(), _oracle("Pendulum-v1", before[i], np.array([0.5])),
                                           rtol=1e-5, atol=1e-5)
                th, thdot = env.state()[i].tolist()
                assert -math.pi <= th < math.pi and -1.0 <= thdot < 1.0  # a fresh start state
                assert obs[i].tolist() == pytest.approx([math.cos(th), math.sin(th), thdot], abs=1e-6)
                assert env.elapsed[i] == 0
            else:
                assert torch.equal(obs[i], final[i])
    assert seen == {0: [7, 14, 21], 1: [4, 11, 18], 2: [1, 8, 15]}


def test_termination_restarts_the_episode_in_the_same_step():
    env = TorchClassicVector("CartPole-v1", 2)
    env.reset(seed=0)
    tipping = torch.tensor([[0.1, 0.0, 0.2, 0.5], [0.0, 0.0, 0.0, 0.0]])  # sub-env 0 falls past 12 degrees now
    env.set_state(tipping, elapsed=torch.tensor([41, 41]))
    obs, reward, terminated, truncated, final = env.step(torch.tensor([1, 1]))
    assert terminated.tolist() == [True, False] and truncated.tolist() == [False, False]
    assert reward.tolist() == [1.0, 1.0]  # CartPole pays the terminating step too
    np.testing.assert_allclose(final[0].numpy(), _oracle("CartPole-v1", tipping[0], 1), rtol=1e-5, atol=1e-6)
    assert final[0, 2] > 12 * 2 * math.pi / 360
    assert obs[0].abs().max() < 0.05 and torch.equal(env.state()[0], obs[0])  # the new episode's start
    assert torch.equal(obs[1], final[1]) and env.elapsed.tolist() == [0, 42]

    sb = TorchClassicVector("CartPole-v1", 2, env_kwargs={"sutton_barto_reward": True})
    sb.reset(seed=0)
    sb.set_state(tipping)
    assert sb.step(torch.tensor([1, 1]))[1].tolist() == [-1.0, 0.0]


def test_mountain_car_stops_at_the_left_wall_and_ends_at_the_goal():
    env = TorchClassicVector("MountainCar-v0", 3)
    env.reset(seed=0)
    state = torch.tensor([[-1.19, -0.05], [0.49, 0.03], [-0.5, 0.0]])
    env.set_state(state)
    obs, reward, terminated, truncated, final = env.step(torch.tensor([0, 2, 1]))
    for i, a in enumerate([0, 2, 1]):
        np.testing.assert_allclose(final[i].numpy(), _oracle("MountainCar-v0", state[i], a), rtol=1e-5, atol=1e-7)
    assert final[0].tolist() == pytest.approx([-1.2, 0.0]) and final[0, 1] == 0  # stopped dead at the wall
    assert terminated.tolist() == [False, True, False] and not truncated.any() and reward.tolist() == [-1.0] * 3
    assert -0.6 <= obs[1, 0] < -0.4 and obs[1, 1] == 0  # the next episode's start

    cont = TorchClassicVector("MountainCarContinuous-v0", 2)
    cont.reset(seed=0)
    cont.set_state(torch.tensor([[0.44, 0.03], [-0.5, 0.0]]))
    _, reward, terminated, _, final = cont.step(torch.tensor([[3.0], [-0.5]]))  # force clipped, reward raw
    assert terminated.tolist() == [True, False]
    assert reward.tolist() == pytest.approx([100.0 - 0.1 * 9.0, -0.1 * 0.25])
    np.testing.assert_allclose(final[0].numpy(), _oracle("MountainCarContinuous-v0", torch.tensor([0.44, 0.03]),
                                                         np.array([3.0], np.float32)), rtol=1e-5, atol=1e-7)


def test_start_states_lie_in_gymnasiums_reset_ranges():
    ranges = {"CartPole-v1": [(-0.05, 0.05)] * 4, "Acrobot-v1": [(-0.1, 0.1)] * 4,
              "Pendulum-v1": [(-math.pi, math.pi), (-1.0, 1.0)], "MountainCar-v0": [(-0.6, -0.4), (0.0, 0.0)]}
    for env_id, bounds in ranges.items():
        env = TorchClassicVector(env_id, 2000)
        env.reset(seed=11)
        s = env.state()
        for j, (lo, hi) in enumerate(bounds):
            assert lo <= s[:, j].min() and s[:, j].max() <= hi, (env_id, j)
            if hi > lo:  # spread over the whole range
                assert s[:, j].min() < lo + 0.02 * (hi - lo) and s[:, j].max() > hi - 0.02 * (hi - lo), (env_id, j)


# ---- seeding ----------------------------------------------------------------------------------------------------
def _rollout(env: TorchClassicVector, seed, actions: torch.Tensor) -> list[torch.Tensor]:
    out = [env.reset(seed)]
    for a in actions:
        obs, reward, terminated, truncated, final = env.step(a)
        out += [obs, reward, terminated, truncated, final]
    return out


def test_same_seeds_same_episodes_and_each_sub_env_depends_on_its_own_seed_only():
    g = torch.Generator().manual_seed(0)
    actions = torch.randint(0, 2, (150, 8), generator=g)  # ~7 CartPole episodes per sub-env
    a = _rollout(TorchClassicVector("CartPole-v1", 8), 100, actions)
    b = _rollout(TorchClassicVector("CartPole-v1", 8), torch.arange(100, 108), actions)  # int seed: seed + i
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert int(sum(x.sum() for x in a[3::5])) > 8 * 3  # several autoresets happened
    for i in (0, 5):  # alone in a vector of 1: the same episodes
        alone = _rollout(TorchClassicVector("CartPole-v1", 1), [100 + i], actions[:, i:i + 1])
        assert all(torch.equal(x[i:i + 1], y) for x, y in zip(a, alone, strict=True))
    other = _rollout(TorchClassicVector("CartPole-v1", 8), 200, actions)
    assert not torch.equal(a[0], other[0])
    assert (a[0][:, None, :] != a[0][None, :, :]).any(-1).sum() == 8 * 7  # sub-envs start apart


def test_reset_without_a_seed_goes_on_from_the_episode_counters():
    one, two = TorchClassicVector("Acrobot-v1", 4), TorchClassicVector("Acrobot-v1", 4)
    first = one.reset(5)
    assert torch.equal(two.reset(5), first)
    again = one.reset(None)
    assert torch.equal(two.reset(None), again) and not torch.equal(again, first)
    assert torch.equal(one.reset(5), first)
    fresh = TorchClassicVector("Acrobot-v1", 4).reset(None)  # never seeded: fresh entropy, in range
    assert fresh.shape == (4, 6)
    with pytest.raises(RuntimeError, match="call reset"):
        TorchClassicVector("Acrobot-v1", 4).step(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="expected 4 seeds"):
        one.reset([1, 2, 3])


# ---- return distributions of a random policy ---------------------------------------------------------------------
def _torch_first_returns(env_id: str, n: int, actions_of) -> np.ndarray:
    env = TorchClassicVector(env_id, n)
    env.reset(seed=1234)
    g = torch.Generator().manual_seed(1)
    returns = torch.zeros(n)
    active = torch.ones(n, dtype=torch.bool)
    for _ in range(env.max_episode_steps):
        _, reward, terminated, truncated, _ = env.step(actions_of(g, n))
        returns += reward * active
        active &= ~(terminated | truncated)
        if not active.any():
            break
    assert not active.any()
    return returns.numpy().astype(np.float64)


def _gym_returns(env_id: str, n: int) -> np.ndarray:
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(n)])
    envs.reset(seed=4321)
    envs.action_space.seed(4321)
    returns, active = np.zeros(n), np.ones(n, dtype=bool)
    while active.any():
        _, reward, terminated, truncated, _ = envs.step(envs.action_space.sample())
        returns += reward * active
        active &= ~(terminated | truncated)
    envs.close()
    return returns


@pytest.mark.parametrize("env_id, n", [("CartPole-v1", 300), ("Pendulum-v1", 100)])
def test_random_policy_returns_match_gymnasiums(env_id, n):
    if env_id == "CartPole-v1":
        def actions_of(g, b):
            return torch.randint(0, 2, (b,), generator=g)
    else:
        def actions_of(g, b):
            return torch.rand((b, 1), generator=g) * 4.0 - 2.0
    ours, theirs = _torch_first_returns(env_id, n, actions_of), _gym_returns(env_id, n)
    se = math.sqrt(ours.var(ddof=1) / n + theirs.var(ddof=1) / n)
    assert abs(ours.mean() - theirs.mean()) < 4 * se, (ours.mean(), theirs.mean(), se)
    assert 0.7 < ours.std() / theirs.std() < 1.4


def test_random_mountain_car_never_reaches_the_goal():
    returns = _torch_first_returns("MountainCar-v0", 64, lambda g, b: torch.randint(0, 3, (b,), generator=g))
    assert (returns == -200.0).all()


# ---- bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id, kwargs, pattern", [
    ("CartPol-v1", None, r"^env_id: 'CartPol-v1' is not an env of env_backend: torch\. Did you mean 'CartPole-v1'"),
    ("LunarLander-v3", None, r"^env_id: 'LunarLander-v3' .*CartPole-v1, CartPole-v0, Acrobot-v1, Pendulum-v1, "
                             r"MountainCar-v0, MountainCarContinuous-v0; use env_backend: gymnasium"),
    ("Pendulum-v1", {"gravity": 9.8}, r"^env_kwargs\.gravity: not an option of Pendulum-v1 .*; it accepts g, "
                                      r"max_episode_steps$"),
    ("CartPole-v1", {"sutton_barto": True}, r"^env_kwargs\.sutton_barto: .*did you mean 'sutton_barto_reward'"),
    ("Acrobot-v1", {"render_mode": "rgb_array"}, r"^env_kwargs\.render_mode: env_backend: torch does not render"),
    ("CartPole-v1", {"sutton_barto_reward": "yes"}, r"^env_kwargs\.sutton_barto_reward: expected true or false"),
    ("MountainCar-v0", {"goal_velocity": "fast"}, r"^env_kwargs\.goal_velocity: expected a finite number"),
    ("MountainCar-v0", {"max_episode_steps": 0}, r"^env_kwargs\.max_episode_steps: expected a whole number"),
])
def test_bad_ids_and_kwargs_are_named(env_id, kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        check_torch_env(env_id, kwargs)
    with pytest.raises(ConfigError, match=pattern):
        TorchClassicVector(env_id, 2, env_kwargs=kwargs)


def test_config_and_recipe_take_the_torch_backend():
    cfg = tiny_config(env_backend="torch", env_kwargs={"max_episode_steps": 50})
    cfg.check_env()
    recipe = EnvRecipe.of(cfg)
    obs_space, act_space = recipe.spaces()
    assert obs_space == gym.make("CartPole-v1").observation_space and act_space == gym.spaces.Discrete(2)
    assert isinstance(recipe.vector(3), TorchGymnasiumVector)
    vec = recipe.torch_vector(5, "cpu")
    assert isinstance(vec, TorchClassicVector) and vec.num_envs == 5 and vec.max_episode_steps == 50
    with pytest.raises(ValueError, match="torch_vector: env_backend is gymnasium"):
        EnvRecipe("CartPole-v1").torch_vector(2, "cpu")
    with pytest.raises(ConfigError, match=r"^env_kwargs\.gravity"):
        tiny_config(env_backend="torch", env_kwargs={"gravity": 1.0}).check_env()
    with pytest.raises(ConfigError, match=r"^env_backend: torch steps its own classic-control envs by id"):
        EnvRecipe(bind_env_factory(lambda: gym.make("CartPole-v1")), backend="torch").check()


@pytest.mark.parametrize("overrides, pattern", [
    ({"env_wrappers": [{"wrapper": "gymnasium.wrappers.FlattenObservation"}]},
     r"env_wrappers: the torch backend .*env_backend: gymnasium"),
    ({"vector_wrappers": [{"wrapper": "gymnasium.wrappers.vector.NormalizeReward"}]},
     r"vector_wrappers: the torch backend .*env_backend: gymnasium"),
    ({"env_entry_point": "tests.conftest:ImageEnv"}, r"env_entry_point: the torch backend"),
    ({"env_id": "LunarLander-v3"}, r"env_id: 'LunarLander-v3' is not an env of env_backend: torch, which steps "
                                   r"CartPole-v1, .*MountainCarContinuous-v0"),
    ({"kind": "multi_agent", "env_id": "tests.ma_envs:cue_team", "algorithm": "matd3"}, r"env_backend: multi-agent"),
])
def test_config_refuses_what_the_torch_backend_cannot_do(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        tiny_config(env_backend="torch", **overrides)


# ---- the numpy adapter --------------------------------------------------------------------------------------------
def test_numpy_adapter_presents_gymnasiums_vector_api():
    env = TorchClassicVector("Pendulum-v1", 4, env_kwargs={"max_episode_steps": 3}).as_gymnasium()
    assert env.num_envs == 4 and env.metadata == {"autoreset_mode": "SameStep"}
    assert env.single_action_space == gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    assert env.action_space.shape == (4, 1) and env.observation_space.shape == (4, 3)
    obs, info = env.reset(seed=9)
    assert obs.dtype == np.float32 and obs.shape == (4, 3) and info == {}
    env.env.set_state(env.env.state(), elapsed=torch.tensor([0, 0, 0, 2]))
    obs, reward, terminated, truncated, info = env.step(np.zeros((4, 1), np.float32))
    assert obs.dtype == np.float32 and reward.dtype == np.float64 and reward.shape == (4,)
    assert terminated.dtype == truncated.dtype == np.bool_
    assert truncated.tolist() == [False, False, False, True] and not terminated.any()
    assert info["_final_obs"].tolist() == [False, False, False, True]
    final = info["final_obs"]
    assert final.dtype == object and final[:3].tolist() == [None] * 3
    assert final[3].dtype == np.float32 and final[3].shape == (3,) and not np.array_equal(final[3], obs[3])
    real = real_next_obs(obs, info, terminated | truncated)
    assert np.array_equal(real[3], final[3]) and np.array_equal(real[:3], obs[:3])
    obs, _, _, _, info = env.step(np.zeros((4, 1), np.float32))
    assert info == {}  # no episode ended
    again, _ = env.reset(seed=9)
    first, _ = TorchClassicVector("Pendulum-v1", 4).as_gymnasium().reset(seed=9)
    assert np.array_equal(again, first)
    assert not np.array_equal(env.reset()[0], first)  # no seed: the next episodes
    discrete = TorchClassicVector("CartPole-v1", 2).as_gymnasium()
    discrete.reset(seed=0)
    out = discrete.step(np.array([0, 1]))
    assert out[0].shape == (2, 4) and out[1].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="options"):
        discrete.reset(seed=0, options={"low": -0.1})
    discrete.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_compiled_step_is_one_graph_that_steps_as_the_eager_one(env_id):
    import torch._dynamo

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    eager = TorchClassicVector(env_id, 6)
    # aot_eager traces and partitions the graph as Inductor gets it (fullgraph: any break fails), without the
    # minutes of C++ codegen a CI machine would spend; the Inductor speed is benchmarks/population_scaling.py's
    compiled = [TorchClassicVector(env_id, 6, compile="aot_eager") for _ in range(2)]
    for e in (eager, *compiled):
        e.reset(seed=4)
    for t in range(40):
        a = eager.action_space.sample() if t % 3 else np.zeros_like(eager.action_space.sample())
        want = eager.step(torch.as_tensor(a))
        for e in compiled:
            for x, y in zip(want, e.step(torch.as_tensor(a)), strict=True):
                torch.testing.assert_close(x, y)
    assert counters["stats"]["unique_graphs"] == 1  # one graph for every env of this kind and shape
    with pytest.raises(ConfigError, match="compile_envs: compiles the on-device envs of env_backend: torch"):
        tiny_config(compile_envs=True)
    assert EnvRecipe.of(tiny_config(env_backend="torch", compile_envs=True)).torch_vector(2, "cpu").compiled
