"""A group's teams as one vector: the K members' PettingZoo vector envs (:mod:`agilerl_core.envs.multi_agent`)
stepped together, their observations and masks as the group's tensors, member-major (member k's sub-envs are
rows k*N .. k*N+N-1). Kept apart from the vector envs themselves, which env worker processes import (without
torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agilerl_core.envs.multi_agent import AgentArrays, ParallelVectorEnv
from agilerl_core.envs.spaces import MultiAgentSpec, Obs
from agilerl_core.errors import NonFiniteError
from agilerl_core.finite import _bad

AgentMasks = dict[str, torch.Tensor | None]


@dataclass
class TeamStep:
    """One step of a group's team envs, member-major (member k's sub-envs are rows k*N .. k*N+N-1): tensors on
    the group's device for what the networks and buffers read, host arrays for what the loops count."""

    obs: Obs  # every agent's observation to act on next (a fresh episode's first where env_done)
    final_obs: Obs  # the true next observations (equal to obs where no episode ended)
    mask: AgentMasks  # each Discrete agent's allowed actions on obs [K * N, A] (None for Box agents)
    final_mask: AgentMasks  # ... on final_obs
    reward: AgentArrays  # [K * N] float32
    terminated: AgentArrays  # [K * N] bool
    truncated: AgentArrays  # [K * N] bool
    acted: AgentArrays  # which agents acted in this step (an agent out of its episode did not)
    alive: AgentArrays  # which agents act next
    env_done: np.ndarray  # [K * N] bool: the sub-envs whose episode ended (and were reset)


class TeamGroupEnv:
    """K members' vector envs of one PettingZoo env (:class:`ParallelVectorEnv`, in process or in worker
    processes) stepped as one group, member-major (see :class:`TeamStep`): every member's envs start their step
    before any finishes (so all worker processes step at once), and each agent's observations and masks become
    the group's tensors in one conversion. When `checked`, rewards and observations are checked for NaN and inf
    on the host (the member is found only once something is wrong). Member k's envs are reset with its own
    seed, so its episodes are those it would see alone."""

    def __init__(self, envs: list[ParallelVectorEnv], slots: list[int], spec: MultiAgentSpec,
                 device: torch.device | str, checked: bool = True) -> None:
        self.envs, self.slots, self.checked = list(envs), list(slots), checked
        self.k, self.n = len(self.envs), self.envs[0].num_envs
        self.spec, self.device = spec, torch.device(device)
        self.t = 0  # steps since the reset

    def reset(self, seeds: list[int]) -> tuple[Obs, AgentMasks, AgentArrays]:
        """Every member's envs anew, member k's from ``seeds[k]`` (sub-env i: seed + i): (observations, action
        masks, which agents are alive)."""
        self.t = 0
        outs = [e.reset(seed=int(s)) for e, s in zip(self.envs, seeds, strict=True)]
        obs = self._joined([o for o, _ in outs], "observation (after reset)")
        masks = self._joined([info["action_mask"] for _, info in outs])
        return self._tensors(obs), self._masks(masks), self._joined([info["alive"] for _, info in outs])

    def step(self, actions: dict[str, torch.Tensor]) -> TeamStep:
        """Step every member's envs with each agent's actions [K * N(, dim)] (agent scale, member-major)."""
        self.t += 1
        n = self.n
        host = {a: self.spec.actions[a].to_env(x.cpu().numpy()) for a, x in actions.items()}
        for i, env in enumerate(self.envs):
            env.step_async({a: x[i * n: (i + 1) * n] for a, x in host.items()})
        obs, reward, terminated, truncated, infos = zip(*[env.step_wait() for env in self.envs], strict=True)
        reward = self._joined(reward, "reward")
        obs = self._joined(obs, "observation")
        env_done = self._cat([info["env_done"] for info in infos])
        ended = bool(env_done.any())
        final = self._joined([info["final_obs"] for info in infos], "observation") if ended else obs
        obs_t = self._tensors(obs)
        mask = self._masks(self._joined([info["action_mask"] for info in infos]))
        return TeamStep(obs_t, self._tensors(final) if ended else obs_t, mask,
                        self._masks(self._joined([info["final_action_mask"] for info in infos])) if ended else mask,
                        reward, self._joined(terminated), self._joined(truncated),
                        self._joined([info["acted"] for info in infos]),
                        self._joined([info["alive"] for info in infos]), env_done)

    def _cat(self, parts: list[np.ndarray]) -> np.ndarray:
        return parts[0] if self.k == 1 else np.concatenate(parts)

    def _joined(self, parts: list[dict[str, Any]], what: str | None = None) -> dict[str, Any]:
        """Every member's per-agent arrays as the group's (None stays None); checked for non-finite values
        (in a checked group) when `what` names them."""
        out = {a: None if v is None else self._cat([p[a] for p in parts]) for a, v in parts[0].items()}
        if self.checked and what is not None and _bad(out):  # which member: only once something is wrong
            for slot, part in zip(self.slots, parts, strict=True):
                if _bad(part):
                    raise NonFiniteError(None, slot, what, self.t, "env step")
        return out

    def _tensors(self, obs: AgentArrays) -> Obs:
        return self.spec.to_tensors(obs, self.device)

    def _masks(self, masks: dict[str, np.ndarray | None]) -> AgentMasks:
        return {a: None if m is None else torch.as_tensor(m, device=self.device) for a, m in masks.items()}
