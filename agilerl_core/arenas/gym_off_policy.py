"""The off-policy Gymnasium arena: members collect experience in their own envs and learn from one shared
replay buffer (DQN, Rainbow, DDPG, TD3, SAC; CQN and CQL online).

During generation g a member samples from the buffer as committed at the end of g-1 plus its own fresh
transitions (its staging slot); at the commit the slots' shards are appended in member order.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.group import ReplayGroup
from agilerl_core.arenas.base import EpisodeReturns, GymArena, probe_action_mask
from agilerl_core.arenas.experience import ReplayLearning, SharedReplay, replay_group_phase
from agilerl_core.buffers.memory import check_replay_fits
from agilerl_core.buffers.nstep import NStepCollector
from agilerl_core.buffers.replay import ReplayBuffer, transition_fields
from agilerl_core.envs.vector import action_masks, real_next_obs
from agilerl_core.finite import check_host
from agilerl_core.hpo.evolution import TrainResult


class _Collector:
    """One member's side of a training phase: its env, staging slot, n-step collector, episode returns and
    the gradient steps its collection earns."""

    def __init__(self, agent: RLAlgorithm, slot: int, env: VectorEnv, buffer: ReplayBuffer, seed: int) -> None:
        self.agent, self.slot, self.env, self.buffer = agent, slot, env, buffer
        self.num_envs = env.num_envs
        self.action_dtype = torch.int64 if agent.action_spec.discrete else torch.float32
        self.obs, info = env.reset(seed=seed)
        check_host(self.obs, "observation (after reset)", slot, 0)
        self.t = 0  # vector steps taken this phase
        agent.begin_rollout(self.num_envs)
        self.mask, _ = action_masks(info, self.num_envs, agent.action_dim)
        self.has_mask = self.mask is not None
        self.episodes = EpisodeReturns(self.num_envs)
        n_step = getattr(agent.hp, "n_step", 1)
        self.nstep = NStepCollector(self.num_envs, n_step) if n_step > 1 else None
        self.learning = ReplayLearning(agent, buffer, slot)
        self.obs_t = None

    def observation(self):
        """The current observations as tensors (folded into the agent's normalisation statistics)."""
        self.obs_t = self.agent.obs_spec.to_tensors(self.obs, self.agent.device)
        self.agent.observe(self.obs_t)
        return self.obs_t

    def step(self, actions: np.ndarray) -> None:
        """Step the env with `actions` and stage the transitions."""
        agent, n = self.agent, self.num_envs
        next_obs, reward, terminated, truncated, info = self.env.step(agent.action_spec.to_env(actions))
        self.t += 1
        check_host(reward, "reward", self.slot, self.t)  # host arrays: no device wait
        check_host(next_obs, "observation", self.slot, self.t)
        done = terminated | truncated
        agent.episodes_done(done)
        real_next = real_next_obs(next_obs, info, done)
        if done.any():
            check_host(real_next, "final observation", self.slot, self.t)
        data = {f"obs.{k}": v for k, v in self.obs_t.items()}
        data.update({f"next_obs.{k}": v for k, v in agent.obs_spec.to_tensors(real_next, agent.device).items()})
        data["action"] = torch.as_tensor(actions, dtype=self.action_dtype)
        data["reward"] = torch.as_tensor(reward, dtype=torch.float32)
        data["terminated"] = torch.as_tensor(terminated, dtype=torch.float32)
        if self.has_mask:
            self.mask, next_mask = action_masks(info, n, agent.action_dim)
            data["next_action_mask"] = torch.as_tensor(next_mask)
        if self.nstep is not None:  # n-step transitions leave the collector as their n steps (or episode) complete
            data = self.nstep.push(data, done)
        if data is not None:
            self.buffer.add(self.slot, data)
        agent.env_steps += n
        self.episodes.step(reward, done)
        self.obs = next_obs

    def finish(self, vector_steps: int, wall_s: float) -> TrainResult:
        if self.nstep is not None:  # the unfinished tails bootstrap from the state they stop at
            tail = self.nstep.flush()
            if tail is not None:
                self.buffer.add(self.slot, tail)
        return TrainResult(self.slot, vector_steps * self.num_envs, self.learning.steps, len(self.episodes.finished),
                           self.episodes.mean(), self.learning.mean_loss, wall_s)


def train_group(group: ReplayGroup, slots: list[int], envs: list[VectorEnv], buffer: ReplayBuffer, evo_steps: int,
                seeds: list[int]) -> list[TrainResult]:
    """Collect `evo_steps` env steps per member (rounded up to whole vector steps) into its staging slot,
    learning every `learn_step` steps once `learning_delay` steps have passed: one batched forward chooses
    every member's actions, and each round of gradient steps is one batched step (a member whose learn_step
    earns it fewer steps than another sits the extra ones out). A member alone is a group of one.

    Each env is reset with its member's seed first, so the result depends only on the members, the committed
    buffer and the seeds (episodes do not straddle generations)."""
    t0 = time.perf_counter()
    cs = [_Collector(a, s, envs[s], buffer, seed) for a, s, seed in zip(group.agents, slots, seeds, strict=True)]
    vector_steps = replay_group_phase(group, cs, buffer, slots, evo_steps)
    wall = time.perf_counter() - t0
    return [c.finish(vector_steps, wall) for c in cs]


class OffPolicyArena(SharedReplay, GymArena):
    """Members act in their own vector envs and learn from the shared replay buffer."""

    def __init__(self, cfg, algo_cls: type[RLAlgorithm]) -> None:
        super().__init__(cfg, algo_cls)
        n_step = getattr(cfg.hyperparameters, "n_step", 1)
        slot_capacity = math.ceil(cfg.evo_steps / cfg.num_envs) * cfg.num_envs
        # the replay's whole size (committed ring and every slot's staging) against what the device has, before
        # any env or buffer is built: a config that cannot fit is refused naming its fields
        check_replay_fits(transition_fields(self.obs_spec, None, self.action_spec, n_step),
                          cfg.hyperparameters.buffer_size, cfg.population_size, slot_capacity, self.device, cfg.name)
        self.envs = [self.recipe.vector(cfg.num_envs)
                     for _ in range(cfg.population_size)]  # one per slot
        mask_dim = probe_action_mask(self.envs[0])
        n_step = getattr(cfg.hyperparameters, "n_step", 1)
        self.buffer = ReplayBuffer(transition_fields(self.obs_spec, mask_dim, self.action_spec, n_step),
                                   cfg.hyperparameters.buffer_size, self.device)
        self.slot_capacity = math.ceil(cfg.evo_steps / cfg.num_envs) * cfg.num_envs

    def train(self, member: RLAlgorithm, slot: int, seed: int, steps: int) -> TrainResult:
        return self.train_group([member], [slot], [seed], steps)[0]  # learning is written for a population

    def batch_key(self, member: RLAlgorithm):
        return member.batch_key()

    def train_group(self, members: list[RLAlgorithm], slots: list[int], seeds: list[int], steps: int
                    ) -> list[TrainResult]:
        for s in slots:
            self.buffer.reset_slot(s)
        return train_group(self.algo_cls.group(members), slots, self.recipe.for_training(self.envs), self.buffer, steps, seeds)
