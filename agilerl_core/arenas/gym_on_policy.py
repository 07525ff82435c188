"""The on-policy Gymnasium arena: every member learns from its own fresh rollouts only (PPO); nothing is
shared between members, so a generation commits no experience."""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.arenas.base import EpisodeReturns, GymArena
from agilerl_core.buffers.rollout import Rollout, compute_gae
from agilerl_core.envs.make import make_vector_env
from agilerl_core.envs.vector import action_masks, real_next_obs
from agilerl_core.hpo.evolution import TrainResult


def train_member_on_policy(agent, slot: int, env: VectorEnv, evo_steps: int, seed: int) -> TrainResult:
    """Collect `evo_steps` env steps (whole vector steps) of the member's own rollouts of
    `rollout_steps` each, learning after every rollout (the last one may be shorter).

    Like the off-policy step, the env is reset with `seed` first, so the result depends only on the
    agent and the seed; the rollout bootstraps from V of the observation after its last step.
    """
    t0 = time.perf_counter()
    spec, act_spec, hp = agent.obs_spec, agent.action_spec, agent.hp
    num_envs = env.num_envs
    obs, info = env.reset(seed=seed)
    agent.begin_rollout(num_envs)
    mask, _ = action_masks(info, num_envs, agent.action_dim)
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
                final = real_next_obs(next_obs, info, cut)
                with torch.no_grad():
                    v_final = agent.value(spec.to_tensors(final, agent.device)).cpu()
                r = r + hp.gamma * v_final * torch.as_tensor(cut, dtype=torch.float32)
            rollout.rewards[t] = r
            rollout.dones[t] = torch.as_tensor(done, dtype=torch.float32)
            agent.env_steps += num_envs
            episodes.step(reward, done)
            obs = next_obs
            obs_t = spec.to_tensors(obs, agent.device)
            mask, _ = action_masks(info, num_envs, agent.action_dim)
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


class OnPolicyArena(GymArena):
    """Members act in their own vector envs and learn from their own rollouts."""

    def __init__(self, cfg, algo_cls: type[RLAlgorithm]) -> None:
        super().__init__(cfg, algo_cls)
        self.envs = [make_vector_env(cfg.env_id, cfg.num_envs, cfg.env_kwargs, cfg.env_entry_point)
                     for _ in range(cfg.population_size)]  # one per slot

    def train(self, member: RLAlgorithm, slot: int, seed: int, steps: int) -> TrainResult:
        return train_member_on_policy(member, slot, self.envs[slot], steps, seed)
