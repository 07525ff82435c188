"""Gymnasium's classic-control envs as batched torch tensors: ``env_backend: torch``.

:class:`TorchClassicVector` steps B copies of CartPole-v1 / CartPole-v0 (Barto, Sutton and Anderson, "Neuronlike
adaptive elements that can solve difficult learning control problems", 1983), Acrobot-v1 (Sutton, "Generalization
in reinforcement learning: successful examples using sparse coarse coding", 1996; the "book" dynamics, integrated
with one classical Runge-Kutta step of 0.2 s), Pendulum-v1, MountainCar-v0 (Moore, "Efficient memory-based
learning for robot control", 1990) and MountainCarContinuous-v0 as elementwise ops on one device. The equations,
constants, spaces, termination conditions and rewards are those of ``gymnasium.envs.classic_control`` (reference:
Gymnasium 1.x), the time limit is the registry's ``max_episode_steps`` (reported as truncation, as Gymnasium's
TimeLimit does), and a finished sub-env restarts within the step that ended it (Gymnasium's same-step autoreset):
the step returns the new episode's first observation and, in ``final_obs``, the true last one.

The state is float32 (Gymnasium integrates in float64), so trajectories agree with Gymnasium's to float32
rounding, amplified only where the dynamics are chaotic (Acrobot). Nothing inside ``reset``/``step`` reads a
value back to the host: every branch is a ``torch.where``.

Start states come from the counter-based generator of :mod:`agilerl_core.rng`: sub-env i's key is
``mix(seed_i)`` and its n-th episode starts from ``uniform(key_i, n)`` scaled to Gymnasium's reset ranges, so a
sub-env's episodes depend on its own seed only (not on its neighbours, the vector's size or the device). They are
not Gymnasium's numpy draws.

:class:`TorchGymnasiumVector` presents a TorchClassicVector through the numpy Gymnasium VectorEnv API the training
loops use (as :class:`~agilerl_core.envs.envpool_backend.EnvpoolVector` does for envpool).
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from agilerl_core import rng
from agilerl_core.errors import ConfigError

TORCH_ENV_IDS: tuple[str, ...] = ("CartPole-v1", "CartPole-v0", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0",
                                  "MountainCarContinuous-v0")

Tensor = torch.Tensor


# ---- env_kwargs -----------------------------------------------------------------------------------------------
def _as_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise ConfigError(f"env_kwargs.{name}: expected true or false, got {value!r}")
    return bool(value)


def _as_real(name: str, value: Any) -> float:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating) \
            or not math.isfinite(float(value)):
        raise ConfigError(f"env_kwargs.{name}: expected a finite number, got {value!r}")
    return float(value)


def _as_steps(name: str, value: Any) -> int:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise ConfigError(f"env_kwargs.{name}: expected a whole number of steps >= 1, got {value!r}")
    return int(value)


_KWARGS: dict[str, dict[str, Callable[[str, Any], Any]]] = {  # per env family: the options that change dynamics
    "CartPole": {"sutton_barto_reward": _as_bool},
    "Acrobot": {},
    "Pendulum": {"g": _as_real},
    "MountainCar": {"goal_velocity": _as_real},
    "MountainCarContinuous": {"goal_velocity": _as_real},
}


def _family(env_id: str) -> str:
    return env_id.partition("-")[0]


def _parse(env_id: str, env_kwargs: dict[str, Any] | None) -> tuple[dict[str, Any], int]:
    """(dynamics options, time limit) of `env_id` with `env_kwargs`; a ConfigError naming the bad field."""
    if env_id not in TORCH_ENV_IDS:
        close = difflib.get_close_matches(str(env_id), TORCH_ENV_IDS, n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"env_id: {env_id!r} is not an env of env_backend: torch.{hint} It steps "
                          f"{', '.join(TORCH_ENV_IDS)}; use env_backend: gymnasium for any other env")
    if env_kwargs is not None and not isinstance(env_kwargs, dict):
        raise ConfigError(f"env_kwargs: expected a mapping of options, got {type(env_kwargs).__name__}")
    checks = {**_KWARGS[_family(env_id)], "max_episode_steps": _as_steps}
    options: dict[str, Any] = {}
    steps = gym.spec(env_id).max_episode_steps
    for name, value in (env_kwargs or {}).items():
        if name == "render_mode":
            raise ConfigError("env_kwargs.render_mode: env_backend: torch does not render; remove render_mode or "
                              "use env_backend: gymnasium")
        if name not in checks:
            close = difflib.get_close_matches(str(name), list(checks), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"env_kwargs.{name}: not an option of {env_id} with env_backend: torch{hint}; it "
                              f"accepts {', '.join(checks)}")
        if name == "max_episode_steps":
            steps = _as_steps(name, value)
        else:
            options[name] = checks[name](name, value)
    return options, int(steps)


def check_torch_env(env_id: str, env_kwargs: dict[str, Any] | None) -> None:
    """A ConfigError naming ``env_id`` (with the supported ids and close matches) or ``env_kwargs.<name>`` (with
    the accepted options) when env_backend: torch cannot step `env_id` with `env_kwargs`."""
    _parse(env_id, env_kwargs)


# ---- dynamics ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Dynamics:
    """One env family's maths on batched float32 tensors: start states from uniforms, one step, observations."""

    state_dim: int
    obs_dim: int
    draws: int  # uniforms per start state
    observation_space: spaces.Box
    action_space: spaces.Space
    start: Callable[[Tensor], Tensor]  # [B, draws] uniforms in [0, 1) -> [B, state_dim]
    step: Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]  # (state, action) -> (state, reward, terminated)
    obs: Callable[[Tensor], Tensor]  # [B, state_dim] -> [B, obs_dim]


