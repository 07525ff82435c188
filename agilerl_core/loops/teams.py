"""What a group of teams' loops count on the host: each agent's running and finished returns per team, and
episode lengths (the multi-agent loops' :class:`TeamReturns`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class TeamReturns:
    """The returns of a group's teams, on the host: each agent's running return per sub-env and, per member, the
    summed returns of its finished episodes (rows member-major, as :class:`TeamStep` gives them)."""

    def __init__(self, agents: tuple[str, ...], k: int, n: int) -> None:
        self.k, self.n = k, n
        self.running = {a: np.zeros(k * n) for a in agents}
        self.finished = {a: np.zeros(k) for a in agents}
        self.count = np.zeros(k, dtype=np.int64)
        self.length, self.length_sum = np.zeros(k * n), np.zeros(k)  # episode lengths (env steps)

    def step(self, rewards: dict[str, np.ndarray], done: np.ndarray) -> None:
        ended = bool(done.any())
        for a, running in self.running.items():
            running += rewards[a]
            if ended:
                self.finished[a] += (running * done).reshape(self.k, self.n).sum(1)
                running[done] = 0.0
        self.length += 1.0
        if ended:
            self.count += done.reshape(self.k, self.n).sum(1)
            self.length_sum += (self.length * done).reshape(self.k, self.n).sum(1)
            self.length[done] = 0.0

    def mean_length(self, i: int) -> float:
        """Member i's mean episode length (nan if none finished)."""
        return float(self.length_sum[i] / self.count[i]) if self.count[i] else float("nan")

    def episodes(self, i: int) -> int:
        return int(self.count[i])

    def team(self, i: int, fitness: Callable[[dict[str, float]], float]) -> float:
        """Member i's team return over its finished episodes (each agent's mean, reduced by `fitness`); nan if
        none finished."""
        if not self.count[i]:
            return float("nan")
        return fitness({a: float(total[i] / self.count[i]) for a, total in self.finished.items()})
