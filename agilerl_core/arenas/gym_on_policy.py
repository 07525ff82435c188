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
from agilerl_core.arenas.experience import rollout_lengths
from agilerl_core.buffers.rollout import Rollout, compute_gae
from agilerl_core.envs.vector import action_masks, real_next_obs
from agilerl_core.finite import check_host, check_loss
from agilerl_core.hpo.evolution import TrainResult


class _RolloutCollector:
    """One member's side of an on-policy training phase: its env, rollout buffer, episode returns and losses.
    `value(obs, starts)` gives V(s) of the member (its row of the group's stacked critic; a recurrent one from
    its current state, zeroed where `starts` is set). A recurrent member's rollout also keeps each network's
    state before every step and which steps began an episode (:attr:`starts`: every env at the phase's start,
    then those whose episode ended in the previous step)."""

    def __init__(self, agent, slot: int, env: VectorEnv, seed: int, value, state_shapes=None) -> None:
        self.agent, self.slot, self.env, self.value = agent, slot, env, value
        spec, act_spec, hp = agent.obs_spec, agent.action_spec, agent.hp
        self.num_envs = env.num_envs
        obs, info = env.reset(seed=seed)
        check_host(obs, "observation (after reset)", slot, 0)
        self.t = 0  # vector steps taken this phase
        agent.begin_rollout(self.num_envs)
        self.mask, _ = action_masks(info, self.num_envs, agent.action_dim)
        self.obs_t = spec.to_tensors(obs, agent.device)
        self.rollout = Rollout.allocate(hp.rollout_steps, self.num_envs, self.obs_t,
                                        () if act_spec.discrete else (act_spec.dim,),
                                        torch.int64 if act_spec.discrete else torch.float32,
                                        None if self.mask is None else self.mask.shape[1])
        self.starts = np.ones(self.num_envs, dtype=bool)
        if state_shapes is not None:
            self.rollout.with_states(state_shapes)
        self.episodes = EpisodeReturns(self.num_envs)
        self.losses: list[float] = []
        self.learn0 = agent.learn_steps

    def step(self, t: int, actions: np.ndarray, logp: torch.Tensor, value: torch.Tensor,
             states: dict[str, torch.Tensor] | None = None) -> None:
        """Step the env with `actions` (sampled with `logp`, in states valued `value`; a recurrent member's
        network `states` before the step) into row t."""
        agent, rollout, hp = self.agent, self.rollout, self.agent.hp
        spec = agent.obs_spec
        next_obs, reward, terminated, truncated, info = self.env.step(agent.action_spec.to_env(actions))
        self.t += 1
        check_host(reward, "reward", self.slot, self.t)  # host arrays: no device wait
        check_host(next_obs, "observation", self.slot, self.t)
        done = terminated | truncated
        for k, v in self.obs_t.items():
            rollout.obs[k][t] = v
        rollout.actions[t] = torch.as_tensor(actions)
        rollout.logprobs[t], rollout.values[t] = logp.cpu(), value.cpu()
        if rollout.masks is not None:
            rollout.masks[t] = torch.as_tensor(self.mask)
        if states is not None:
            for name, st in states.items():
                rollout.states[name][t] = st
            rollout.starts[t] = torch.as_tensor(self.starts)
        r = torch.as_tensor(reward, dtype=torch.float32)
        cut = truncated & ~terminated
        if cut.any():  # a time limit is not the end of the world: credit the final state's value
            final = real_next_obs(next_obs, info, cut)
            check_host(final, "final observation", self.slot, self.t)
            with torch.no_grad():
                v_final = self.value(spec.to_tensors(final, agent.device), None).cpu()
            r = r + hp.gamma * v_final * torch.as_tensor(cut, dtype=torch.float32)
        rollout.rewards[t] = r
        rollout.dones[t] = torch.as_tensor(done, dtype=torch.float32)
        agent.env_steps += self.num_envs
        self.episodes.step(reward, done)
        self.starts = done
        self.obs_t = spec.to_tensors(next_obs, agent.device)
        self.mask, _ = action_masks(info, self.num_envs, agent.action_dim)

    def advantages(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE over the rollout's first `steps` rows, bootstrapped from V of the observation after them."""
        hp, rollout = self.agent.hp, self.rollout
        with torch.no_grad():
            last_value = self.value(self.obs_t, self.starts).cpu()
        return compute_gae(rollout.rewards[:steps], rollout.values[:steps], rollout.dones[:steps], last_value,
                           hp.gamma, hp.gae_lambda)

    def learned(self, steps: int, stats: dict[str, float]) -> None:
        self.losses.append(stats["loss"])
        check_loss(stats["loss"], self.slot, len(self.losses), "the loss", "update of rollout")
        # the statistics move between rollouts only, so a rollout's log-probs and its update see one scale
        self.agent.observe({k: v[:steps] for k, v in self.rollout.obs.items()})

    def result(self, vector_steps: int, wall_s: float) -> TrainResult:
        agent = self.agent
        return TrainResult(self.slot, vector_steps * self.num_envs, agent.learn_steps - self.learn0,
                           len(self.episodes.finished), self.episodes.mean(),
                           float(np.mean(self.losses)) if self.losses else float("nan"), wall_s)


def train_group_on_policy(group, slots: list[int], envs: list[VectorEnv], evo_steps: int, seeds: list[int]
                          ) -> list[TrainResult]:
    """Collect `evo_steps` env steps per member (whole vector steps) of its own rollouts of `rollout_steps`
    each, learning after every rollout (the last one may be shorter): one batched forward samples every
    member's actions, one batched update per minibatch round (see :class:`~agilerl_core.algorithms.ppo.PPOGroup`).
    A member alone is a group of one.

    Each env is reset with its member's seed first, so the result depends only on the members and the seeds;
    a rollout bootstraps from V of the observation after its last step."""
    t0 = time.perf_counter()
    shapes = None if group.rnn is None else {name: group.rnn for name in group.nets}
    cs = [_RolloutCollector(a, s, envs[s], seed, lambda obs, starts, i=i: group.value(i, obs, starts), shapes)
          for i, (a, s, seed) in enumerate(zip(group.agents, slots, seeds, strict=True))]
    group.begin_acting(cs[0].num_envs)
    vector_steps = math.ceil(evo_steps / cs[0].num_envs)
    rollout_steps = group.agents[0].hp.rollout_steps  # structural: equal within a group
    for steps in rollout_lengths(vector_steps, rollout_steps):
        for t in range(steps):
            outs = group.policy_step([c.obs_t for c in cs], [c.mask for c in cs], [c.starts for c in cs])
            for c, out in zip(cs, outs, strict=True):
                c.step(t, *out)
        rows = [c.agent.rollout_rows(c.rollout, steps, *c.advantages(steps)) for c in cs]
        stats = group.learn_rollouts([d for d, _, _ in rows], [a for _, a, _ in rows], [r for _, _, r in rows])
        for c, st in zip(cs, stats, strict=True):
            c.learned(steps, st)
    group.write_back()
    wall = time.perf_counter() - t0
    return [c.result(vector_steps, wall) for c in cs]


class OnPolicyArena(GymArena):
    """Members act in their own vector envs and learn from their own rollouts."""

    def __init__(self, cfg, algo_cls: type[RLAlgorithm]) -> None:
        super().__init__(cfg, algo_cls)
        self.envs = [self.recipe.vector(cfg.num_envs)
                     for _ in range(cfg.population_size)]  # one per slot

    def train(self, member: RLAlgorithm, slot: int, seed: int, steps: int) -> TrainResult:
        return self.train_group([member], [slot], [seed], steps)[0]  # learning is written for a population

    def batch_key(self, member: RLAlgorithm):
        return member.batch_key()

    def train_group(self, members: list[RLAlgorithm], slots: list[int], seeds: list[int], steps: int
                    ) -> list[TrainResult]:
        return train_group_on_policy(self.algo_cls.group(members), slots, self.recipe.for_training(self.envs), steps, seeds)
