"""The off-policy Gymnasium arena: members collect experience in their own envs and learn from one shared
replay buffer (DQN, Rainbow, DDPG, TD3, SAC; CQN and CQL online).

During generation g a member samples from the buffer as committed at the end of g-1 plus its own fresh
transitions (its staging slot); at the commit the slots' shards are appended in member order.
"""

from __future__ import annotations

import math
import time

import torch

from agilerl_core import progress
from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.group import ReplayGroup
from agilerl_core.arenas.base import GymArena, probe_action_mask
from agilerl_core.arenas.experience import LearnRounds, ReplayLearning, SharedReplay
from agilerl_core.buffers.frame_format import FramePart, frame_fields, frame_parts, stacks_frames
from agilerl_core.buffers.frames import FrameReplayBuffer
from agilerl_core.buffers.memory import check_replay_fits
from agilerl_core.buffers.nstep import NStepCollector
from agilerl_core.buffers.replay import ReplayBuffer, transition_fields
from agilerl_core.envs.group import GroupEnv
from agilerl_core.envs.make import EnvRecipe
from agilerl_core.results import TrainResult
from agilerl_core.train_metrics import EpisodeTally, marks, phase_metrics


def train_group(group: ReplayGroup, slots: list[int], envs: GroupEnv, buffer: ReplayBuffer, evo_steps: int,
                seeds: list[int]) -> list[TrainResult]:
    """Collect `evo_steps` env steps per member (rounded up to whole vector steps) into its staging slot,
    learning every `learn_step` steps once `learning_delay` steps have passed. The group's envs step as one
    (`envs`, K members x N sub-envs), one batched forward chooses every member's actions
    (:meth:`~agilerl_core.algorithms.group.ReplayGroup.explore_group`: the DQN family draws its exploration on
    the device from keyed streams), the step's transitions go to every member's staging slot in one indexed
    copy, and each round of gradient steps is one batched step (a member whose learn_step earns it fewer steps
    than another sits the extra ones out). Returns and losses stay on the device until the end. A member
    alone is a group of one.

    Each member's envs are reset with its seed first, so the result depends only on the members, the
    committed buffer and the seeds (episodes do not straddle generations). n-step windows are kept for the
    group's K x N sub-envs at once (on the host: which windows end depends on the episodes that ended), and
    each member's completed transitions go to its slot in the order its own collector would give them."""
    t0 = time.perf_counter()
    agents, k, n = group.agents, envs.k, envs.n
    dev = group.device
    obs, mask = envs.reset(seeds)  # the group's keyed stream starts at its first draw (algorithms that draw)
    for a in agents:
        a.begin_rollout(n)
    n_step = getattr(agents[0].hp, "n_step", 1)  # structural: equal within a group
    nstep = NStepCollector(k * n, n_step) if n_step > 1 else None  # the group's K x N sub-envs at once
    rounds = LearnRounds(group, [ReplayLearning(a, buffer, s) for a, s in zip(agents, slots, strict=True)],
                         buffer, slots)
    episodes = EpisodeTally(k, n, dev)
    vector_steps = math.ceil(evo_steps / n)
    marked = marks(vector_steps, vector_steps * n)  # a long phase's points
    for t in range(vector_steps):
        group.observe(obs)  # each member folds its own envs' observations into its statistics
        actions = group.explore_group(obs, mask)
        step = envs.step(actions)
        done = step.terminated | step.truncated
        data = {f"obs.{key}": v for key, v in obs.items()}
        data.update({f"next_obs.{key}": v for key, v in step.final_obs.items()})
        data["action"] = actions.reshape(k * n, *actions.shape[2:])
        data["reward"] = step.reward.to(torch.float32)
        data["terminated"] = step.terminated.to(torch.float32)
        if step.next_mask is not None:
            data["next_action_mask"] = step.next_mask
        if nstep is not None:  # host envs know which episodes ended already; on-device envs: one read
            host_done = step.host_done if step.host_done is not None else done.cpu().numpy()
            out = nstep.push(data, host_done)
            for s, rows in zip(slots, nstep.split(out, k), strict=True):
                if rows is not None:
                    buffer.add(s, rows)
        else:
            buffer.add_group(slots, data)
        for a in agents:
            a.env_steps += n
        progress.advance(k * n)
        group.episodes_done(done)
        episodes.step(step.reward, done)
        obs, mask = step.obs, step.mask
        rounds.after_step(n, t + 1)
        if t + 1 in marked:
            group.metrics.mark([a.env_steps for a in agents])
    rounds.finish()
    group.write_back()
    envs.check(slots)
    if nstep is not None:  # the unfinished tails bootstrap from the state they stop at
        tails = nstep.split(nstep.flush(), k)
        for s, tail in zip(slots, tails, strict=True):
            if tail is not None:
                buffer.add(s, tail)
    counts, returns, lengths = episodes.read()  # the phase's numbers, read once
    diagnostics, points = group.metrics.means(), group.metrics.points()
    wall = time.perf_counter() - t0
    return [TrainResult(s, vector_steps * n, lr.steps, c, ret, lr.mean_loss, wall,
                        phase_metrics(d, vector_steps * n, wall, length, lr.mean_loss), p)
            for s, lr, c, ret, length, d, p in zip(slots, rounds.learnings, counts, returns, lengths, diagnostics,
                                                    points, strict=True)]


