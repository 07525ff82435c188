"""Minari datasets (https://minari.farama.org, format of Minari 0.5 with ``data_format: hdf5``).

A dataset is a directory ``<root>/<dataset_id>/data/`` holding ``metadata.json`` (spaces, env spec,
counts) and ``main_data.hdf5`` with one group per episode: ``observations`` [T+1, ...], ``actions`` [T],
``rewards``, ``terminations``, ``truncations`` [T]. Reading goes straight to the HDF5 file with h5py (one
slice per episode, no per-step Python), so loading needs no Minari install; writing uses Minari's own
``create_dataset_from_buffers`` (the ``minari`` extra) so that Minari reads what we write.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from agilerl_core.data.hdf5 import FileBudget, check_array, load_array, open_hdf5, own_bytes
from agilerl_core.data.transitions import Transitions, check_finite, from_episodes
from agilerl_core.errors import DatasetError
from agilerl_core.io.files import quote

DATA = "data"
EPISODE_KEYS = ("observations", "actions", "rewards", "terminations", "truncations")


def datasets_root() -> Path:
    """$MINARI_DATASETS_PATH, else Minari's default ~/.minari/datasets."""
    return Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")


def is_minari_dir(path: Path) -> bool:
    """Whether `path` holds ``data/metadata.json`` (whatever it is: :func:`read_minari` refuses one that is no
    regular file, naming what it is, rather than calling the directory no Minari dataset)."""
    return os.path.lexists(Path(path) / DATA / "metadata.json")


def read_minari(path: str | Path) -> tuple[Transitions, dict]:
    """(transitions, metadata) of the Minari dataset directory `path`."""
    import h5py

    path = Path(path)
    meta_file, data_file = path / DATA / "metadata.json", path / DATA / "main_data.hdf5"
    if not os.path.lexists(meta_file):
        raise DatasetError(f"dataset {path}: not a Minari dataset directory (no {DATA}/metadata.json)")
    try:
        from agilerl_core.io.records import read_record

        meta = read_record(meta_file, f"dataset {meta_file}", error=DatasetError)  # size, depth, digits limits
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as err:
        raise DatasetError(f"dataset {meta_file}: metadata is not valid JSON ({err}); download it again") from None
    if not isinstance(meta, dict):
        raise DatasetError(f"dataset {meta_file}: metadata is a JSON {type(meta).__name__}, not an object; "
                           f"download it again")
    fmt = meta.get("data_format", "hdf5")
    if fmt != "hdf5":
        raise DatasetError(f"dataset {path}: metadata data_format is {fmt!r}; only Minari's 'hdf5' format is read "
                           f"(re-create the dataset with data_format='hdf5')")
    f, size = open_hdf5(data_file)  # a regular file only: h5py would block forever on a FIFO
    with f:
        own_bytes(f, data_file)  # before any key is looked up: `in` and f[key] would follow links
        names = [k for k in f if k.startswith("episode_")]
        odd = [k for k in names if not re.fullmatch(r"episode_(0|[1-9][0-9]*)", k)]
        if odd:
            raise DatasetError(f"dataset {data_file}: group(s) {quote(odd[:3])} are not named episode_<number>; "
                               f"Minari names episodes episode_0, episode_1, ...")
        names.sort(key=lambda k: (len(k), k))  # numeric order without int() of an arbitrarily long name
        if not names:
            raise DatasetError(f"dataset {data_file}: no episode_* groups; the dataset is empty")
        budget = FileBudget(data_file, size)
        sizes = []
        for name in names:  # every array of every episode checked (and charged to the file) before any is read
            g = f[name]
            if not isinstance(g, h5py.Group):
                raise DatasetError(f"dataset {data_file}: {name!r} is not a group; Minari stores one group per episode")
            for key in EPISODE_KEYS:
                if key not in g:
                    raise DatasetError(f"dataset {data_file}: episode {name!r} lacks key {key!r}")
                if not isinstance(g[key], h5py.Dataset):
                    raise DatasetError(f"dataset {data_file}: {name}/{key} is a group (a Dict or Tuple space); "
                                       f"offline training reads Box and Discrete spaces only")
            sizes.append({k: check_array(g[k], f"{name}/{k}", data_file, size, budget) for k in EPISODE_KEYS})
        episodes = []
        for name, nbytes in zip(names, sizes, strict=True):
            g = f[name]
            ep = {k: load_array(g[k], f"{name}/{k}", data_file, n) for k, n in nbytes.items()}
            if any(a.ndim == 0 for a in ep.values()):
                raise DatasetError(f"dataset {data_file}: episode {name!r} holds a scalar where Minari stores one "
                                   f"row per step; download it again")
            for k in ("observations", "actions", "rewards"):  # finite as float32, the dtype training uses
                check_finite(ep[k], f"{name}/{k}", f"dataset {data_file}")
            t = ep["rewards"].shape[0]
            if ep["observations"].shape[0] != t + 1 or any(ep[k].shape[0] != t for k in ep if k != "observations"):
                raise DatasetError(f"dataset {data_file}: episode {name!r} has {ep['observations'].shape[0]} "
                                   f"observations for {t} steps; Minari stores T+1 observations for T actions, "
                                   f"rewards, terminations and truncations")
            episodes.append(ep)
    trans = from_episodes(episodes)
    check_finite(trans.rewards, "rewards", f"dataset {data_file}")  # finite float64 beyond float32's range
    env_spec = meta.get("env_spec")
    spec = read_record(env_spec.encode("utf-8", "surrogatepass"), f"dataset {meta_file}: field env_spec",
                       error=DatasetError) if isinstance(env_spec, str) else None
    env_id = spec.get("id") if isinstance(spec, dict) else None
    info = {"source": "minari", "dataset_id": meta.get("dataset_id"), "minari_version": meta.get("minari_version"),
            "env_id": env_id if isinstance(env_id, str) else None}
    return trans, info


