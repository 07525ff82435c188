"""A dataset as flat arrays of transitions, whatever file format it came from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agilerl_core.errors import DatasetError


@dataclass
class Transitions:
    """N transitions in the env's own scale (actions as the env takes them).

    ``timeouts`` marks the last transition of an episode cut by a time limit (it still bootstraps from
    ``next_observations``); ``terminals`` marks one that ended the episode.
    """

    observations: np.ndarray  # [N, *obs_shape]
    actions: np.ndarray  # [N] ints or [N, *action_shape] floats
    rewards: np.ndarray  # [N] float32
    next_observations: np.ndarray  # [N, *obs_shape]
    terminals: np.ndarray  # [N] bool
    timeouts: np.ndarray  # [N] bool

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    def episode_returns(self) -> np.ndarray:
        """Undiscounted returns of the episodes that end in the dataset (a trailing partial one is left out)."""
        ends = np.flatnonzero(self.terminals | self.timeouts)
        if ends.size == 0:
            return np.zeros(0)
        total = np.concatenate([[0.0], np.cumsum(self.rewards, dtype=np.float64)])
        starts = np.concatenate([[0], ends[:-1] + 1])
        return total[ends + 1] - total[starts]

    def stats(self) -> dict:
        """Size and return statistics (what `agilerl-flow dataset info` prints)."""
        rets = self.episode_returns()
        out = {"transitions": len(self), "episodes": int(rets.size),
               "observation_shape": list(self.observations.shape[1:]),
               "observation_dtype": str(self.observations.dtype),
               "action_shape": list(self.actions.shape[1:]), "action_dtype": str(self.actions.dtype),
               "terminals": int(self.terminals.sum()), "timeouts": int(self.timeouts.sum())}
        if rets.size:
            out.update(return_mean=round(float(rets.mean()), 3), return_std=round(float(rets.std()), 3),
                       return_min=round(float(rets.min()), 3), return_max=round(float(rets.max()), 3))
        return out


def concatenate(parts: list[Transitions]) -> Transitions:
    """One Transitions holding `parts` in order."""
    if len(parts) == 1:
        return parts[0]
    return Transitions(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                         ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")))


def from_episodes(episodes: list[dict[str, np.ndarray]]) -> Transitions:
    """Flat transitions of whole episodes, each {observations [T+1], actions, rewards, terminations,
    truncations [T]} (the layout Minari stores and the collector records)."""
    term = np.concatenate([e["terminations"] for e in episodes]).astype(bool)
    trunc = np.concatenate([e["truncations"] for e in episodes]).astype(bool)
    return Transitions(np.concatenate([e["observations"][:-1] for e in episodes]),
                       np.concatenate([e["actions"] for e in episodes]),
                       np.concatenate([e["rewards"] for e in episodes]).astype(np.float32),
                       np.concatenate([e["observations"][1:] for e in episodes]), term, trunc & ~term)


def check_finite(arr: np.ndarray, key: str, where: str) -> None:
    """A DatasetError naming `where` (the file), `key` and the first row holding NaN or ±Inf in a float `arr`
    (integer and bool arrays are always finite). A NaN reward or observation would train every member on NaN."""
    if arr.dtype.kind != "f" or arr.size == 0:
        return
    bad = ~np.isfinite(arr)
    if not bad.any():
        return
    first = np.unravel_index(int(np.argmax(bad)), arr.shape)  # argmax of a bool array: the first True
    count = int(bad.sum())
    raise DatasetError(f"{where}: key {key!r} holds {count:,} non-finite value(s) (NaN or ±Inf), the first at "
                       f"row {int(first[0])} (index {tuple(int(i) for i in first)}: {float(arr[first])}); a dataset must "
                       f"hold finite numbers (a reward beyond float32's range counts too), so fix or drop those rows")