def probe_frame_stacking(recipe: EnvRecipe, parts: dict[str, FramePart]) -> dict[str, FramePart]:
    """The image parts of `parts` whose frames one env stacks (a step's observation is the last one shifted by
    a frame, as Gymnasium's FrameStackObservation gives): one reset and one step of a fresh env, seeded."""
    if not parts or recipe.backend == "torch":
        return {}
    env = recipe.make()
    try:
        obs, _ = env.reset(seed=0)
        env.action_space.seed(0)
        nxt = env.step(env.action_space.sample())[0]
    finally:
        env.close()
    pick = (lambda o, k: o[k]) if isinstance(obs, dict) else (lambda o, k: o)
    return {k: p for k, p in parts.items() if stacks_frames(pick(obs, k), pick(nxt, k), p)}


class OffPolicyArena(SharedReplay, GymArena):
    """Members act in their own vector envs and learn from the shared replay buffer."""

    def __init__(self, cfg, algo_cls: type[RLAlgorithm]) -> None:
        super().__init__(cfg, algo_cls)
        n_step = getattr(cfg.hyperparameters, "n_step", 1)
        self.slot_capacity = math.ceil(cfg.evo_steps / cfg.num_envs) * cfg.num_envs
        # stacked image frames are stored once each (one-step transitions: an n-step row's stacks lie n apart)
        frames = probe_frame_stacking(self.recipe, frame_parts(self.obs_spec)) if n_step == 1 else {}
        # the replay's whole size (committed ring and every slot's staging) against what the device has, before
        # any vector env or buffer is built: a config that cannot fit is refused naming its fields
        check_replay_fits(frame_fields(transition_fields(self.obs_spec, None, self.action_spec, n_step), frames),
                          cfg.hyperparameters.buffer_size, cfg.population_size, self.slot_capacity, self.device,
                          cfg.name, frames=frames)
        # one vector env per slot (host envs); the on-device backend builds a group's envs per phase
        self.envs = [] if self.recipe.backend == "torch" else [self.recipe.vector(cfg.num_envs)
                                                                for _ in range(cfg.population_size)]
        mask_dim = probe_action_mask(self.envs[0]) if self.envs else None
        fields = transition_fields(self.obs_spec, mask_dim, self.action_spec, n_step)
        size = cfg.hyperparameters.buffer_size
        self.buffer = FrameReplayBuffer(fields, size, frames, self.device) if frames else \
            ReplayBuffer(fields, size, self.device)

    def train_group(self, members: list[RLAlgorithm], slots: list[int], seeds: list[int], steps: int
                    ) -> list[TrainResult]:
        for s in slots:
            self.buffer.reset_slot(s)
        group = self.learning_group(members)
        return train_group(group, slots, self.group_env(slots, group.device), self.buffer, steps, seeds)