def write_minari(out: Path | str, episodes: list[dict[str, np.ndarray]], env_id: str, algorithm_name: str) -> Path:
    """Write episodes ({observations [T+1], actions, rewards, terminations, truncations [T]}) as a Minari
    dataset. `out` is ``minari:DATASET_ID`` (created under $MINARI_DATASETS_PATH) or a directory."""
    try:
        import minari
        from minari.data_collector.episode_buffer import EpisodeBuffer
    except ImportError:
        raise DatasetError("dataset collect --format minari needs Minari: pip install -e \".[minari]\" "
                           "(or write --format hdf5)") from None
    import warnings

    out_s = str(out)
    in_root = out_s.startswith("minari:")
    dataset_id = out_s[len("minari:"):] if in_root else f"agilerl/{_slug(Path(out_s).name)}-v0"
    buffers = [EpisodeBuffer(id=i, observations=e["observations"], actions=e["actions"], rewards=e["rewards"],
                             terminations=e["terminations"], truncations=e["truncations"], infos={})
               for i, e in enumerate(episodes)]
    with tempfile.TemporaryDirectory(prefix="agilerl-minari-") as tmp:
        old = os.environ.get("MINARI_DATASETS_PATH")
        root = datasets_root() if in_root else Path(tmp)
        os.environ["MINARI_DATASETS_PATH"] = str(root)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # eval_env / author / description notices
                minari.create_dataset_from_buffers(dataset_id, buffers, env=env_id, algorithm_name=algorithm_name)
        except ValueError as err:
            raise DatasetError(f"--out {out_s}: Minari refused the dataset ({err})") from None
        finally:
            if old is None:
                os.environ.pop("MINARI_DATASETS_PATH", None)
            else:
                os.environ["MINARI_DATASETS_PATH"] = old
        if in_root:
            return root / dataset_id
        dest = Path(out_s)
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(Path(tmp) / dataset_id), dest)
        return dest


def _slug(name: str) -> str:
    s = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.lower()).strip("-")
    return s.removesuffix("-v0") or "dataset"
