"""n-step returns over vectorised envs (Sutton 1988; used by Rainbow, Hessel et al. 2018).

Every env step yields one single-step transition per sub-env. :class:`NStepCollector` holds the last
``n`` of them and emits, per sub-env, the transition that starts ``n`` steps back::

    (s_t, a_t, r_t, s_{t+L}, terminated_{t+L-1}, step_rewards = (r_t .. r_{t+L-1}, 0 ..), length = L)

with ``L = n``. The return ``sum_{k<L} gamma^k r_{t+k}`` and the bootstrap discount ``gamma^L`` are formed by
each learner at its own gamma (:func:`agilerl_core.buffers.replay.n_step_return`): members share the buffer
while their gamma evolves apart, so no collector's gamma is baked into what is stored.

When a sub-env's episode ends (terminated or truncated) every pending transition of that sub-env is emitted
at once with the horizon that is left (``L < n``), so no return ever reaches across an episode boundary; a
truncated episode bootstraps from its final observation as usual (terminated = 0). :meth:`flush` does the
same for every sub-env at the end of a training phase. Each single-step transition starts exactly one n-step
transition, so the count is unchanged.

Output order is deterministic: longest horizon first, then sub-env index.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

# fields taken from the first step of a window; every other field except reward comes from the last
_START_FIELDS = ("action",)


def _is_start(key: str) -> bool:
    return key.startswith("obs.") or key in _START_FIELDS


class NStepCollector:
    """Turns per-step batched transitions (leading dim = num_envs) into n-step transitions."""

    def __init__(self, num_envs: int, n: int) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        self.num_envs, self.n = num_envs, n
        self.history: deque[dict[str, torch.Tensor]] = deque(maxlen=n)
        self.age = np.zeros(num_envs, dtype=np.int64)  # pending single-step transitions per sub-env
        self.emitted = np.zeros(0, dtype=np.int64)  # the sub-env of each transition last emitted

    def _window(self, length: int, envs: np.ndarray) -> dict[str, torch.Tensor]:
        """The transitions of `envs` whose window is the last `length` steps."""
        idx = torch.as_tensor(envs, dtype=torch.int64)
        first, last = self.history[-length], self.history[-1]
        out = {k: (first[k] if _is_start(k) else last[k]).index_select(0, idx) for k in last if k != "reward"}
        steps = torch.zeros((len(envs), self.n), dtype=torch.float32)
        for k in range(length):
            steps[:, k] = self.history[-length + k]["reward"].index_select(0, idx)
        out["reward"] = steps[:, 0].clone()
        out["step_rewards"] = steps
        out["length"] = torch.full((len(envs),), float(length), dtype=torch.float32)
        return out

    def _emit(self, plan: list[tuple[int, np.ndarray]]) -> dict[str, torch.Tensor] | None:
        parts = [self._window(length, envs) for length, envs in plan if len(envs)]
        self.emitted = np.concatenate([envs for _, envs in plan]) if plan else np.zeros(0, np.int64)
        if not parts:
            return None
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    def split(self, out: dict[str, torch.Tensor] | None, k: int) -> list[dict[str, torch.Tensor] | None]:
        """The transitions just emitted (`out`, from :meth:`push` or :meth:`flush`) of a collector over a group's
        K x N sub-envs (member-major), per member: each member's in the order its own collector would give."""
        if out is None:
            return [None] * k
        member = self.emitted // (self.num_envs // k)
        rows = [np.flatnonzero(member == i) for i in range(k)]
        return [None if not len(r) else {key: v.index_select(0, torch.as_tensor(r, device=v.device))
                                         for key, v in out.items()} for r in rows]

    def push(self, data: dict[str, torch.Tensor], done: np.ndarray) -> dict[str, torch.Tensor] | None:
        """Add one vector step; return the n-step transitions it completes (None when none)."""
        self.history.append(data)
        self.age += 1
        done = np.asarray(done, dtype=bool)
        full = (self.age >= self.n) & ~done
        plan = []
        for length in range(self.n, 0, -1):
            ends = done & (self.age >= length)
            if length == self.n:
                ends = ends | full
            plan.append((length, np.flatnonzero(ends)))
        self.age[full] -= 1
        self.age[done] = 0
        return self._emit(plan)

    def flush(self) -> dict[str, torch.Tensor] | None:
        """Emit every pending transition (each bootstraps from the last observation seen)."""
        if not self.history:
            return None
        plan = [(length, np.flatnonzero(self.age >= length)) for length in range(self.n, 0, -1)]
        self.age[:] = 0
        return self._emit(plan)
