"""A member acting alone, at the edges: :class:`~agilerl_core.api.policy.Policy.predict`, dataset collection, the
MLflow model. There is no agent-level policy beside the group's: a member acts through its group of one, greedily
(the forward evaluation runs) or exploring (the draws its training takes), the group's maths at K = 1."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class Acting:
    """The actions of one member that does not train meanwhile (a loaded or finished member) in a batch of envs
    (one row each), through its group of one, built once: greedy, or with `explore` drawn from the member's
    training exploration (each algorithm's ``explore_group``) with a key a copy of the member's generator gives,
    so the draws are reproducible (the same member, or its checkpoint loaded, draws the same sequence) and the
    member's own stream, what its training draws next, is left as it was. A recurrent member's state and noise
    processes carry from call to call until :meth:`reset` starts episodes again, or the batch size changes (every
    env then starts afresh)."""

    def __init__(self, agent: Any, explore: bool = False) -> None:
        self.agent, self.explore = agent, explore
        self.team = hasattr(agent, "env_actions")  # a multi-agent team: observations and actions keyed by agent
        self.units = hasattr(agent, "learners")  # an ippo/mappo team: a stacked group per policy unit
        members = list(agent.learners.values()) if self.units else [agent]
        own = [m.torch_gen for m in members]
        try:
            if explore:  # the group's phase key from a copy of each generator
                for m, gen in zip(members, own, strict=True):
                    m.torch_gen = torch.Generator(device=gen.device)
                    m.torch_gen.set_state(gen.get_state())
            self.group = type(agent).group([agent])
            if explore:
                for stack in self._stacks():
                    stack.begin_phase()
        finally:
            for m, gen in zip(members, own, strict=True):
                m.torch_gen = gen
        self._envs: int | None = None
        self._starts: torch.Tensor | None = None  # [N]: envs whose episode begins at the next call

    def _stacks(self) -> list[Any]:
        """The stacked groups that act: the group, or an ippo/mappo team's policy units."""
        return list(self.group.units.values()) if self.units else [self.group]

    @torch.no_grad()
    def actions(self, obs: dict, mask: Any = None) -> Any:
        """The member's actions, agent scale, for a batch of observations (tensors on its device, as
        ``spec.to_tensors`` gives them): an array [N(, A)] (`mask`: [N, A] allowed actions), or for a team a dict
        of them keyed by agent (`mask`: a dict of masks, or None)."""
        n = _batch(obs)
        if n != self._envs:  # fresh envs: a recurrent state, noise processes start at 0
            for stack in self._stacks():
                stack.begin_acting(n)
            self._envs, self._starts = n, None
        device, group = self.agent.device, self.group
        starts = torch.zeros(1, n, dtype=torch.bool, device=device) if self._starts is None else self._starts.view(1, n)
        self._starts = None
        if self.team:
            masks = {a: torch.as_tensor(np.asarray(m), dtype=torch.bool, device=device)
                     for a, m in (mask or {}).items() if m is not None}
            if not self.explore:
                out = group.greedy(obs, masks)
            elif self.units:  # each policy unit draws for its agents' rows
                out = {}
                for u, unit in group.units.items():
                    first = group.unit_agents[u][0]
                    m = None if masks.get(first) is None else group.rows(u, masks).flatten(0, 1)
                    out.update(group.per_agent(u, unit.explore_group({"obs": group.rows(u, obs).flatten(0, 1)}, m)))
            else:
                out = group.explore_group(obs, masks)
            return {a: v.cpu().numpy() for a, v in out.items()}
        m = None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.bool, device=device)
        if not self.explore:
            out = group.greedy(obs, m, starts)
        elif getattr(group, "rnn", None) is not None:
            out = group.explore_group(obs, m, starts)
        else:
            out = group.explore_group(obs, m)
        return out[0].cpu().numpy()

    def env_action(self, obs: dict, mask: Any = None) -> Any:
        """:meth:`actions` as the env takes them (a Box's bounds applied; a team's per agent)."""
        actions = self.actions(obs, mask)
        return self.agent.env_actions(actions) if self.team else self.agent.action_spec.to_env(actions)

    def reset(self, done: np.ndarray | None = None) -> None:
        """New episodes: every env's (`done` None) or those where `done` [N] is set (after a step)."""
        if done is None or self._envs is None:
            self._envs = None
            return
        ended = torch.as_tensor(np.asarray(done, dtype=bool), device=self.agent.device)
        self._starts = ended if self._starts is None else self._starts | ended
        if self.explore and hasattr(self.group, "episodes_done"):  # noise processes restart those envs
            self.group.episodes_done(ended.view(1, -1))


def _batch(obs: dict) -> int:
    """The number of rows of a batch of observations (a dict of tensors, or of dicts of tensors for a team)."""
    first = next(iter(obs.values()))
    return _batch(first) if isinstance(first, dict) else int(first.shape[0])
