"""The off-policy Gymnasium arena: members collect experience in their own envs and learn from one shared
replay buffer (DQN, Rainbow, DDPG, TD3, SAC; CQN and CQL online).

During generation g a member samples from the buffer as committed at the end of g-1 plus its own fresh
transitions (its staging slot); at the commit the slots' shards are appended in member order.
"""

from __future__ import annotations

import math
import time

import torch
from gymnasium.vector import VectorEnv

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.arenas.base import EpisodeReturns, GymArena, probe_action_mask
from agilerl_core.arenas.experience import ReplayLearning, SharedReplay
from agilerl_core.buffers.nstep import NStepCollector
from agilerl_core.buffers.replay import ReplayBuffer, transition_fields
from agilerl_core.envs.make import make_vector_env
from agilerl_core.envs.vector import action_masks, real_next_obs
from agilerl_core.hpo.evolution import TrainResult


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
    mask, _ = action_masks(info, num_envs, agent.action_dim)
    has_mask = mask is not None
    episodes = EpisodeReturns(num_envs)
    n_step = getattr(hp, "n_step", 1)
    nstep = NStepCollector(num_envs, n_step, hp.gamma) if n_step > 1 else None
    learning = ReplayLearning(agent, buffer, slot)
    vector_steps = math.ceil(evo_steps / num_envs)
    for _ in range(vector_steps):
        obs_t = spec.to_tensors(obs, agent.device)
        agent.observe(obs_t)
        actions = agent.explore_action(obs_t, mask)
        next_obs, reward, terminated, truncated, info = env.step(act_spec.to_env(actions))
        done = terminated | truncated
        agent.episodes_done(done)
        real_next = real_next_obs(next_obs, info, done)
        data = {f"obs.{k}": v for k, v in obs_t.items()}
        data.update({f"next_obs.{k}": v for k, v in spec.to_tensors(real_next, agent.device).items()})
        data["action"] = torch.as_tensor(actions, dtype=action_dtype)
        data["reward"] = torch.as_tensor(reward, dtype=torch.float32)
        data["terminated"] = torch.as_tensor(terminated, dtype=torch.float32)
        if has_mask:
            mask, next_mask = action_masks(info, num_envs, agent.action_dim)
            data["next_action_mask"] = torch.as_tensor(next_mask)
        if nstep is not None:  # n-step transitions leave the collector as their n steps (or episode) complete
            data = nstep.push(data, done)
        if data is not None:
            buffer.add(slot, data)
        agent.env_steps += num_envs
        episodes.step(reward, done)
        obs = next_obs
        learning.collected(num_envs)
    if nstep is not None:  # the unfinished tails bootstrap from the state they stop at
        tail = nstep.flush()
        if tail is not None:
            buffer.add(slot, tail)
    return TrainResult(slot, vector_steps * num_envs, learning.steps, len(episodes.finished), episodes.mean(),
                       learning.mean_loss, time.perf_counter() - t0)


class OffPolicyArena(SharedReplay, GymArena):
    """Members act in their own vector envs and learn from the shared replay buffer."""

    def __init__(self, cfg, algo_cls: type[RLAlgorithm]) -> None:
        super().__init__(cfg, algo_cls)
        self.envs = [make_vector_env(cfg.env_id, cfg.num_envs, cfg.env_kwargs, cfg.env_entry_point)
                     for _ in range(cfg.population_size)]  # one per slot
        mask_dim = probe_action_mask(self.envs[0])
        n_step = getattr(cfg.hyperparameters, "n_step", 1) > 1
        self.buffer = ReplayBuffer(transition_fields(self.obs_spec, mask_dim, self.action_spec, n_step),
                                   cfg.hyperparameters.buffer_size, self.device)
        self.slot_capacity = math.ceil(cfg.evo_steps / cfg.num_envs) * cfg.num_envs

    def train(self, member: RLAlgorithm, slot: int, seed: int, steps: int) -> TrainResult:
        self.buffer.reset_slot(slot)
        return train_member(member, slot, self.envs[slot], self.buffer, steps, seed)
