"""Flat HDF5 datasets (the D4RL layout): one array per field, one row per transition.

Required keys: ``observations`` [N, ...], ``actions`` [N] or [N, ...], ``rewards`` [N], ``terminals`` [N].
Optional: ``timeouts`` [N] (an episode cut by a time limit) and ``next_observations`` [N, ...].

Without ``next_observations`` the next observation of row i is row i+1 of the same episode: a terminal
row needs none (it does not bootstrap), and rows whose successor is unknown (a timeout, the last row)
are dropped, as D4RL's loaders do. File attributes ``env_id`` and ``source`` are informational.

A dataset file reads only its own bytes (see docs/security.md): :func:`own_bytes` walks every link of the file
without following one and refuses external links, soft links, link loops, virtual datasets, external raw storage
and filters HDF5 would load as plugins; :func:`read_array` checks an array's declared size against the limit
table and against the bytes the file stores for it, before anything is read or allocated.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from agilerl_core import limits
from agilerl_core.data.transitions import Transitions, check_finite
from agilerl_core.errors import DatasetError

REQUIRED = ("observations", "actions", "rewards", "terminals")
# filters HDF5 builds in (deflate, shuffle, fletcher32, szip, nbit, scaleoffset) and h5py's own LZF; any other
# filter id makes HDF5 load a plugin library from HDF5_PLUGIN_PATH when the array is read
KNOWN_FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset", 32000: "lzf"}
# an array this small is read even when the file stores less of it (fill values): no allocation worth refusing
SMALL_ARRAY_BYTES = 64 * 2**10
# keys whose rows are observations or actions: one row's elements are checked against limits.space_elements
ROW_SPACES = ("observations", "next_observations", "actions")


def own_bytes(f, path: Path | str) -> None:
    """Refuse (DatasetError naming the file and key) anything in the open HDF5 file `f` that reads bytes from
    elsewhere or can loop: external links, soft links, user-defined links, a group linked twice (a link loop),
    virtual datasets, external raw storage, unknown filters. Walks link names only: nothing is followed or read."""
    import h5py

    fix = "the file must hold its own data, so write a self-contained copy (h5py: one plain dataset per key)"
    seen = {h5py.h5o.get_info(f.id).addr}
    stack = [("", f)]
    while stack:
        prefix, group = stack.pop()
        for name in group:  # link names (H5Literate): no link is followed
            key = f"{prefix}{name}"
            where = f"dataset {path}: key {key!r}"
            try:
                link = group.get(name, getlink=True)
            except (OSError, KeyError, ValueError, TypeError) as err:
                raise DatasetError(f"{where}: its link cannot be read ({err}); the file is corrupt, so download or "
                                   f"record it again") from None
            if isinstance(link, h5py.ExternalLink):
                raise DatasetError(f"{where} is an external link to {link.filename!r}:{link.path!r}, which would "
                                   f"read another file; {fix}")
            if isinstance(link, h5py.SoftLink):
                raise DatasetError(f"{where} is a soft link to {link.path!r} (a soft link can loop or alias another "
                                   f"key); {fix}")
            if not isinstance(link, h5py.HardLink):
                raise DatasetError(f"{where} is a {type(link).__name__} link; {fix}")
            try:
                obj = group.get(name)
                addr = h5py.h5o.get_info(obj.id).addr
            except (OSError, KeyError, ValueError, TypeError) as err:
                raise DatasetError(f"{where} cannot be opened ({err}); the file is truncated or corrupt, so "
                                   f"download or record it again") from None
            if isinstance(obj, h5py.Group):
                if addr in seen:
                    raise DatasetError(f"{where} links a group already linked elsewhere in the file (a link loop "
                                       f"or alias); {fix}")
                seen.add(addr)
                stack.append((f"{key}/", obj))
            elif isinstance(obj, h5py.Dataset):
                _own_storage(obj, where, fix)


def _own_storage(dset, where: str, fix: str) -> None:
    """Refuse a dataset whose bytes live outside the file or need a plugin to decode."""
    dcpl = dset.id.get_create_plist()
    if dset.is_virtual:
        raise DatasetError(f"{where} is a virtual dataset (it maps other datasets, possibly in other files); {fix}")
    if dcpl.get_external_count():
        raise DatasetError(f"{where} keeps its raw data in external file(s) {[e[0] for e in dset.external or []]} "
                           f"instead of the dataset file; {fix}")
    for i in range(dcpl.get_nfilters()):
        code = dcpl.get_filter(i)[0]
        if code not in KNOWN_FILTERS:
            raise DatasetError(f"{where} is encoded with HDF5 filter {code}, which HDF5 would load as a plugin "
                               f"library; accepted filters: {sorted(KNOWN_FILTERS.values())}, so re-write the key "
                               f"with gzip (deflate) or no compression")


def read_array(dset, key: str, path: Path | str, file_size: int | None = None) -> np.ndarray:
    """The whole of `dset` (key `key` of file `path`, already passed through :func:`own_bytes`) after checking
    that it is a plain numeric array whose declared size fits limits.dataset_bytes, limits.space_elements (one
    row of observations or actions) and limits.dataset_expansion times the bytes the file stores for it."""
    where = f"dataset {path}: key {key!r}"
    lim = limits.current()
    dtype = dset.dtype
    if dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None:
        raise DatasetError(f"{where} has dtype {dtype}; dataset arrays are plain numbers (bool, int, uint, float)")
    shape = tuple(int(d) for d in (dset.shape or ()))
    nbytes = math.prod(shape) * dtype.itemsize
    limits.check("dataset_bytes", nbytes, f"{where}: declared bytes (shape {shape} of {dtype})",
                 DatasetError, lim)
    if key.rsplit("/", 1)[-1] in ROW_SPACES and len(shape) > 1:
        limits.check("space_elements", math.prod(shape[1:]), f"{where}: elements of one row (shape {shape[1:]})",
                     DatasetError, lim)
    try:
        stored = int(dset.id.get_storage_size())
    except (OSError, ValueError) as err:
        raise DatasetError(f"{where}: its storage cannot be read ({err}); the file is corrupt, so download or record "
                           f"it again") from None
    if file_size is not None and stored > file_size:
        raise DatasetError(f"{where} claims {stored:,} stored bytes but the file has {file_size:,}; the file is "
                           f"truncated or corrupt, so download or record it again")
    if nbytes > max(stored * lim.dataset_expansion, SMALL_ARRAY_BYTES):
        raise DatasetError(f"{where}: shape {shape} of {dtype} declares {nbytes:,} bytes but the file stores "
                           f"{stored:,} bytes of it, more than limits.dataset_expansion = {lim.dataset_expansion:,} "
                           f"times larger (compression or never-written fill values); if the file is genuine, raise "
                           f"limits.dataset_expansion in your own config, otherwise download or record it again")
    try:
        return dset[()]
    except (OSError, ValueError, TypeError) as err:
        raise DatasetError(f"{where} cannot be read ({err}); the file is truncated or corrupt, so download or "
                           f"record it again") from None
    except MemoryError:
        raise DatasetError(f"{where}: {nbytes:,} bytes do not fit in memory; lower limits.dataset_bytes or use a "
                           f"machine with more memory") from None


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
        dset = f[key]
    except (OSError, KeyError, ValueError) as err:
        raise DatasetError(f"dataset {path}: key {key!r} cannot be read ({err}); the file is truncated or "
                           f"corrupt, so download or record it again") from None
    return read_array(dset, key, path, _file_size(path))


def _file_size(path: Path) -> int | None:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _attr(value):
    """A file attribute as plain Python data (informational: never code, never a path that is opened)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        return value.item() if value.size == 1 and value.dtype.kind != "O" else value.tolist()
    return value.item() if isinstance(value, np.generic) else value


