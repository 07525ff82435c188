"""Helpers for stepping vector envs: the true next observation under same-step autoreset, action masks."""

from __future__ import annotations

import numpy as np


def real_next_obs(next_obs, info: dict, done: np.ndarray):
    """With same-step autoreset, the true next observation of a finished episode is in final_obs."""
    if not done.any():
        return next_obs
    final = info["final_obs"]
    idx = np.flatnonzero(done)
    if isinstance(next_obs, dict):
        real = {k: v.copy() for k, v in next_obs.items()}
        for i in idx:
            for k in real:
                real[k][i] = final[i][k]
        return real
    real = next_obs.copy()
    for i in idx:
        real[i] = final[i]
    return real


def action_masks(info: dict, num_envs: int, action_dim: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(mask for the observations returned, mask for the true next observations) from a vector info."""
    current = info.get("action_mask")
    if current is None:
        return None, None
    current = np.asarray(current, dtype=bool).reshape(num_envs, action_dim)
    nxt = current.copy()
    final = info.get("final_info")
    if final is not None and "action_mask" in final:
        has = np.asarray(final.get("_action_mask", np.zeros(num_envs, bool)), dtype=bool)
        for i in np.flatnonzero(has):
            nxt[i] = np.asarray(final["action_mask"][i], dtype=bool)
    return current, nxt