def _scaled(u: Tensor, low: float, high: float) -> Tensor:
    return low + (high - low) * u


def _cartpole(sutton_barto_reward: bool = False) -> _Dynamics:
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass = masspole + masscart
    polemass_length = masspole * length
    theta_threshold, x_threshold = 12 * 2 * math.pi / 360, 2.4
    high = np.array([x_threshold * 2, np.inf, theta_threshold * 2, np.inf], dtype=np.float32)

    def step(s: Tensor, a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x, x_dot, theta, theta_dot = s.unbind(-1)
        force = torch.where(a == 1, force_mag, -force_mag).to(s.dtype)
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        temp = (force + polemass_length * theta_dot.square() * sintheta) / total_mass
        thetaacc = (gravity * sintheta - costheta * temp) / (
            length * (4.0 / 3.0 - masspole * costheta.square() / total_mass))
        xacc = temp - polemass_length * thetaacc * costheta / total_mass
        x = x + tau * x_dot  # explicit Euler, Gymnasium's default integrator
        x_dot = x_dot + tau * xacc
        theta = theta + tau * theta_dot
        theta_dot = theta_dot + tau * thetaacc
        terminated = (x < -x_threshold) | (x > x_threshold) | (theta < -theta_threshold) | (theta > theta_threshold)
        if sutton_barto_reward:  # 0 per step, -1 on the terminating one
            reward = -terminated.to(s.dtype)
        else:  # 1 per step, the terminating one included
            reward = torch.ones_like(x)
        return torch.stack((x, x_dot, theta, theta_dot), -1), reward, terminated

    return _Dynamics(4, 4, 4, spaces.Box(-high, high, dtype=np.float32), spaces.Discrete(2),
                     lambda u: _scaled(u, -0.05, 0.05), step, lambda s: s)


def _wrap(x: Tensor, m: float, big: float) -> Tensor:
    """Gymnasium's acrobot ``wrap``: add or subtract whole periods until x lies in [m, big] (above: (m, big],
    below: [m, big)), in closed form."""
    period = big - m
    return torch.where(x > big, big - torch.remainder(big - x, period),
                       torch.where(x < m, m + torch.remainder(x - m, period), x))


def _acrobot() -> _Dynamics:
    dt = 0.2
    l1, m1, m2, lc1, lc2, moi1, moi2, g = 1.0, 1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 9.8
    max_vel_1, max_vel_2 = 4 * math.pi, 9 * math.pi
    high = np.array([1.0, 1.0, 1.0, 1.0, max_vel_1, max_vel_2], dtype=np.float32)

    def dsdt(s: Tensor, torque: Tensor) -> Tensor:
        theta1, theta2, dtheta1, dtheta2 = s.unbind(-1)
        cos2, sin2 = torch.cos(theta2), torch.sin(theta2)
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos2) + moi1 + moi2
        d2 = m2 * (lc2**2 + l1 * lc2 * cos2) + moi2
        phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - math.pi / 2.0)
        phi1 = (-m2 * l1 * lc2 * dtheta2.square() * sin2 - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin2
                + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - math.pi / 2) + phi2)
        ddtheta2 = (torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1.square() * sin2 - phi2) / (
            m2 * lc2**2 + moi2 - d2.square() / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2), -1)

    def step(s: Tensor, a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        torque = (a - 1).to(s.dtype)  # AVAIL_TORQUE = [-1, 0, +1]
        k1 = dsdt(s, torque)
        k2 = dsdt(s + (dt / 2) * k1, torque)
        k3 = dsdt(s + (dt / 2) * k2, torque)
        k4 = dsdt(s + dt * k3, torque)
        ns = s + (dt / 6.0) * (k1 + 2 * k2 + 2 * k3 + k4)
        t1, t2, v1, v2 = ns.unbind(-1)
        ns = torch.stack((_wrap(t1, -math.pi, math.pi), _wrap(t2, -math.pi, math.pi),
                          v1.clamp(-max_vel_1, max_vel_1), v2.clamp(-max_vel_2, max_vel_2)), -1)
        t1, t2 = ns[:, 0], ns[:, 1]
        terminated = -torch.cos(t1) - torch.cos(t2 + t1) > 1.0
        reward = torch.where(terminated, 0.0, -1.0).to(s.dtype)
        return ns, reward, terminated

    def obs(s: Tensor) -> Tensor:
        t1, t2, v1, v2 = s.unbind(-1)
        return torch.stack((torch.cos(t1), torch.sin(t1), torch.cos(t2), torch.sin(t2), v1, v2), -1)

    return _Dynamics(4, 6, 4, spaces.Box(-high, high, dtype=np.float32), spaces.Discrete(3),
                     lambda u: _scaled(u, -0.1, 0.1), step, obs)


def _angle_normalize(x: Tensor) -> Tensor:
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


def _pendulum(g: float = 10.0) -> _Dynamics:
    max_speed, max_torque, dt, m, length = 8.0, 2.0, 0.05, 1.0, 1.0
    high = np.array([1.0, 1.0, max_speed], dtype=np.float32)

    def start(u: Tensor) -> Tensor:
        return torch.stack((_scaled(u[:, 0], -math.pi, math.pi), _scaled(u[:, 1], -1.0, 1.0)), -1)

    def step(s: Tensor, a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        th, thdot = s.unbind(-1)
        u = a[:, 0].clamp(-max_torque, max_torque)
        costs = _angle_normalize(th).square() + 0.1 * thdot.square() + 0.001 * u.square()
        newthdot = thdot + (3 * g / (2 * length) * torch.sin(th) + 3.0 / (m * length**2) * u) * dt
        newthdot = newthdot.clamp(-max_speed, max_speed)
        newth = th + newthdot * dt
        return torch.stack((newth, newthdot), -1), -costs, torch.zeros_like(th, dtype=torch.bool)

    def obs(s: Tensor) -> Tensor:
        th, thdot = s.unbind(-1)
        return torch.stack((torch.cos(th), torch.sin(th), thdot), -1)

    return _Dynamics(2, 3, 2, spaces.Box(-high, high, dtype=np.float32),
                     spaces.Box(-max_torque, max_torque, shape=(1,), dtype=np.float32), start, step, obs)


_MIN_POSITION, _MAX_POSITION, _MAX_SPEED = -1.2, 0.6, 0.07


def _car_start(u: Tensor) -> Tensor:
    return torch.stack((_scaled(u[:, 0], -0.6, -0.4), torch.zeros_like(u[:, 0])), -1)


def _car_move(position: Tensor, velocity: Tensor) -> tuple[Tensor, Tensor]:
    """The shared second half of both mountain cars' steps: clip the speed, move, clip at the walls, and stop
    at the left wall."""
    velocity = velocity.clamp(-_MAX_SPEED, _MAX_SPEED)
    position = (position + velocity).clamp(_MIN_POSITION, _MAX_POSITION)
    at_wall = (position <= _MIN_POSITION) & (velocity < 0)  # after the clip: position == min_position
    return position, torch.where(at_wall, torch.zeros_like(velocity), velocity)


def _car_space() -> spaces.Box:
    return spaces.Box(np.array([_MIN_POSITION, -_MAX_SPEED], dtype=np.float32),
                      np.array([_MAX_POSITION, _MAX_SPEED], dtype=np.float32), dtype=np.float32)


def _mountain_car(goal_velocity: float = 0.0) -> _Dynamics:
    force, gravity, goal_position = 0.001, 0.0025, 0.5

    def step(s: Tensor, a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        position, velocity = s.unbind(-1)
        velocity = velocity + (a - 1).to(s.dtype) * force + torch.cos(3 * position) * (-gravity)
        position, velocity = _car_move(position, velocity)
        terminated = (position >= goal_position) & (velocity >= goal_velocity)
        return torch.stack((position, velocity), -1), torch.full_like(position, -1.0), terminated

    return _Dynamics(2, 2, 1, _car_space(), spaces.Discrete(3), _car_start, step, lambda s: s)


def _mountain_car_continuous(goal_velocity: float = 0.0) -> _Dynamics:
    power, goal_position = 0.0015, 0.45

    def step(s: Tensor, a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        position, velocity = s.unbind(-1)
        raw = a[:, 0]
        velocity = velocity + raw.clamp(-1.0, 1.0) * power - 0.0025 * torch.cos(3 * position)
        position, velocity = _car_move(position, velocity)
        terminated = (position >= goal_position) & (velocity >= goal_velocity)
        # Gymnasium's reward: +100 on reaching the goal, minus 0.1 * action^2 of the action as given (unclipped)
        reward = torch.where(terminated, 100.0, 0.0).to(s.dtype) - 0.1 * raw.square()
        return torch.stack((position, velocity), -1), reward, terminated

    return _Dynamics(2, 2, 1, _car_space(), spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32), _car_start, step,
                     lambda s: s)


_BUILDERS: dict[str, Callable[..., _Dynamics]] = {
    "CartPole": _cartpole, "Acrobot": _acrobot, "Pendulum": _pendulum, "MountainCar": _mountain_car,
    "MountainCarContinuous": _mountain_car_continuous,
}


@functools.cache
def _dynamics(family: str, options: tuple[tuple[str, Any], ...]) -> _Dynamics:
    """One family's maths for its options, built once per process (a compiled step then compiles once for all
    the envs of that kind, not once per vector env)."""
    return _BUILDERS[family](**dict(options))


# ---- the vector env ---------------------------------------------------------------------------------------------
class TorchClassicVector:
    """`num_envs` copies of classic-control env `env_id` (one of :data:`TORCH_ENV_IDS`) as tensors on `device`,
    with Gymnasium's dynamics, its registry's time limit (or ``env_kwargs["max_episode_steps"]``) and same-step
    autoreset. ``elapsed`` [B] int64 counts the steps of each sub-env's current episode."""

    is_vector_env = True

    def __init__(self, env_id: str, num_envs: int, device: torch.device | str = "cpu",
                 env_kwargs: dict[str, Any] | None = None, compile: bool | str = False) -> None:
        options, self.max_episode_steps = _parse(env_id, env_kwargs)
        if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer) or num_envs < 1:
            raise ValueError(f"num_envs: expected a whole number >= 1, got {num_envs!r}")
        self.env_id, self.num_envs, self.device = env_id, int(num_envs), torch.device(device)
        self.env_kwargs = dict(env_kwargs or {})
        self._dyn = _dynamics(_family(env_id), tuple(sorted(options.items())))
        self.single_observation_space = self._dyn.observation_space
        self.single_action_space = self._dyn.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.discrete = isinstance(self.single_action_space, spaces.Discrete)
        self._action_dim = 1 if self.discrete else int(np.prod(self.single_action_space.shape))
        b = self.num_envs
        self._state = torch.zeros(b, self._dyn.state_dim, dtype=torch.float32, device=self.device)
        self.elapsed = torch.zeros(b, dtype=torch.int64, device=self.device)
        self._keys: Tensor | None = None  # per sub-env: rng.mix(seed_i)
        self._counters = torch.zeros(b, dtype=torch.int64, device=self.device)  # episodes started
        # the step's maths as one compiled graph (torch.compile: Inductor by default, or the backend named)
        self.compiled = bool(compile)
        self._advance = torch.compile(self._advance_eager, fullgraph=True, dynamic=False,
                                      backend="inductor" if compile is True else compile) if compile else \
            self._advance_eager

    def __repr__(self) -> str:
        return f"TorchClassicVector({self.env_id}, num_envs={self.num_envs}, device={self.device})"

    def _seeds(self, seed: int | Sequence[int] | Tensor) -> Tensor:
        b = self.num_envs
        if isinstance(seed, Tensor):
            seeds = seed.to(device=self.device, dtype=torch.int64).reshape(-1)
        elif isinstance(seed, int | np.integer) and not isinstance(seed, bool):
            return int(seed) + torch.arange(b, dtype=torch.int64, device=self.device)
        elif isinstance(seed, Sequence | np.ndarray) and not isinstance(seed, str | bytes):
            seeds = torch.as_tensor(np.asarray(seed, dtype=np.int64), device=self.device).reshape(-1)
        else:
            raise TypeError(f"seed: expected an int, a sequence of {b} ints or an int64 tensor, got {seed!r}")
        if seeds.shape[0] != b:
            raise ValueError(f"seed: expected {b} seeds (one per sub-env), got {seeds.shape[0]}")
        return seeds

    def _draw_starts(self) -> Tensor:
        """Every sub-env's next start state (its key, its episode counter): [B, state_dim]."""
        assert self._keys is not None
        return self._dyn.start(rng.uniform(self._keys, self._counters, self._dyn.draws))

    def reset(self, seed: int | Sequence[int] | Tensor | None) -> Tensor:
        """Start every sub-env anew and return the observations [B, obs_dim] (float32 on the device). `seed`:
        an int (sub-env i gets seed + i), a sequence or int64 tensor of B seeds, or None to go on from the
        current keys and episode counters (fresh entropy when never seeded)."""
        if seed is None and self._keys is None:
            seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> np.uint64(2))
        if seed is not None:
            self._keys = rng.mix(self._seeds(seed))
            self._counters = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self._state = self._draw_starts()
        self._counters = self._counters + 1
        self.elapsed = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        return self._dyn.obs(self._state)

    def _actions(self, actions: Tensor | np.ndarray | Sequence[Any]) -> Tensor:
        b = self.num_envs
        if self.discrete:
            a = torch.as_tensor(actions, device=self.device)
            if a.numel() != b:
                raise ValueError(f"actions: expected {b} discrete actions (one per sub-env), got shape "
                                 f"{tuple(a.shape)}")
            return a.to(torch.int64).reshape(b)
        a = torch.as_tensor(actions, device=self.device, dtype=torch.float32)
        if a.numel() != b * self._action_dim:
            raise ValueError(f"actions: expected shape ({b}, {self._action_dim}), got {tuple(a.shape)}")
        return a.reshape(b, self._action_dim)

    def step(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """One step of every sub-env: ``(obs, reward, terminated, truncated, final_obs)`` ([B, d] float32,
        [B] float32, [B] bool, [B] bool, [B, d] float32). Where an episode ended, ``obs`` is already the next
        episode's first observation and ``final_obs`` the last one of the ended episode; elsewhere they are
        equal."""
        if self._keys is None:
            raise RuntimeError(f"{self!r}: call reset(seed) before step")
        self._state, self._counters, self.elapsed, out = self._advance(
            self._state, self._actions(actions), self._keys, self._counters, self.elapsed)
        return out

    def _advance_eager(self, state: Tensor, actions: Tensor, keys: Tensor, counters: Tensor, elapsed: Tensor
                       ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor, Tensor, Tensor]]:
        """The step as a pure function of the envs' tensors: (state, counters, elapsed, step's outputs)."""
        state, reward, terminated = self._dyn.step(state, actions)
        elapsed = elapsed + 1
        truncated = elapsed >= self.max_episode_steps
        done = terminated | truncated
        final_obs = self._dyn.obs(state)
        fresh = self._dyn.start(rng.uniform(keys, counters, self._dyn.draws))
        state = torch.where(done.unsqueeze(-1), fresh, state)
        counters = counters + done.to(torch.int64)
        elapsed = torch.where(done, torch.zeros_like(elapsed), elapsed)
        obs = torch.where(done.unsqueeze(-1), self._dyn.obs(fresh), final_obs)
        return state, counters, elapsed, (obs, reward, terminated, truncated, final_obs)

    def state(self) -> Tensor:
        """The physical state [B, state_dim] (a copy): CartPole (x, x_dot, theta, theta_dot), Acrobot (theta1,
        theta2, dtheta1, dtheta2), Pendulum (th, thdot), the mountain cars (position, velocity)."""
        return self._state.clone()

    def set_state(self, state: Tensor, elapsed: Tensor | None = None) -> None:
        """Put every sub-env in physical state `state` [B, state_dim] (and, given `elapsed` [B], at that step of
        its episode; otherwise the step counts stay). For tests and for copying Gymnasium's start states."""
        state = torch.as_tensor(state, dtype=torch.float32, device=self.device)
        if tuple(state.shape) != (self.num_envs, self._dyn.state_dim):
            raise ValueError(f"state: expected shape ({self.num_envs}, {self._dyn.state_dim}), got "
                             f"{tuple(state.shape)}")
        self._state = state.clone()
        if elapsed is not None:
            elapsed = torch.as_tensor(elapsed, dtype=torch.int64, device=self.device)
            if tuple(elapsed.shape) != (self.num_envs,):
                raise ValueError(f"elapsed: expected shape ({self.num_envs},), got {tuple(elapsed.shape)}")
            self.elapsed = elapsed.clone()

    def close(self) -> None:
        """Nothing to release (tensors only); kept for the vector-env interface."""

    def as_gymnasium(self) -> TorchGymnasiumVector:
        """This vector behind Gymnasium's numpy VectorEnv API (:class:`TorchGymnasiumVector`)."""
        return TorchGymnasiumVector(self)


class TorchGymnasiumVector:
    """A :class:`TorchClassicVector` through the numpy Gymnasium VectorEnv API with same-step autoreset, as the
    training loops use envs: float32 observations, float64 rewards, bool flags, and where an episode ended
    ``info["final_obs"]`` (an object array holding the last observation of each ended sub-env, None elsewhere)
    with ``info["_final_obs"]`` marking which."""

    is_vector_env = True

    def __init__(self, env: TorchClassicVector) -> None:
        self.env = env
        self.num_envs = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.metadata = {"autoreset_mode": "SameStep"}

    def __repr__(self) -> str:
        return f"TorchGymnasiumVector({self.env!r})"

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Every sub-env anew: ``(obs, {})``. `seed`: sub-env i gets seed + i; None goes on with the episode
        counters. `options` are not supported (Gymnasium's classic-control reset bounds)."""
        if options:
            raise ValueError(f"options: env_backend: torch takes no reset options, got {options!r}")
        obs = self.env.reset(seed)
        return obs.cpu().numpy(), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """One step of every sub-env with numpy `actions` (Gymnasium's VectorEnv step)."""
        obs, reward, terminated, truncated, final = self.env.step(torch.as_tensor(np.asarray(actions)))
        obs, terminated, truncated = obs.cpu().numpy(), terminated.cpu().numpy(), truncated.cpu().numpy()
        done = terminated | truncated
        info: dict[str, Any] = {}
        if done.any():
            final_np = final.cpu().numpy()
            final_obs = np.empty(self.num_envs, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i] = final_np[i].copy()
            info["final_obs"], info["_final_obs"] = final_obs, done
        return obs, reward.cpu().numpy().astype(np.float64), terminated, truncated, info

    def close(self) -> None:
        """Close the torch vector."""
        self.env.close()
