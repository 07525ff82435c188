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


_F32 = np.finfo(np.float32)
_CHUNK = 1 << 20  # elements checked at a time: the check's temporaries stay a few MB, whatever the array's size


def check_finite(arr: np.ndarray, key: str, where: str) -> None:
    """A DatasetError naming `where` (the file), `key` and the first row holding a value that is not finite *as
    float32* (NaN, ±Inf, or a finite float64 beyond float32's range, which training's float32 cast would turn into
    ±Inf) in a float `arr` (integer and bool arrays are always finite). A NaN reward or observation would train
    every member on NaN. Checked a chunk at a time, so the check costs a few MB whatever the array's size."""
    if arr.dtype.kind != "f" or arr.size == 0:
        return
    flat = arr.reshape(-1)
    wide = arr.dtype.itemsize > 4  # float64 (or longer): its finite values can still overflow float32
    first, count = -1, 0
    for start in range(0, flat.size, _CHUNK):
        chunk = flat[start:start + _CHUNK]
        if wide:
            with np.errstate(over="ignore", invalid="ignore"):
                bad = ~np.isfinite(chunk.astype(np.float32))
        else:
            bad = ~np.isfinite(chunk)
        n = int(np.count_nonzero(bad))
        if n and first < 0:
            first = start + int(np.argmax(bad))  # argmax of a bool array: the first True
        count += n
    if first < 0:
        return
    index = np.unravel_index(first, arr.shape)
    value = float(flat[first])
    what = "NaN or ±Inf" if not wide else f"NaN, ±Inf or beyond float32's range ±{float(_F32.max):.4g}"
    raise DatasetError(f"{where}: key {key!r} holds {count:,} non-finite value(s) ({what}), the first at row "
                       f"{int(index[0])} (index {tuple(int(i) for i in index)}: {value!r}); a dataset must hold "
                       f"numbers finite as float32, the dtype training uses, so fix or drop those rows")
