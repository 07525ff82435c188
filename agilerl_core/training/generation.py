"""The generation step as separate functions: train one member, evaluate one member, (evolve the
population: :meth:`Population.evolve`), commit experience. The in-process loop and the pipeline's
tasks call these same functions, so both give the same result for the same seed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.buffers.nstep import NStepCollector
from agilerl_core.buffers.replay import ReplayBuffer


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integers (the master seed, a generation, a slot...)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


@dataclass
class TrainResult:
    """What one member's training phase produced."""

    slot: int
    env_steps: int
    learn_steps: int
    episodes: int
    mean_return: float  # mean return of episodes finished during training (nan if none)
    mean_loss: float
    wall_s: float


class EpisodeReturns:
    """Running undiscounted returns per sub-env and those of the episodes that finished."""

    def __init__(self, num_envs: int) -> None:
        self.running = np.zeros(num_envs)
        self.finished: list[float] = []

    def step(self, reward: np.ndarray, done: np.ndarray) -> None:
        self.running += reward
        if done.any():
            self.finished.extend(self.running[done].tolist())
            self.running[done] = 0.0

    def mean(self) -> float:
        """Mean return of the finished episodes (nan if none)."""
        return float(np.mean(self.finished)) if self.finished else float("nan")


def _real_next_obs(next_obs, info: dict, done: np.ndarray):
    """With same-step autoreset, the true next observation of a finished episode is in final_obs."""
    if not done.any():
        return next_obs
    final = info["final_obs"]
    idx = np.flatnonzero(done)
    if isinstance(next_obs, dict):
        real = {k: v.copy() for k, v in next_obs.items()}
        for i in idx:
            for k in real:
                real[k][i] = final[i][k]
        return real
    real = next_obs.copy()
    for i in idx:
        real[i] = final[i]
    return real