def read_attrs(obj, path: Path | str) -> dict:
    """The attributes of `obj` (a file or group) as plain data; a DatasetError names one that cannot be read."""
    out = {}
    for name in obj.attrs:
        try:
            shape = obj.attrs.get_id(name).shape
            limits.check("json_bytes", math.prod(shape or ()) * obj.attrs.get_id(name).dtype.itemsize,
                         f"dataset {path}: attribute {name!r}: declared bytes", DatasetError)
            out[name] = _attr(obj.attrs[name])
        except DatasetError:
            raise
        except Exception as err:  # h5py raises OSError, TypeError or ValueError for unreadable attribute types
            raise DatasetError(f"dataset {path}: attribute {name!r} cannot be read ({type(err).__name__}: {err}); "
                               f"remove it or write it as a number or string") from None
    return out


def read_hdf5(path: str | Path) -> tuple[Transitions, dict]:
    """(transitions, file attributes) of a flat HDF5 dataset; a DatasetError names any bad key."""
    import h5py

    path = Path(path)
    with _open(path) as f:
        own_bytes(f, path)  # before any key is looked up: `in` and f[key] would follow links
        missing = [k for k in REQUIRED if k not in f or not isinstance(f[k], h5py.Dataset)]
        if missing:
            raise DatasetError(f"dataset {path}: missing key(s) {missing}; a flat HDF5 dataset needs "
                               f"{list(REQUIRED)} (optional: timeouts, next_observations); found {sorted(f.keys())}")
        keys = [*REQUIRED, *(k for k in ("timeouts", "next_observations") if k in f)]
        data = {k: _read(f, k, path) for k in keys}
        attrs = read_attrs(f, path)
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
    for key in ("observations", "next_observations", "actions", "rewards"):
        if key in data:
            check_finite(data[key], key, f"dataset {where}")
    with np.errstate(over="ignore"):  # refused just below, with the key and row
        rewards = data["rewards"].astype(np.float32, copy=False)
    check_finite(rewards, "rewards", f"dataset {where}")  # finite float64 beyond float32's range
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
