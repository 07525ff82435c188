"""On-policy rollouts: what a PPO member collects from its own envs, and GAE over them.

Generalised advantage estimation (Schulman et al., ICLR 2016) over T steps of N vectorised envs::

    delta_t = r_t + gamma * V(s_{t+1}) * (1 - done_t) - V(s_t)
    A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},      returns_t = A_t + V(s_t)

with V(s_T) the value of the observation after the last step. An episode cut by a time limit
(truncated) still has a future: its reward is credited with gamma * V(final observation) when the
step is collected (:meth:`Rollout.bootstrap_truncated`), and done_t stops the recursion at the
episode boundary either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agilerl_core.envs.spaces import Obs


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, last_value: torch.Tensor,
                gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each [T, N], from rewards/values/dones [T, N] and last_value [N]."""
    steps = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    next_adv = torch.zeros_like(last_value)
    next_value = last_value
    for t in range(steps - 1, -1, -1):
        alive = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * alive - values[t]
        next_adv = delta + gamma * lam * alive * next_adv
        adv[t] = next_adv
        next_value = values[t]
    return adv, adv + values


@dataclass
class Rollout:
    """T steps x N envs of one member's experience (obs as stored tensors)."""

    obs: dict[str, torch.Tensor]  # key -> [T, N, ...]
    actions: torch.Tensor  # [T, N] (discrete) or [T, N, dim]
    logprobs: torch.Tensor  # [T, N]
    rewards: torch.Tensor  # [T, N]
    dones: torch.Tensor  # [T, N] terminated or truncated
    values: torch.Tensor  # [T, N]
    masks: torch.Tensor | None = None  # [T, N, A] action masks (discrete, when the env gives them)
    # recurrent members: each network's state before the step [T, N, layers, S, H], and whether the step began
    # an episode [T, N] (the state is zeroed before it)
    states: dict[str, torch.Tensor] | None = None
    starts: torch.Tensor | None = None
    critic_obs: dict[str, torch.Tensor] | None = None  # a centralised critic's input (MAPPO) [T, N, ...]

    @classmethod
    def allocate(cls, steps: int, num_envs: int, obs: Obs, action_shape: tuple[int, ...],
                 action_dtype: torch.dtype, mask_dim: int | None = None) -> Rollout:
        return cls({k: torch.zeros((steps, *v.shape), dtype=v.dtype) for k, v in obs.items()},
                   torch.zeros((steps, num_envs, *action_shape), dtype=action_dtype),
                   torch.zeros(steps, num_envs), torch.zeros(steps, num_envs), torch.zeros(steps, num_envs),
                   torch.zeros(steps, num_envs),
                   None if mask_dim is None else torch.ones(steps, num_envs, mask_dim, dtype=torch.bool))

    def with_states(self, shapes: dict[str, tuple[int, ...]]) -> Rollout:
        """Room for recurrent states (`shapes`: each network's state shape per env, (layers, S, H))."""
        steps, n = self.rewards.shape
        self.states = {k: torch.zeros(steps, n, *shape) for k, shape in shapes.items()}
        self.starts = torch.zeros(steps, n, dtype=torch.bool)
        return self

    def sequences(self, steps: int, seq_len: int, advantages: torch.Tensor, returns: torch.Tensor
                  ) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """The first `steps` rows cut into sequences of `seq_len` steps per env (the last ones shorter, padded),
        for truncated backpropagation through time: (fields [S, L, ...] with ``valid`` [S, L] marking real
        steps, ``starts`` [S, L] and each network's state before the sequence ``state/<name>`` [S, ...];
        advantages [S, L]; returns [S, L]). Sequences are ordered chunk-major (chunk c of every env, then c + 1)."""
        chunks = -(-steps // seq_len)
        pad = chunks * seq_len - steps

        def cut(x: torch.Tensor) -> torch.Tensor:  # [T, N, ...] -> [chunks * N, L, ...]
            x = x[:steps]
            if pad:
                x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
            x = x.view(chunks, seq_len, *x.shape[1:]).transpose(1, 2)
            return x.reshape(-1, seq_len, *x.shape[3:])

        valid = cut(torch.ones(steps, self.rewards.shape[1], dtype=torch.bool))
        out = {"obs": {k: cut(v) for k, v in self.obs.items()}, "actions": cut(self.actions),
               "logprobs": cut(self.logprobs), "values": cut(self.values), "valid": valid,
               "starts": cut(self.starts)}
        if self.masks is not None:
            out["masks"] = cut(self.masks)
        first = torch.arange(chunks) * seq_len
        for k, st in self.states.items():
            out[f"state/{k}"] = st[first].reshape(-1, *st.shape[2:])
        return out, cut(advantages), cut(returns)

    def flat(self, steps: int) -> dict[str, torch.Tensor | dict[str, torch.Tensor]]:
        """The first `steps` rows with T and N merged (what the minibatches index)."""
        def f(x: torch.Tensor) -> torch.Tensor:
            return x[:steps].reshape(-1, *x.shape[2:])
        out = {"obs": {k: f(v) for k, v in self.obs.items()}, "actions": f(self.actions),
               "logprobs": f(self.logprobs), "values": f(self.values)}
        if self.masks is not None:
            out["masks"] = f(self.masks)
        if self.critic_obs is not None:
            out["critic_obs"] = {k: f(v) for k, v in self.critic_obs.items()}
        return out


def members_rows(x: torch.Tensor, steps: int) -> torch.Tensor:
    """A group's rollout field [T, K, N, ...] as each member's rows [K, steps * N, ...] (step-major, then env: the
    order of :meth:`Rollout.flat`)."""
    k, n = x.shape[1], x.shape[2]
    return x[:steps].transpose(0, 1).reshape(k, steps * n, *x.shape[3:])
