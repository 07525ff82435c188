"""A member acting alone, at the edges: :class:`~agilerl_core.api.policy.Policy.predict`, dataset collection, the
MLflow model. There is no agent-level policy beside the group's: a member acts through its group of one's greedy
forward, the one evaluation runs (the group's maths at K = 1)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class Acting:
    """The greedy actions of one member that does not train meanwhile (a loaded or finished member): its group of
    one, built once, acting on a batch of envs (one row each). A recurrent member's state carries from call to call
    until :meth:`reset` starts episodes again, or the batch size changes (every env then starts afresh)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.group = type(agent).group([agent])
        self.team = hasattr(agent, "env_actions")  # a multi-agent team: observations and actions keyed by agent
        self._envs: int | None = None
        self._starts: torch.Tensor | None = None

    @torch.no_grad()
    def greedy(self, obs: dict, mask: Any = None) -> Any:
        """The member's greedy actions, agent scale, for a batch of observations (tensors on its device, as
        ``spec.to_tensors`` gives them): an array [N(, A)] (`mask`: [N, A] allowed actions), or for a team a dict
        of them keyed by agent (`mask`: a dict of masks, or None)."""
        n = _batch(obs)
        if n != self._envs:  # fresh envs: a recurrent state, noise processes start at 0
            self.group.begin_acting(n)
            self._envs, self._starts = n, None
        device = self.agent.device
        if self.team:
            masks = {a: None if m is None else torch.as_tensor(np.asarray(m), dtype=torch.bool, device=device)
                     for a, m in (mask or {}).items()}
            return {a: v.cpu().numpy() for a, v in self.group.greedy(obs, masks).items()}
        m = None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.bool, device=device)
        starts = torch.zeros(1, n, dtype=torch.bool, device=device) if self._starts is None else self._starts.view(1, n)
        self._starts = None
        return self.group.greedy(obs, m, starts)[0].cpu().numpy()

    def env_action(self, obs: dict, mask: Any = None) -> Any:
        """:meth:`greedy` as the env takes the actions (a Box's bounds applied; a team's per agent)."""
        actions = self.greedy(obs, mask)
        return self.agent.env_actions(actions) if self.team else self.agent.action_spec.to_env(actions)

    def reset(self, done: np.ndarray | None = None) -> None:
        """New episodes: every env's (`done` None) or those where `done` [N] is set (after a step)."""
        if done is None or self._envs is None:
            self._envs = None
            return
        ended = torch.as_tensor(np.asarray(done, dtype=bool), device=self.agent.device)
        self._starts = ended if self._starts is None else self._starts | ended


def _batch(obs: dict) -> int:
    """The number of rows of a batch of observations (a dict of tensors, or of dicts of tensors for a team)."""
    first = next(iter(obs.values()))
    return _batch(first) if isinstance(first, dict) else int(first.shape[0])
