"""Flat HDF5 datasets (the D4RL layout): one array per field, one row per transition.

Required keys: ``observations`` [N, ...], ``actions`` [N] or [N, ...], ``rewards`` [N], ``terminals`` [N].
Optional: ``timeouts`` [N] (an episode cut by a time limit) and ``next_observations`` [N, ...].

Without ``next_observations`` the next observation of row i is row i+1 of the same episode: a terminal
row needs none (it does not bootstrap), and rows whose successor is unknown (a timeout, the last row)
are dropped, as D4RL's loaders do. File attributes ``env_id`` and ``source`` are informational.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agilerl_core.data.transitions import Transitions
from agilerl_core.errors import DatasetError

REQUIRED = ("observations", "actions", "rewards", "terminals")


def _open(path: Path):
    import h5py

    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise DatasetError(f"dataset {path}: file not found; record one with `agilerl-flow dataset collect` "
                           f"or fix dataset.uri") from None
    except OSError as err:
        raise DatasetError(f"dataset {path}: not a readable HDF5 file ({err}); it may be truncated or corrupt, "
                           f"so download or record it again") from None


def _read(f, key: str, path: Path) -> np.ndarray:
    try:
        return f[key][()]
    except (OSError, KeyError, ValueError) as err:
        raise DatasetError(f"dataset {path}: key {key!r} cannot be read ({err}); the file is truncated or "
                           f"corrupt, so download or record it again") from None


def read_hdf5(path: str | Path) -> tuple[Transitions, dict]:
    """(transitions, file attributes) of a flat HDF5 dataset; a DatasetError names any bad key."""
    import h5py

    path = Path(path)
    with _open(path) as f:
        missing = [k for k in REQUIRED if k not in f or not isinstance(f[k], h5py.Dataset)]
        if missing:
            raise DatasetError(f"dataset {path}: missing key(s) {missing}; a flat HDF5 dataset needs "
                               f"{list(REQUIRED)} (optional: timeouts, next_observations); found {sorted(f.keys())}")
        keys = [*REQUIRED, *(k for k in ("timeouts", "next_observations") if k in f)]
        data = {k: _read(f, k, path) for k in keys}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v)
                 for k, v in f.attrs.items()}
    return from_arrays(data, str(path)), attrs


def from_arrays(data: dict[str, np.ndarray], where: str) -> Transitions:
    """Check the D4RL-style arrays (names as in the file) and build transitions."""
    obs = data["observations"]
    n = obs.shape[0] if obs.ndim else 0
    if obs.ndim == 0:
        raise DatasetError(f"dataset {where}: key 'observations' has shape {obs.shape}; expected [N, ...]")
    if n == 0:
        raise DatasetError(f"dataset {where}: key 'observations' holds no rows; the dataset is empty")
    for key in ("actions", "rewards", "terminals", "timeouts", "next_observations"):
        if key in data and (data[key].ndim == 0 or data[key].shape[0] != n):
            raise DatasetError(f"dataset {where}: key {key!r} has {data[key].shape[0] if data[key].ndim else 0} "
                               f"rows but 'observations' has {n}; every key needs one row per transition")
    for key in ("rewards", "terminals", "timeouts"):
        if key in data and data[key].ndim != 1:
            raise DatasetError(f"dataset {where}: key {key!r} has shape {data[key].shape}; expected [N]")
    if "next_observations" in data and data["next_observations"].shape != obs.shape:
        raise DatasetError(f"dataset {where}: key 'next_observations' has shape {data['next_observations'].shape}, "
                           f"'observations' has {obs.shape}; they must match")
    rewards = data["rewards"].astype(np.float32, copy=False)
    terminals = data["terminals"].astype(bool, copy=False)
    timeouts = data["timeouts"].astype(bool, copy=False) if "timeouts" in data else np.zeros(n, bool)
    timeouts = timeouts & ~terminals
    if "next_observations" in data:
        return Transitions(obs, data["actions"], rewards, data["next_observations"], terminals, timeouts)
    nxt = np.empty_like(obs)
    nxt[:-1] = obs[1:]
    nxt[terminals] = obs[terminals]  # never bootstrapped from
    keep = terminals.copy()
    keep[:-1] |= ~timeouts[:-1]  # a timeout's successor is the next episode's first observation
    if keep.all():
        return Transitions(obs, data["actions"], rewards, nxt, terminals, timeouts)
    # the row before a dropped timeout ends its episode for return statistics: mark it as cut
    cut = np.zeros(n, bool)
    cut[:-1] = timeouts[1:] & ~keep[1:]
    timeouts = (timeouts | cut)[keep]
    return Transitions(obs[keep], data["actions"][keep], rewards[keep], nxt[keep], terminals[keep], timeouts)


def write_hdf5(path: str | Path, t: Transitions, attrs: dict | None = None) -> Path:
    """Write `t` as a flat HDF5 dataset (contiguous, uncompressed: reading is a copy) atomically."""
    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with h5py.File(tmp, "w") as f:
        for key, value in (("observations", t.observations), ("actions", t.actions), ("rewards", t.rewards),
                           ("next_observations", t.next_observations), ("terminals", t.terminals),
                           ("timeouts", t.timeouts)):
            f.create_dataset(key, data=value)
        for k, v in (attrs or {}).items():
            f.attrs[k] = v
    tmp.replace(path)
    return path
