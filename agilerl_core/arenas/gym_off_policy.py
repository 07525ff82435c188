"""The off-policy Gymnasium arena: members collect experience in their own envs and learn from one shared
replay buffer (DQN, Rainbow, DDPG, TD3, SAC; CQN and CQL online).

During generation g a member samples from the buffer as committed at the end of g-1 plus its own fresh
transitions (its staging slot); at the commit the slots' shards are appended in member order.
"""

from __future__ import annotations

import math

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.arenas.base import GymArena, probe_action_mask
from agilerl_core.arenas.experience import SharedReplay
from agilerl_core.buffers.frame_format import FramePart, frame_fields, frame_parts, stacks_frames
from agilerl_core.buffers.frames import FrameReplayBuffer
from agilerl_core.buffers.memory import check_replay_fits
from agilerl_core.buffers.replay import ReplayBuffer, transition_fields
from agilerl_core.envs.make import EnvRecipe
from agilerl_core.loops.off_policy import train_group_off_policy
from agilerl_core.results import TrainResult


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
        return train_group_off_policy(group, slots, self.group_env(slots, group.device), self.buffer, steps, seeds)