def _action_masks(info: dict, num_envs: int, action_dim: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(mask for the observations returned, mask for the true next observations) from a vector info."""
    current = info.get("action_mask")
    if current is None:
        return None, None
    current = np.asarray(current, dtype=bool).reshape(num_envs, action_dim)
    nxt = current.copy()
    final = info.get("final_info")
    if final is not None and "action_mask" in final:
        has = np.asarray(final.get("_action_mask", np.zeros(num_envs, bool)), dtype=bool)
        for i in np.flatnonzero(has):
            nxt[i] = np.asarray(final["action_mask"][i], dtype=bool)
    return current, nxt


def train_member(agent: RLAlgorithm, slot: int, env: VectorEnv, buffer: ReplayBuffer, evo_steps: int,
                 seed: int) -> TrainResult:
    """Collect `evo_steps` env steps (rounded up to whole vector steps) into `slot`'s staging area,
    learning every `learn_step` steps once `learning_delay` steps have passed.

    The env is reset with `seed` first, so the result depends only on the agent, the committed buffer
    and the seed (episodes do not straddle generations).
    """
    t0 = time.perf_counter()
    spec = agent.obs_spec
    act_spec = agent.action_spec
    action_dtype = torch.int64 if act_spec.discrete else torch.float32
    hp = agent.hp
    num_envs = env.num_envs
    obs, info = env.reset(seed=seed)
    agent.begin_rollout(num_envs)
    mask, _ = _action_masks(info, num_envs, agent.action_dim)
    has_mask = mask is not None
    episodes = EpisodeReturns(num_envs)
    n_step = getattr(hp, "n_step", 1)
    nstep = NStepCollector(num_envs, n_step, hp.gamma) if n_step > 1 else None
    loss_sum = torch.zeros(())
    learn_steps = 0
    credit = 0
    vector_steps = math.ceil(evo_steps / num_envs)
    for _ in range(vector_steps):
        obs_t = spec.to_tensors(obs, agent.device)
        agent.observe(obs_t)
        actions = agent.explore_action(obs_t, mask)
        next_obs, reward, terminated, truncated, info = env.step(act_spec.to_env(actions))
        done = terminated | truncated
        agent.episodes_done(done)
        real_next = _real_next_obs(next_obs, info, done)
        data = {f"obs.{k}": v for k, v in obs_t.items()}
        data.update({f"next_obs.{k}": v for k, v in spec.to_tensors(real_next, agent.device).items()})
        data["action"] = torch.as_tensor(actions, dtype=action_dtype)
        data["reward"] = torch.as_tensor(reward, dtype=torch.float32)
        data["terminated"] = torch.as_tensor(terminated, dtype=torch.float32)
        if has_mask:
            mask, next_mask = _action_masks(info, num_envs, agent.action_dim)
            data["next_action_mask"] = torch.as_tensor(next_mask)
        if nstep is not None:  # n-step transitions leave the collector as their n steps (or episode) complete
            data = nstep.push(data, done)
        if data is not None:
            buffer.add(slot, data)
        agent.env_steps += num_envs
        episodes.step(reward, done)
        obs = next_obs
        if agent.env_steps >= hp.learning_delay and buffer.available(slot) >= hp.batch_size:
            credit += num_envs
            while credit >= hp.learn_step:
                loss_sum += agent.learn(agent.sample(buffer, slot))
                learn_steps += 1
                credit -= hp.learn_step
    if nstep is not None:  # the unfinished tails bootstrap from the state they stop at
        tail = nstep.flush()
        if tail is not None:
            buffer.add(slot, tail)
    return TrainResult(slot, vector_steps * num_envs, learn_steps, len(episodes.finished), episodes.mean(),
                       float(loss_sum) / learn_steps if learn_steps else float("nan"),
                       time.perf_counter() - t0)


def train_member_offline(agent: RLAlgorithm, slot: int, dataset: ReplayBuffer, learn_steps: int) -> TrainResult:
    """`learn_steps` gradient steps on batches drawn from the dataset's buffer (no env interaction).

    Batches come from the agent's own generator, which its checkpoint carries, so the result depends
    only on the agent and the dataset; ``env_steps`` reports the gradient steps (the offline budget unit).
    """
    t0 = time.perf_counter()
    loss_sum = torch.zeros(())
    for _ in range(learn_steps):
        loss_sum += agent.learn(agent.sample(dataset, slot))
    return TrainResult(slot, learn_steps, learn_steps, 0, float("nan"), float(loss_sum) / max(learn_steps, 1),
                       time.perf_counter() - t0)


def evaluate_member(agent: RLAlgorithm, env: VectorEnv, seed: int, max_steps: int | None = None) -> float:
    """Fitness: mean return of one greedy episode per sub-env of `env`, after a reset with `seed`."""
    spec = agent.obs_spec
    n = env.num_envs
    obs, info = env.reset(seed=seed)
    mask, _ = _action_masks(info, n, agent.action_dim)
    returns = np.zeros(n)
    active = np.ones(n, dtype=bool)
    steps = 0
    while active.any() and (max_steps is None or steps < max_steps):
        actions = agent.env_action(spec.to_tensors(obs, agent.device), mask)
        obs, reward, terminated, truncated, info = env.step(actions)
        returns += reward * active
        active &= ~(terminated | truncated)
        mask, _ = _action_masks(info, n, agent.action_dim)
        steps += 1
    return float(returns.mean())


def train_member_on_policy(agent, slot: int, env: VectorEnv, evo_steps: int, seed: int) -> TrainResult:
    """Collect `evo_steps` env steps (whole vector steps) of the member's own rollouts of
    `rollout_steps` each, learning after every rollout (the last one may be shorter).

    Like the off-policy step, the env is reset with `seed` first, so the result depends only on the
    agent and the seed; the rollout bootstraps from V of the observation after its last step.
    """
    from agilerl_core.buffers.rollout import Rollout, compute_gae

    t0 = time.perf_counter()
    spec, act_spec, hp = agent.obs_spec, agent.action_spec, agent.hp
    num_envs = env.num_envs
    obs, info = env.reset(seed=seed)
    agent.begin_rollout(num_envs)
    mask, _ = _action_masks(info, num_envs, agent.action_dim)
    vector_steps = math.ceil(evo_steps / num_envs)
    obs_t = spec.to_tensors(obs, agent.device)
    rollout = Rollout.allocate(hp.rollout_steps, num_envs, obs_t, () if act_spec.discrete else (act_spec.dim,),
                               torch.int64 if act_spec.discrete else torch.float32,
                               None if mask is None else mask.shape[1])
    episodes = EpisodeReturns(num_envs)
    losses: list[float] = []
    done_steps = 0
    learn0 = agent.learn_steps
    while done_steps < vector_steps:
        steps = min(hp.rollout_steps, vector_steps - done_steps)
        for t in range(steps):
            actions, logp, value = agent.policy_step(obs_t, mask)
            next_obs, reward, terminated, truncated, info = env.step(act_spec.to_env(actions))
            done = terminated | truncated
            for k, v in obs_t.items():
                rollout.obs[k][t] = v
            rollout.actions[t] = torch.as_tensor(actions)
            rollout.logprobs[t], rollout.values[t] = logp.cpu(), value.cpu()
            if rollout.masks is not None:
                rollout.masks[t] = torch.as_tensor(mask)
            r = torch.as_tensor(reward, dtype=torch.float32)
            cut = truncated & ~terminated
            if cut.any():  # a time limit is not the end of the world: credit the final state's value
                final = _real_next_obs(next_obs, info, cut)
                with torch.no_grad():
                    v_final = agent.value(spec.to_tensors(final, agent.device)).cpu()
                r = r + hp.gamma * v_final * torch.as_tensor(cut, dtype=torch.float32)
            rollout.rewards[t] = r
            rollout.dones[t] = torch.as_tensor(done, dtype=torch.float32)
            agent.env_steps += num_envs
            episodes.step(reward, done)
            obs = next_obs
            obs_t = spec.to_tensors(obs, agent.device)
            mask, _ = _action_masks(info, num_envs, agent.action_dim)
        with torch.no_grad():
            last_value = agent.value(obs_t).cpu()
        adv, ret = compute_gae(rollout.rewards[:steps], rollout.values[:steps], rollout.dones[:steps], last_value,
                               hp.gamma, hp.gae_lambda)
        losses.append(agent.learn_rollout(rollout, steps, adv, ret)["loss"])
        # the statistics move between rollouts only, so a rollout's log-probs and its update see one scale
        agent.observe({k: v[:steps] for k, v in rollout.obs.items()})
        done_steps += steps
    return TrainResult(slot, vector_steps * num_envs, agent.learn_steps - learn0, len(episodes.finished),
                       episodes.mean(), float(np.mean(losses)) if losses else float("nan"), time.perf_counter() - t0)
