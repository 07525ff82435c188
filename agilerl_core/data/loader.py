"""Load a dataset URI, check it against the env it will be evaluated in, fill a replay buffer in bulk."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

from agilerl_core.buffers.replay import ReplayBuffer, Shard, transition_fields
from agilerl_core.data.fetch import LocalDataset, resolve_dataset
from agilerl_core.data.hdf5 import read_hdf5
from agilerl_core.data.minari_format import is_minari_dir, read_minari
from agilerl_core.data.transitions import Transitions
from agilerl_core.envs.spaces import ActionSpec, ObsSpec
from agilerl_core.errors import DatasetError
from agilerl_core.io.files import quote
from agilerl_core.io.storage import S3Options
from agilerl_core.limits import Limits, applied


@dataclass
class Dataset:
    """A loaded dataset and where it came from."""

    transitions: Transitions
    local: LocalDataset
    format: str  # "hdf5" or "minari"
    info: dict = field(default_factory=dict)  # file attributes / Minari metadata (env_id, source...)

    @property
    def uri(self) -> str:
        return self.local.uri

    @property
    def sha256(self) -> str:
        return self.local.sha256

    def describe(self) -> dict:
        """Size, spaces, return statistics and provenance (JSON-able)."""
        return {"uri": self.uri, "format": self.format, "sha256": self.sha256, "local_path": str(self.local.path),
                "env_id": self.info.get("env_id"), **self.transitions.stats()}


def read_local(path: Path, fmt: str = "auto") -> tuple[Transitions, dict, str]:
    """(transitions, info, format) of a local dataset file or Minari directory."""
    if fmt == "auto":
        fmt = "minari" if path.is_dir() else "hdf5"
    if fmt == "minari":
        if not is_minari_dir(path):
            raise DatasetError(f"dataset {path}: not a Minari dataset directory (no data/metadata.json); set "
                               f"dataset.format: hdf5 for a flat file")
        t, info = read_minari(path)
    else:
        if path.is_dir():
            raise DatasetError(f"dataset {path}: is a directory; a flat HDF5 dataset is one file (set "
                               f"dataset.format: minari for a Minari dataset directory)")
        t, info = read_hdf5(path)
    return t, info, fmt


def load_dataset(uri: str, fmt: str = "auto", s3: S3Options | None = None, cache_dir: str | None = None,
                 limits: Limits | dict | None = None) -> Dataset:
    """Resolve `uri` (downloading s3:// once into the cache) and read it; declared array sizes are checked
    against `limits` (a config's ``limits``; None: the ones in force) before anything is read."""
    local = resolve_dataset(uri, s3, cache_dir)
    with applied(limits):
        t, info, fmt = read_local(local.path, fmt)
    return Dataset(t, local, fmt, info)


def check_fits(ds: Dataset, env_id: str, obs_space: spaces.Space, act_space: spaces.Space) -> None:
    """A DatasetError naming the key when the dataset's observations or actions do not fit the env.
    Fitting action layouts are normalised in place: [N, 1] discrete actions to [N], integral floats to
    int64, [N] actions of a one-dimensional Box to [N, 1]."""
    t = ds.transitions
    where = f"dataset {ds.uri}"
    recorded = ds.info.get("env_id")  # informational: any plain value a file's attribute holds, quoted bounded
    recorded = recorded if isinstance(recorded, str) and len(recorded) <= 200 else quote(recorded)
    made = f" (it was recorded on {recorded})" if ds.info.get("env_id") not in (None, env_id) else ""
    if isinstance(obs_space, spaces.Discrete):
        want: tuple[int, ...] = ()
    elif isinstance(obs_space, spaces.Box):
        want = tuple(obs_space.shape)
    else:
        raise DatasetError(f"{where}: {env_id} has a {type(obs_space).__name__} observation space; offline "
                           f"training supports Box and Discrete observations")
    for key, arr in (("observations", t.observations), ("next_observations", t.next_observations)):
        if tuple(arr.shape[1:]) != want:
            raise DatasetError(f"{where}: key {key!r} holds observations of shape {tuple(arr.shape[1:])}, but "
                               f"{env_id} observes {want}{made}; use a dataset recorded on {env_id}")
    a = t.actions
    if isinstance(act_space, spaces.Discrete):
        if a.ndim == 2 and a.shape[1] == 1:
            a = t.actions = a[:, 0]
        if a.ndim != 1:
            raise DatasetError(f"{where}: key 'actions' has shape {a.shape}; {env_id} takes one discrete action "
                               f"per step, expected [N]{made}")
        if not np.issubdtype(a.dtype, np.integer):
            if not np.all(np.mod(a, 1) == 0):
                raise DatasetError(f"{where}: key 'actions' holds non-integer values; {env_id} has Discrete "
                                   f"actions{made}")
            a = t.actions = a.astype(np.int64)
        lo, hi = int(a.min()), int(a.max())
        if lo < int(act_space.start) or hi >= int(act_space.start) + int(act_space.n):
            raise DatasetError(f"{where}: key 'actions' ranges over [{lo}, {hi}], but {env_id} has "
                               f"{act_space.n} actions{made}")
    elif isinstance(act_space, spaces.Box):
        dim = int(np.prod(act_space.shape))
        if a.ndim == 1 and dim == 1:
            a = t.actions = a[:, None]
        if int(np.prod(a.shape[1:])) != dim or not np.issubdtype(a.dtype, np.floating):
            raise DatasetError(f"{where}: key 'actions' has shape {a.shape} ({a.dtype}); {env_id} takes float "
                               f"actions of shape {act_space.shape}{made}")
        low, high = act_space.low.reshape(-1), act_space.high.reshape(-1)
        flat = a.reshape(a.shape[0], -1)
        slack = 1e-3 * (high - low)
        if (flat < low - slack).any() or (flat > high + slack).any():
            raise DatasetError(f"{where}: key 'actions' leaves {env_id}'s bounds [{low.tolist()}, {high.tolist()}] "
                               f"(min {flat.min(0).tolist()}, max {flat.max(0).tolist()}){made}")
    else:
        raise DatasetError(f"{where}: {env_id} has a {type(act_space).__name__} action space; offline training "
                           f"supports Discrete and Box actions")


def to_shard(t: Transitions, obs_spec: ObsSpec, act: ActionSpec) -> Shard:
    """The buffer's fields for every transition at once (actions in the agent's scale)."""
    shard: Shard = {}
    for prefix, arr in (("obs", t.observations), ("next_obs", t.next_observations)):
        for k, v in obs_spec.to_tensors(arr).items():
            shard[f"{prefix}.{k}"] = v
    if act.discrete:
        shard["action"] = torch.as_tensor(t.actions).to(torch.int64)
    else:
        shard["action"] = torch.as_tensor(np.clip(act.from_env(t.actions), -1.0, 1.0), dtype=torch.float32)
    shard["reward"] = torch.as_tensor(t.rewards, dtype=torch.float32)
    shard["terminated"] = torch.as_tensor(t.terminals, dtype=torch.float32)
    return shard


def dataset_buffer(t: Transitions, obs_spec: ObsSpec, act: ActionSpec, device: str | torch.device = "cpu"
                   ) -> ReplayBuffer:
    """A replay buffer holding exactly the dataset (capacity = its size), filled in one bulk copy."""
    buffer = ReplayBuffer(transition_fields(obs_spec, None, act), len(t), device)
    buffer.extend(to_shard(t, obs_spec, act))
    return buffer
